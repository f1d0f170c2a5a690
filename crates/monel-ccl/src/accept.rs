//! Listeners that serve every connection on its own: each accepted connection's first
//! message is read on a thread of its own, under a short deadline, so a silent, slow or
//! garbled connection holds up nobody else. Misbehaving connections are dropped, logged with
//! their reason and counted.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Duration;

/// Connections whose first message is still being read, at most; more are closed at once.
pub(crate) const MAX_PENDING: usize = 64;

/// What one connection's first message gave: the connection, its peer, and the message.
pub(crate) type Greeting<T> = (TcpStream, SocketAddr, io::Result<T>);

/// Accepts on a non-blocking listener and reads first messages concurrently.
pub(crate) struct Greeter<T> {
    listener: TcpListener,
    read: fn(&mut TcpStream) -> io::Result<T>,
    deadline: Duration,
    pending: Arc<AtomicUsize>,
    tx: mpsc::Sender<Greeting<T>>,
    rx: Receiver<Greeting<T>>,
    /// Connections dropped: too many pending, or a first message that failed.
    pub(crate) dropped: usize,
    /// Where the log lines say they come from.
    what: &'static str,
}

impl<T: Send + 'static> Greeter<T> {
    /// Serves `listener` (made non-blocking), reading each connection's first message with
    /// `read` within `deadline`.
    pub(crate) fn new(
        listener: TcpListener,
        read: fn(&mut TcpStream) -> io::Result<T>,
        deadline: Duration,
        what: &'static str,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let (tx, rx) = mpsc::channel();
        Ok(Self {
            listener,
            read,
            deadline,
            pending: Arc::new(AtomicUsize::new(0)),
            tx,
            rx,
            dropped: 0,
            what,
        })
    }

    /// Accepts what is waiting and returns the next first message read, if any, without
    /// blocking. Connections whose first message failed are dropped here, with a log line.
    pub(crate) fn poll(&mut self) -> io::Result<Option<(TcpStream, SocketAddr, T)>> {
        loop {
            match self.listener.accept() {
                Ok((s, peer)) => self.start(s, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A connection that failed between SYN and accept (reset, aborted): next.
                Err(e) if is_per_connection(&e) => {}
                Err(e) => return Err(e),
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok((s, peer, Ok(t))) => return Ok(Some((s, peer, t))),
                Ok((_, peer, Err(e))) => self.drop_one(peer, &e.to_string()),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Logs and counts a connection dropped for `why`.
    pub(crate) fn drop_one(&mut self, peer: SocketAddr, why: &str) {
        self.dropped += 1;
        tracing::warn!(
            target: "monel::init",
            "{}: dropped a connection from {peer} ({} so far): {why}",
            self.what,
            self.dropped
        );
    }

    fn start(&mut self, s: TcpStream, peer: SocketAddr) {
        if self.pending.load(Ordering::Acquire) >= MAX_PENDING {
            self.drop_one(peer, "too many connections still being read");
            return;
        }
        let prepared = s
            .set_nonblocking(false)
            .and_then(|()| s.set_read_timeout(Some(self.deadline)));
        if let Err(e) = prepared {
            self.drop_one(peer, &e.to_string());
            return;
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        let (tx, pending, read) = (self.tx.clone(), self.pending.clone(), self.read);
        let spawned = std::thread::Builder::new()
            .name("monel-greet".into())
            .spawn(move || {
                let mut s = s;
                let r = read(&mut s);
                pending.fetch_sub(1, Ordering::AcqRel);
                let _ = tx.send((s, peer, r));
            });
        if let Err(e) = spawned {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.drop_one(peer, &format!("no thread to read it: {e}"));
        }
    }
}

/// Accept errors that concern one connection, not the listener.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}
