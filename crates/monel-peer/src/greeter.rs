//! Listeners that serve every connection on its own: each accepted connection's first
//! message is read on a thread of its own, under a deadline, so a silent, slow or garbled
//! connection holds up nobody else. Connections whose first message fails are dropped,
//! logged with their reason and counted. The connection manager (`monel_verbs::cm::Listener::serve`)
//! and `monel-ccl`'s bootstrap (rendezvous and mesh) both serve their listeners this way.

use std::fmt::Display;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// Connections whose first message is still being read, at most; more are closed at once.
pub const MAX_PENDING: usize = 64;

/// Reads a connection's first message.
type Read<T, E> = Arc<dyn Fn(&mut TcpStream) -> Result<T, E> + Send + Sync>;

/// What one connection's first message gave: the connection, its peer, and the message.
type Greeting<T, E> = (TcpStream, SocketAddr, Result<T, E>);

/// Accepts on a listener and reads first messages concurrently.
pub struct Greeter<T, E> {
    listener: TcpListener,
    read: Read<T, E>,
    deadline: Duration,
    pending: Arc<AtomicUsize>,
    tx: Sender<Greeting<T, E>>,
    rx: Receiver<Greeting<T, E>>,
    /// Rung by a reader once its greeting is in `rx`, so `next` sleeps until then.
    bell: Arc<EventFd>,
    dropped: usize,
    /// Where the log lines say they come from.
    what: &'static str,
}

impl<T: Send + 'static, E: Display + Send + 'static> Greeter<T, E> {
    /// Serves `listener` (made non-blocking), reading each connection's first message with
    /// `read`, which must be done within `deadline` (the connection's read timeout).
    pub fn new(
        listener: TcpListener,
        read: impl Fn(&mut TcpStream) -> Result<T, E> + Send + Sync + 'static,
        deadline: Duration,
        what: &'static str,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let (tx, rx) = mpsc::channel();
        let bell = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Self {
            listener,
            read: Arc::new(read),
            deadline,
            pending: Arc::new(AtomicUsize::new(0)),
            tx,
            rx,
            bell: Arc::new(bell),
            dropped: 0,
            what,
        })
    }

    /// The next connection whose first message was read, waiting for at most `wait`
    /// (asleep on the listener and on the readers' bell between looks). Connections whose
    /// first message failed are dropped here, with a log line.
    pub fn next(&mut self, wait: Duration) -> io::Result<Option<(TcpStream, SocketAddr, T)>> {
        let end = Instant::now() + wait;
        loop {
            loop {
                match self.listener.accept() {
                    Ok((s, peer)) => self.start(s, peer),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // Interrupted, or a connection that failed between SYN and accept.
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted
                                | io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::ConnectionReset
                        ) => {}
                    Err(e) => return Err(e),
                }
            }
            // Drain the bell before looking, so a ring after the look wakes the next sleep.
            let _ = self.bell.read();
            loop {
                match self.rx.try_recv() {
                    Ok((s, peer, Ok(t))) => return Ok(Some((s, peer, t))),
                    Ok((_, peer, Err(e))) => self.drop_one(peer, &e),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            let now = Instant::now();
            if now >= end {
                return Ok(None);
            }
            let ms = u16::try_from((end - now).as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [
                PollFd::new(self.listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.bell.as_fd(), PollFlags::POLLIN),
            ];
            let _ = poll(&mut fds, PollTimeout::from(ms));
        }
    }

    /// Logs and counts a connection dropped for `why`.
    pub fn drop_one(&mut self, peer: SocketAddr, why: &dyn Display) {
        self.dropped += 1;
        tracing::warn!(
            target: "monel::net",
            "{}: dropped a connection from {peer} ({} so far): {why}",
            self.what,
            self.dropped
        );
    }

    /// Connections dropped so far.
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    fn start(&mut self, s: TcpStream, peer: SocketAddr) {
        if self.pending.load(Ordering::Acquire) >= MAX_PENDING {
            self.drop_one(peer, &"too many connections still being read");
            return;
        }
        let prepared = s
            .set_nonblocking(false)
            .and_then(|()| s.set_read_timeout(Some(self.deadline)));
        if let Err(e) = prepared {
            self.drop_one(peer, &e);
            return;
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        let (tx, pending, read) = (self.tx.clone(), self.pending.clone(), self.read.clone());
        let bell = self.bell.clone();
        let spawned = std::thread::Builder::new()
            .name("monel-greet".into())
            .spawn(move || {
                let mut s = s;
                let r = read(&mut s);
                pending.fetch_sub(1, Ordering::AcqRel);
                let _ = tx.send((s, peer, r));
                let _ = bell.write(1);
            });
        if let Err(e) = spawned {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.drop_one(peer, &format!("no thread to read it: {e}"));
        }
    }
}
