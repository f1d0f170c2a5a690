//! The TCP link: where RDMA does not work, a peer is one TCP connection whose two sides
//! proved the job secret ([`crate::stream`]). A WRITE goes as a put carrying its bytes, a
//! READ as a get answered with them; the target resolves each against its own published
//! registrations (key, address, length) as an RNIC would, and answers with a status.
//! Each connection has a reader thread (it applies messages, serves puts and gets, ends
//! slices) and a writer thread (it drains a queue, so nothing blocks on the socket while
//! holding the agent's state); a small frame goes out from the thread that sends it while the
//! writer is idle, as far as the socket takes it at once (a thread hand-off less per message,
//! which is most of a small batch's round trip). A slice's bytes go from the initiator's
//! segment straight to the socket and from the socket straight into the target's segment (the
//! kernel's two copies, as with any TCP transfer), outside the agent's lock; a registration in
//! use so is held ([`Hold`]) until its bytes have moved, and a deregistration waits for that.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use monel_peer::auth::nonce;
use monel_verbs::MemoryRegion;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::{Link, Local, MSG_MAX, Shared, apply, end_slice, io, next_peer, pump, push_peer};
use crate::batch::{Op, Slice};
use crate::error::{Result, XferError};
use crate::stream::{self, ACCESS_ERROR, Frame, HEADER, Head, OK};
use crate::wire::Msg;

/// Bytes a TCP slice carries at least (when its descriptors hold that many): fewer heads,
/// acks and reader wake-ups per byte than the plan's 1 MiB for RDMA work requests
/// (4 MiB blocks between two namespaces: 2.7 to 3.1-3.2 GB/s; 1 MiB and 64 KiB blocks on
/// loopback, contiguous, in batches: 13-27% more).
pub(super) const SLICE: u64 = 4 << 20;
/// Slices in flight on one TCP connection.
pub(super) const DEPTH: u32 = 16;
/// Connections an agent opens to a TCP peer: the first carries the agents' messages, and
/// each carries slices, so that several threads on each side copy bytes at once.
pub(super) const LANES: usize = 2;
/// Bytes queued for one peer's connection at most (its writes, and its answers to the
/// peer's reads); a peer that does not take them is cut off.
const MAX_PENDING: usize = 256 << 20;
/// Small frames a writer gathers before it writes them out.
const BUF: usize = 256 << 10;
/// Frames up to this size go out from the thread that sends them when the writer is idle
/// (one thread hand-off less per message; larger ones are the writer's, so that no thread
/// copies much while it holds the agent's state).
const INLINE_MAX: usize = 128 << 10;
/// A reader's buffer for frame headers and small frames; a slice's bytes beyond what it
/// already holds go from the socket straight into the segment.
const READ_BUF: usize = 16 << 10;

/// A peer's TCP connections (lanes), as the agent's state holds them; lane 0 carries the
/// agents' messages. `token` names the peer when the client adds a lane.
pub(super) struct Lanes {
    pub(super) lanes: Vec<TcpLink>,
    pub(super) token: [u8; 16],
    /// On one host: slices go as copies between the processes' memory instead
    /// ([`super::cma`]), and lane 0 carries the messages alone.
    pub(super) cma: Option<super::cma::Cma>,
}

impl Lanes {
    /// Queues a message frame on lane 0.
    pub(super) fn send(&self, f: Frame) -> Result<()> {
        self.lanes[0].send(f)
    }

    /// Whether everything queued on every lane went out.
    pub(super) fn flushed(&self) -> bool {
        self.lanes.iter().all(TcpLink::flushed)
    }

    /// Ends every connection.
    pub(super) fn close(&self) {
        for l in &self.lanes {
            l.close();
        }
    }

    /// Whether a connection's threads use `mr` outside the agent's lock now.
    pub(super) fn holding(&self, mr: &Arc<MemoryRegion>) -> bool {
        self.lanes.iter().any(|l| l.holds.has(mr))
    }
}

/// The registrations one connection's threads use outside the agent's lock (bytes sent from
/// them, or received into them), by address: a deregistration that waits too long for them
/// knows which peer to cut off.
#[derive(Default)]
pub(super) struct Holds(Mutex<Vec<usize>>);

impl Holds {
    fn has(&self, mr: &Arc<MemoryRegion>) -> bool {
        let key = Arc::as_ptr(mr) as usize;
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&key)
    }
}

/// A registration one connection uses outside the agent's lock: kept alive, and counted in
/// the connection's [`Holds`], until dropped.
pub(super) struct Hold {
    mr: Arc<MemoryRegion>,
    holds: Arc<Holds>,
}

impl Hold {
    fn new(mr: &Arc<MemoryRegion>, holds: &Arc<Holds>) -> Self {
        holds
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::as_ptr(mr) as usize);
        Self {
            mr: mr.clone(),
            holds: holds.clone(),
        }
    }

    /// The address of byte `off` of the registration.
    fn at(&self, off: usize) -> u64 {
        self.mr.addr() + off as u64
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let key = Arc::as_ptr(&self.mr) as usize;
        let mut h = self.holds.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(k) = h.iter().position(|&x| x == key) {
            h.swap_remove(k);
        }
    }
}

/// What a connection's writer sends: a frame, or the head of a put or a data frame followed
/// by `len` bytes at `off` of a registration, sent from where they lie.
pub(super) enum Out {
    Frame(Frame),
    /// The rest of a frame the sending thread began.
    Raw(Vec<u8>),
    From {
        head: Vec<u8>,
        hold: Hold,
        off: usize,
        len: usize,
    },
}

impl Out {
    fn wire_len(&self) -> usize {
        match self {
            Self::Frame(f) => f.wire_len(),
            Self::Raw(b) => b.len(),
            Self::From { head, len, .. } => head.len() + len,
        }
    }
}

impl From<Frame> for Out {
    fn from(f: Frame) -> Self {
        Self::Frame(f)
    }
}

/// One TCP connection of a peer.
pub(super) struct TcpLink {
    out: Sender<Out>,
    /// Bytes handed to the writer and not yet written.
    pending: Arc<AtomicUsize>,
    /// The writer holds written bytes it has not flushed to the connection yet.
    dirty: Arc<AtomicBool>,
    /// Reads in flight: tag -> where their bytes land (local key, address, length).
    reads: HashMap<u64, (u32, u64, u32)>,
    /// Slices posted on it and not yet answered.
    pub(super) in_flight: u32,
    /// What its threads use outside the agent's lock.
    holds: Arc<Holds>,
    stream: TcpStream,
}

impl TcpLink {
    /// Sends `f`: at once from this thread when it is small and the writer idle, as much as
    /// the socket takes without blocking; what is left goes to the writer's queue. (Every
    /// sender holds the agent's state, so no other thread sends here meanwhile.)
    pub(super) fn send(&self, f: impl Into<Out>) -> Result<()> {
        let mut f = f.into();
        // Nothing queued and nothing gathered: the writer sits idle, and order is kept.
        if f.wire_len() <= INLINE_MAX
            && self.pending.load(Ordering::Acquire) == 0
            && !self.dirty.load(Ordering::Acquire)
        {
            match send_now(self.stream.as_raw_fd(), f) {
                Some(rest) => f = rest,
                None => return Ok(()),
            }
        }
        let n = f.wire_len();
        if self.pending.fetch_add(n, Ordering::AcqRel) + n > MAX_PENDING {
            self.pending.fetch_sub(n, Ordering::AcqRel);
            return Err(XferError::TooLarge(format!(
                "over {MAX_PENDING} bytes queued for a peer that does not take them"
            )));
        }
        self.out
            .send(f)
            .map_err(|_| XferError::PeerLost("its connection's writer ended".into()))
    }

    /// Sends one slice: a WRITE's bytes as a put, a READ as a get.
    pub(super) fn post_slice(&mut self, tag: u64, sl: &Slice, local: &Local) -> Result<()> {
        match sl.op {
            Op::Write => {
                let len = sl.len as usize;
                let (mr, off) = region(local, sl.local_key, false, sl.local_addr, len)
                    .ok_or_else(|| XferError::Transport("the local segment is gone".into()))?;
                self.send(Out::From {
                    head: Frame::put_head(tag, sl.remote_key, sl.remote_addr, len),
                    hold: Hold::new(mr, &self.holds),
                    off,
                    len,
                })
            }
            Op::Read => {
                self.reads
                    .insert(tag, (sl.local_key, sl.local_addr, sl.len));
                self.send(Frame::Get {
                    tag,
                    key: sl.remote_key,
                    addr: sl.remote_addr,
                    len: sl.len,
                })
                .inspect_err(|_| {
                    self.reads.remove(&tag);
                })
            }
        }
    }

    /// Whether everything queued went out to the connection.
    pub(super) fn flushed(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0 && !self.dirty.load(Ordering::Acquire)
    }

    /// Ends the connection (its threads end with it).
    pub(super) fn close(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The registration of `local` that `key` names (a local key, or with `remote` the remote
/// key it published), and where `[addr, addr + len)` starts in it, if it lies inside.
pub(super) fn region(
    local: &Local,
    key: u32,
    remote: bool,
    addr: u64,
    len: usize,
) -> Option<(&Arc<MemoryRegion>, usize)> {
    let mr = local.mrs.values().find(|m| {
        if remote {
            m.rkey().0 == key
        } else {
            m.lkey().0 == key
        }
    })?;
    let off = usize::try_from(addr.checked_sub(mr.addr())?).ok()?;
    (off.checked_add(len)? <= mr.len()).then_some((mr, off))
}

/// The client's side of a new TCP connection on `c`: says which link it opens (`opening`:
/// TCP's or shared memory's), proves the job secret, checks the server's proof, then names
/// the peer (`token`) and the lane.
pub(super) fn open(
    mut c: TcpStream,
    opening: &[u8; 8],
    secret: Option<&[u8]>,
    timeout: Duration,
    token: &[u8; 16],
    lane: u8,
) -> Result<TcpStream> {
    c.set_read_timeout(Some(timeout)).map_err(io)?;
    c.write_all(opening).map_err(io)?;
    let mut hello = [0u8; 17];
    c.read_exact(&mut hello).map_err(io)?;
    if hello[0] == 1 && secret.is_none() {
        return Err(XferError::Transport(
            "the peer requires the job secret and none is configured here".into(),
        ));
    }
    let ns = &hello[1..];
    let nc = nonce();
    let mut req = nc.to_vec();
    req.extend_from_slice(&stream::proof(secret, "client", ns, &nc));
    c.write_all(&req).map_err(io)?;
    let mut rep = [0u8; 33];
    c.read_exact(&mut rep).map_err(io)?;
    if rep[0] != OK {
        return Err(XferError::Transport(
            "the peer refused us: authentication failed".into(),
        ));
    }
    if !stream::verify(secret, "server", ns, &nc, &rep[1..]) {
        return Err(XferError::Transport(
            "the peer did not prove the job secret".into(),
        ));
    }
    let mut join = token.to_vec();
    join.push(lane);
    c.write_all(&join).map_err(io)?;
    c.set_read_timeout(None).map_err(io)?;
    Ok(c)
}

/// The server's side of a new TCP connection on `c` (its opening already read): checks the
/// client's proof of the job secret and gives its own; returns the connection with the
/// peer's token and the lane it is.
pub(super) fn accept(
    mut c: TcpStream,
    secret: Option<&[u8]>,
    timeout: Duration,
) -> Result<(TcpStream, [u8; 16], u8)> {
    c.set_read_timeout(Some(timeout)).map_err(io)?;
    c.set_nodelay(true).map_err(io)?;
    let ns = nonce();
    let mut hello = vec![u8::from(secret.is_some())];
    hello.extend_from_slice(&ns);
    c.write_all(&hello).map_err(io)?;
    let mut req = [0u8; 48];
    c.read_exact(&mut req).map_err(io)?;
    let nc = &req[..16];
    if !stream::verify(secret, "client", &ns, nc, &req[16..]) {
        let _ = c.write_all(&[ACCESS_ERROR; 33]);
        return Err(XferError::Transport(
            "a client without the job secret".into(),
        ));
    }
    let mut rep = vec![OK];
    rep.extend_from_slice(&stream::proof(secret, "server", &ns, nc));
    c.write_all(&rep).map_err(io)?;
    let mut join = [0u8; 17];
    c.read_exact(&mut join).map_err(io)?;
    c.set_read_timeout(None).map_err(io)?;
    let token: [u8; 16] = join[..16].try_into().expect("16");
    Ok((c, token, join[16]))
}

/// A fresh token naming a peer's connections.
pub(super) fn token() -> [u8; 16] {
    nonce()
}

/// Starts a connection's threads (for lane `lane` of peer `i`) and returns its half that
/// the agent's state holds.
fn start(s: &Arc<Shared>, i: usize, lane: usize, c: TcpStream) -> Result<TcpLink> {
    let reader = c.try_clone().map_err(io)?;
    let writer = c.try_clone().map_err(io)?;
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let dirty = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(Holds::default());
    let (w1, w2) = (Arc::downgrade(s), Arc::downgrade(s));
    let (p2, d2, h2) = (pending.clone(), dirty.clone(), holds.clone());
    std::thread::Builder::new()
        .name(format!("xfer-tcp-w-{i}.{lane}"))
        .spawn(move || write_loop(&w1, i, &writer, &rx, &p2, &d2))
        .map_err(io)?;
    std::thread::Builder::new()
        .name(format!("xfer-tcp-r-{i}.{lane}"))
        .spawn(move || read_loop(&w2, i, lane, reader, &h2))
        .map_err(io)?;
    Ok(TcpLink {
        out: tx,
        pending,
        dirty,
        reads: HashMap::new(),
        in_flight: 0,
        holds,
        stream: c,
    })
}

/// Takes an authenticated connection in as a new peer's lane 0 (of a shared-memory link
/// with `found`): starts its threads, introduces this agent and publishes its segments.
pub(super) fn add_peer(
    s: &Arc<Shared>,
    c: TcpStream,
    token: [u8; 16],
    found: Option<super::cma::Found>,
) -> Result<usize> {
    let mut st = s.state();
    let i = next_peer(&st)?;
    if st
        .peers
        .iter()
        .any(|p| matches!(&p.link, Link::Tcp(l) if l.token == token))
    {
        return Err(XferError::BadMessage("a peer's token used again".into()));
    }
    let lane = start(s, i, 0, c)?;
    let cma = found.map(|f| super::cma::start(s, i, f)).transpose()?;
    let link = Lanes {
        lanes: vec![lane],
        token,
        cma,
    };
    push_peer(s, &mut st, Link::Tcp(link))
}

/// Adds an authenticated connection as lane `lane` of the live peer whose lane 0 came with
/// `token`.
pub(super) fn add_lane(s: &Arc<Shared>, c: TcpStream, token: [u8; 16], lane: u8) -> Result<usize> {
    let i = s
        .state()
        .peers
        .iter()
        .position(|p| p.lost.is_none() && matches!(&p.link, Link::Tcp(l) if l.token == token))
        .ok_or_else(|| XferError::BadMessage("a lane for no peer".into()))?;
    attach(s, i, c, lane)
}

/// Adds connection `c` as lane `lane` of peer `i` (the next lane it lacks).
pub(super) fn attach(s: &Arc<Shared>, i: usize, c: TcpStream, lane: u8) -> Result<usize> {
    let mut st = s.state();
    let Link::Tcp(l) = &st.peers[i].link else {
        return Err(XferError::BadMessage("a TCP lane for an RDMA peer".into()));
    };
    if l.cma.is_some() {
        return Err(XferError::BadMessage(
            "a TCP lane for a shared-memory peer".into(),
        ));
    }
    if usize::from(lane) != l.lanes.len() || l.lanes.len() >= LANES {
        return Err(XferError::BadMessage(format!(
            "lane {lane} of a peer with {} (at most {LANES})",
            l.lanes.len()
        )));
    }
    let link = start(s, i, usize::from(lane), c)?;
    if let Link::Tcp(l) = &mut st.peers[i].link {
        l.lanes.push(link);
    }
    drop(st);
    s.changed.notify_all();
    Ok(i)
}

/// Marks peer `i` lost with `err` (its batches' slices fail) and wakes waiters.
fn cut_off(s: &Weak<Shared>, i: usize, err: XferError) {
    if let Some(s) = s.upgrade() {
        let mut st = s.state();
        if let Some(p) = st.peers.get_mut(i) {
            p.lost.get_or_insert(err);
            if let Link::Tcp(t) = &p.link {
                t.close();
            }
        }
        pump(&mut st);
        drop(st);
        s.changed.notify_all();
    }
}

fn write_loop(
    s: &Weak<Shared>,
    i: usize,
    c: &TcpStream,
    rx: &Receiver<Out>,
    pending: &AtomicUsize,
    dirty: &AtomicBool,
) {
    let fd = c.as_raw_fd();
    // Small frames gather here; a slice's bytes go out behind them in the same call.
    let mut buf = Vec::with_capacity(BUF);
    loop {
        let o = match rx.try_recv() {
            Ok(o) => o,
            Err(TryRecvError::Empty) => {
                // Nothing more queued: what was gathered goes out now.
                let sent = send_all(fd, &buf, None);
                buf.clear();
                if let Err(e) = sent {
                    return cut_off(s, i, XferError::PeerLost(format!("its connection: {e}")));
                }
                dirty.store(false, Ordering::Release);
                if let Some(s) = s.upgrade() {
                    s.changed.notify_all();
                }
                match rx.recv() {
                    Ok(o) => o,
                    Err(_) => return,
                }
            }
            Err(TryRecvError::Disconnected) => return,
        };
        let n = o.wire_len();
        let sent = match o {
            Out::Frame(f) => {
                f.write_to(&mut buf).expect("a Vec takes every byte");
                send_full(fd, &mut buf)
            }
            Out::Raw(b) => {
                buf.extend_from_slice(&b);
                send_full(fd, &mut buf)
            }
            Out::From {
                head,
                hold,
                off,
                len,
            } => {
                buf.extend_from_slice(&head);
                let sent = send_all(fd, &buf, Some((hold.at(off), len)));
                buf.clear();
                sent
            }
        };
        dirty.store(true, Ordering::Release);
        pending.fetch_sub(n, Ordering::AcqRel);
        if let Err(e) = sent {
            return cut_off(s, i, XferError::PeerLost(format!("its connection: {e}")));
        }
    }
}

/// Writes the frames gathered in `buf` once they fill it.
fn send_full(fd: RawFd, buf: &mut Vec<u8>) -> std::io::Result<()> {
    if buf.len() < BUF {
        return Ok(());
    }
    let sent = send_all(fd, buf, None);
    buf.clear();
    sent
}

/// Writes what the socket `fd` takes of `o` without blocking; `None` when all of it went,
/// else what is left (all of it after an error, which the writer then meets).
fn send_now(fd: RawFd, o: Out) -> Option<Out> {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    match o {
        Out::Frame(f) => {
            let mut b = Vec::with_capacity(f.wire_len());
            f.write_to(&mut b).expect("a Vec takes every byte");
            send_now(fd, Out::Raw(b))
        }
        Out::Raw(b) => {
            let n = send_once(fd, &b, None, 0, flags).unwrap_or(0);
            (n < b.len()).then(|| Out::Raw(b[n..].to_vec()))
        }
        Out::From {
            head,
            hold,
            off,
            len,
        } => {
            let n = send_once(fd, &head, Some((hold.at(off), len)), 0, flags).unwrap_or(0);
            if n == head.len() + len {
                return None;
            }
            let k = n.saturating_sub(head.len());
            Some(Out::From {
                head: head[n.min(head.len())..].to_vec(),
                hold,
                off: off + k,
                len: len - k,
            })
        }
    }
}

/// Writes `a`, then the `len` bytes at address `from` when given, to the connection `fd`.
fn send_all(fd: RawFd, a: &[u8], from: Option<(u64, usize)>) -> std::io::Result<()> {
    let total = a.len() + from.map_or(0, |f| f.1);
    let mut done = 0usize;
    while done < total {
        match send_once(fd, a, from, done, libc::MSG_NOSIGNAL) {
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One `sendmsg` on `fd` with `flags` of `a` then the `len` bytes at address `from`, from
/// byte `done` of the two on; returns how many bytes it took.
fn send_once(
    fd: RawFd,
    a: &[u8],
    from: Option<(u64, usize)>,
    done: usize,
    flags: libc::c_int,
) -> std::io::Result<usize> {
    let (base, len) = from.unwrap_or((0, 0));
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    let mut k = 0;
    if done < a.len() {
        iov[0] = libc::iovec {
            iov_base: a[done..].as_ptr() as *mut libc::c_void,
            iov_len: a.len() - done,
        };
        k = 1;
    }
    if len > 0 {
        let skip = done.saturating_sub(a.len());
        iov[k] = libc::iovec {
            iov_base: (base as usize + skip) as *mut libc::c_void,
            iov_len: len - skip,
        };
        k += 1;
    }
    // SAFETY: a zeroed msghdr is valid (no name, no control data); it points at `iov`,
    // alive for the call.
    #[allow(unsafe_code)]
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = k;
    // SAFETY: the kernel reads the iovecs' ranges alone (no Rust reference to the
    // registration's bytes is made): `a` is borrowed for the call, and [from, from + len)
    // lies inside a registration the caller holds ([`Hold`]), which its deregistration
    // waits for.
    #[allow(unsafe_code)]
    let n = unsafe { libc::sendmsg(fd, &raw const msg, flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Takes the next `n` bytes of the connection (what `r` holds first, then the socket's)
/// into the `n` bytes at address `to`, or drops them when `to` is `None`.
fn take_into(r: &mut BufReader<TcpStream>, to: Option<u64>, n: usize) -> std::io::Result<()> {
    let Some(to) = to else {
        let got = std::io::copy(&mut r.by_ref().take(n as u64), &mut std::io::sink())?;
        if got < n as u64 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        return Ok(());
    };
    let held = r.buffer();
    let k = held.len().min(n);
    // SAFETY: [to, to + n) lies inside a registration the caller holds ([`Hold`]); the
    // reader's buffer is another allocation, so the ranges do not overlap.
    #[allow(unsafe_code)]
    unsafe {
        std::ptr::copy_nonoverlapping(held.as_ptr(), to as usize as *mut u8, k);
    }
    r.consume(k);
    let c = r.get_ref();
    let mut done = k;
    let mut lowat = 1;
    let r = (|| {
        while done < n {
            // Sleep until a good part of the rest has arrived, not at every segment: the
            // socket wakes pollers at `lowat` queued bytes, and the slice still has that
            // many to come, so the wait always ends. (A blocking receive would take what is
            // queued first and then wait for `lowat` more, which may never come.)
            let want = (n - done).min(WAKE_AT);
            if want != lowat {
                set_lowat(c, want)?;
                lowat = want;
            }
            wait_readable(c)?;
            // SAFETY: the kernel writes into [to + done, to + n) alone (no Rust reference
            // to the registration's bytes is made), which lies inside a registration the
            // caller holds.
            #[allow(unsafe_code)]
            let got = unsafe {
                libc::recv(
                    c.as_raw_fd(),
                    (to as usize + done) as *mut libc::c_void,
                    n - done,
                    libc::MSG_DONTWAIT,
                )
            };
            match got {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                g if g < 0 => {
                    let e = std::io::Error::last_os_error();
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                    ) {
                        return Err(e);
                    }
                }
                g => done += g as usize,
            }
        }
        Ok(())
    })();
    // Frame heads and small frames come one by one: wake for every byte again.
    if lowat != 1 {
        set_lowat(c, 1)?;
    }
    r
}

/// Sleeps until the connection `c` is readable (its low-water mark of bytes is queued) or
/// ended.
fn wait_readable(c: &TcpStream) -> std::io::Result<()> {
    loop {
        let mut p = [PollFd::new(c.as_fd(), PollFlags::POLLIN)];
        match poll(&mut p, PollTimeout::NONE) {
            Err(Errno::EINTR) => {}
            r => return r.map(drop).map_err(std::io::Error::from),
        }
    }
}

/// The most a reader waits to have queued before it is woken, inside a slice's bytes. A
/// mark near the receive window stalls the connection: the kernel wakes the reader only
/// once the window is all but closed, and the sender waits for it to reopen (1 MiB put
/// alone between two namespaces: 1.3-1.7 GB/s with a 1 MiB mark, 3.3-3.8 with 256 or 512
/// KiB; on loopback, whose window is larger, 512 KiB costs 3-6% against 1 MiB).
const WAKE_AT: usize = 512 << 10;

/// Sets how many bytes the socket holds before a reader is woken (`SO_RCVLOWAT`, which
/// nix does not wrap).
fn set_lowat(c: &TcpStream, n: usize) -> std::io::Result<()> {
    let v = libc::c_int::try_from(n).unwrap_or(libc::c_int::MAX);
    // SAFETY: `v` is a live c_int for the call, and its size is the option's length.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::setsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn read_loop(s: &Weak<Shared>, i: usize, lane: usize, c: TcpStream, holds: &Arc<Holds>) {
    let mut r = BufReader::with_capacity(READ_BUF, c);
    let err = loop {
        let mut h = [0u8; HEADER];
        if let Err(e) = r.read_exact(&mut h) {
            break XferError::PeerLost(format!("its connection: {e}"));
        }
        let body = match Frame::body_len(&h) {
            Ok(n) => n,
            Err(e) => break e,
        };
        if let Some(fixed) = Head::len(h[4]) {
            if body < fixed || body - fixed > stream::MAX_DATA {
                break XferError::BadMessage(format!("a frame of kind {} of {body} bytes", h[4]));
            }
            let mut f = [0u8; 20];
            if let Err(e) = r.read_exact(&mut f[..fixed]) {
                break XferError::PeerLost(format!("its connection: {e}"));
            }
            let head = match Head::parse(h[4], &f[..fixed]) {
                Ok(head) => head,
                Err(e) => break e,
            };
            let Some(shared) = s.upgrade() else { return };
            let n = body - fixed;
            let mut bytes = |to: Option<u64>| {
                take_into(&mut r, to, n)
                    .map_err(|e| XferError::PeerLost(format!("its connection: {e}")))
            };
            let done = match head {
                Head::Put { tag, key, addr } => {
                    on_put(&shared, i, lane, holds, (tag, key, addr, n), &mut bytes)
                }
                Head::Data { tag, status } => {
                    on_data(&shared, i, lane, holds, (tag, status, n), &mut bytes)
                }
            };
            if let Err(e) = done {
                break e;
            }
            continue;
        }
        let mut b = vec![0u8; body];
        if let Err(e) = r.read_exact(&mut b) {
            break XferError::PeerLost(format!("its connection: {e}"));
        }
        let f = match Frame::decode(h[4], b) {
            Ok(f) => f,
            Err(e) => break e,
        };
        let Some(shared) = s.upgrade() else { return };
        if let Err(e) = on_frame(&shared, i, lane, holds, f) {
            break e;
        }
    };
    // A peer that breaks the protocol, or whose connection ends, is cut off alone.
    cut_off(s, i, err);
}

/// Sends `f` to peer `i` on lane `lane`.
fn reply(s: &Shared, i: usize, lane: usize, f: impl Into<Out>) -> Result<()> {
    match &s.state().peers[i].link {
        Link::Tcp(t) => t.lanes.get(lane).map_or(Ok(()), |l| l.send(f)),
        Link::Rdma { .. } | Link::Gone(_) => Ok(()),
    }
}

fn remote_access() -> XferError {
    XferError::Transport(
        "remote access error: no registration of the target holds the range".into(),
    )
}

fn on_frame(s: &Shared, i: usize, lane: usize, holds: &Arc<Holds>, f: Frame) -> Result<()> {
    match f {
        Frame::Msg(_) if lane != 0 => {
            return Err(XferError::BadMessage(format!("a message on lane {lane}")));
        }
        Frame::Msg(bytes) => {
            if bytes.len() > MSG_MAX {
                return Err(XferError::BadMessage(format!(
                    "a message of {} bytes (at most {MSG_MAX})",
                    bytes.len()
                )));
            }
            let m = Msg::decode(&bytes)?;
            let mut st = s.state();
            apply(&mut st, i, m)?;
            pump(&mut st);
        }
        // Frames that carry bytes are read apart (their heads first, see `read_loop`).
        Frame::Put { .. } | Frame::Data { .. } => {
            return Err(XferError::BadMessage("a data frame read whole".into()));
        }
        Frame::Get {
            tag,
            key,
            addr,
            len,
        } => {
            // The bytes go out from the segment itself, once the writer reaches them.
            let len = len as usize;
            let out = {
                let st = s.state();
                match region(&st.local, key, true, addr, len) {
                    Some((mr, off)) => Out::From {
                        head: Frame::data_head(tag, OK, len),
                        hold: Hold::new(mr, holds),
                        off,
                        len,
                    },
                    None => Out::Frame(Frame::Data {
                        tag,
                        status: ACCESS_ERROR,
                        data: Vec::new(),
                    }),
                }
            };
            reply(s, i, lane, out)?;
        }
        Frame::Ack { tag, status } => {
            let mut st = s.state();
            if let Link::Tcp(t) = &mut st.peers[i].link {
                if let Some(l) = t.lanes.get_mut(lane) {
                    l.in_flight = l.in_flight.saturating_sub(1);
                }
            }
            let r = if status == OK {
                Ok(())
            } else {
                Err(remote_access())
            };
            let finished = end_slice(&mut st, i, tag, r);
            pump(&mut st);
            drop(st);
            if finished {
                s.changed.notify_all();
            }
            return Ok(());
        }
    }
    s.changed.notify_all();
    Ok(())
}

/// A put from peer `i` of `n` bytes (`bytes` takes them from the connection, into an
/// address or nowhere): they land at `addr` of the registration `key`, if the range lies
/// inside one this agent published; the peer is told how it went.
fn on_put(
    s: &Shared,
    i: usize,
    lane: usize,
    holds: &Arc<Holds>,
    (tag, key, addr, n): (u64, u32, u64, usize),
    bytes: &mut dyn FnMut(Option<u64>) -> Result<()>,
) -> Result<()> {
    let target = {
        let st = s.state();
        region(&st.local, key, true, addr, n).map(|(mr, off)| (Hold::new(mr, holds), off))
    };
    bytes(target.as_ref().map(|(h, off)| h.at(*off)))?;
    let status = if target.is_some() { OK } else { ACCESS_ERROR };
    drop(target);
    reply(s, i, lane, Frame::Ack { tag, status })
}

/// The answer of `n` bytes to a read of ours from peer `i`: they land where the read asked,
/// and then the slice ends.
fn on_data(
    s: &Shared,
    i: usize,
    lane: usize,
    holds: &Arc<Holds>,
    (tag, status, n): (u64, u8, usize),
    bytes: &mut dyn FnMut(Option<u64>) -> Result<()>,
) -> Result<()> {
    let (target, r) = {
        let mut st = s.state();
        let Link::Tcp(t) = &mut st.peers[i].link else {
            drop(st);
            return bytes(None);
        };
        let Some(t) = t.lanes.get_mut(lane) else {
            drop(st);
            return bytes(None);
        };
        t.in_flight = t.in_flight.saturating_sub(1);
        let (key, addr, len) = t
            .reads
            .remove(&tag)
            .ok_or_else(|| XferError::BadMessage(format!("data for no read ({tag:#x})")))?;
        if status != OK {
            (None, Err(remote_access()))
        } else if n != len as usize {
            return Err(XferError::BadMessage(format!(
                "{n} bytes for a read of {len}"
            )));
        } else {
            match region(&st.local, key, false, addr, n) {
                Some((mr, off)) => (Some((Hold::new(mr, holds), off)), Ok(())),
                None => (
                    None,
                    Err(XferError::Transport("the local segment is gone".into())),
                ),
            }
        }
    };
    bytes(target.as_ref().map(|(h, off)| h.at(*off)))?;
    drop(target);
    let mut st = s.state();
    let finished = end_slice(&mut st, i, tag, r);
    pump(&mut st);
    drop(st);
    if finished {
        s.changed.notify_all();
    }
    Ok(())
}
