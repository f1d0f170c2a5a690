//! The shared-memory link, between agents on one host. Their messages go over one TCP
//! connection whose two sides proved the job secret, as on the TCP link. Each READ and WRITE
//! is one copy by the initiator, straight between its memory and the target's registered
//! segment, through the kernel's cross-memory attach (`process_vm_readv`,
//! `process_vm_writev`), much as an RNIC would DMA it.
//!
//! Set-up, on an `MXFRSHM1` connection after the TCP link's hello:
//! - **Whose process.** The server listens on an abstract Unix socket with a random name and
//!   sends the name; the client connects there and presents the peer's token. Each side then
//!   takes the other's pid from the kernel (`SO_PEERCRED`), never from what the peer says,
//!   and holds the process by a pidfd: a peer that exits is noticed before the next copy.
//!   An abstract socket lives in one network namespace, so agents in two namespaces fall back
//!   to another link.
//! - **Permission.** Each side reads 16 random bytes that the other published at an address
//!   it named, and both must succeed. The kernel allows it where one process may ptrace the
//!   other: the same user and Yama's `ptrace_scope` 0, or `CAP_SYS_PTRACE`. Monel never widens
//!   that permission. Where it is missing, the connection ends and the client tries its next
//!   link.
//!
//! Copies run on [`LANES`] threads per peer (slices spread over them), each in order. The
//! initiator checks every slice against the target's current table before handing it over,
//! so a revoked segment takes no new copies. The target keeps a revoked segment's memory
//! until the peer's `Revoked`, which goes only once every thread has passed the revocation
//! in its queue (every copy queued before it done): revocation is two-phase.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use monel_peer::auth::nonce;
use monel_verbs::MemoryRegion;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use super::{Link, Shared, end_slice, io, pump, send_msg};
use crate::batch::Op;
use crate::error::{Result, XferError};
use crate::wire::Msg;

/// Slices handed to each of a peer's copying threads at once.
pub(super) const DEPTH: u32 = 16;
/// Copying threads per peer.
pub(super) const LANES: usize = 2;
/// The least bytes one copy moves (a batch's slices on this link are at least this long):
/// each copy also costs a system call, the agent's lock and a completion, which showed at
/// 1 MiB (a tenth of the raw cross-memory copy's bandwidth at 4 MiB blocks).
pub(super) const SLICE: u64 = 4 << 20;

/// What the set-up learned of the peer: its process.
pub(super) struct Found {
    pid: i32,
    pidfd: OwnedFd,
}

/// A peer's shared-memory side, as the agent's state holds it: each copying thread's queue,
/// and the slices in it.
pub(super) struct Cma {
    lanes: Vec<(Sender<Job>, u32)>,
}

/// Work for a peer's copy thread.
pub(super) enum Job {
    /// One slice: `len` bytes between `local` at `local_off` and the peer's address `remote`.
    Slice {
        tag: u64,
        op: Op,
        local: Arc<MemoryRegion>,
        local_off: usize,
        remote: u64,
        len: usize,
    },
    /// Every copy before this one is done on this thread; the last thread to get here
    /// (`left` counts them down) tells the peer its segment is free.
    Revoked(String, Arc<AtomicUsize>),
}

impl Cma {
    /// Whether copying thread `lane` takes another slice.
    pub(super) fn has_room(&self, lane: usize) -> bool {
        self.lanes[lane].1 < DEPTH
    }

    /// Queues slice `job` for copying thread `lane`.
    pub(super) fn post(&mut self, lane: usize, job: Job) -> Result<()> {
        let (tx, n) = &mut self.lanes[lane];
        tx.send(job)
            .map_err(|_| XferError::PeerLost("its copying thread ended".into()))?;
        *n += 1;
        Ok(())
    }

    /// Queues the acknowledgement of revoked segment `name` behind every thread's copies.
    pub(super) fn revoked(&self, name: &str) -> Result<()> {
        let left = Arc::new(AtomicUsize::new(self.lanes.len()));
        for (tx, _) in &self.lanes {
            tx.send(Job::Revoked(name.to_string(), left.clone()))
                .map_err(|_| XferError::PeerLost("its copying thread ended".into()))?;
        }
        Ok(())
    }

    /// The copying threads slices spread over.
    pub(super) fn lanes(&self) -> usize {
        self.lanes.len()
    }
}

/// The client's side of the set-up on `c`, an authenticated `MXFRSHM1` connection whose
/// lane-0 token is `token`.
pub(super) fn client(c: &mut TcpStream, token: &[u8; 16], timeout: Duration) -> Result<Found> {
    c.set_read_timeout(Some(timeout)).map_err(io)?;
    let mut n = [0u8; 1];
    c.read_exact(&mut n).map_err(io)?;
    let mut name = vec![0u8; usize::from(n[0])];
    c.read_exact(&mut name).map_err(io)?;
    let addr = UnixAddr::from_abstract_name(&name).map_err(io)?;
    let mut u = UnixStream::connect_addr(&addr).map_err(|e| {
        XferError::Transport(format!(
            "the peer's shared-memory socket: {e} (another network namespace?)"
        ))
    })?;
    u.write_all(token).map_err(io)?;
    let found = peer_of(&u)?;
    probe(c, &found)?;
    c.set_read_timeout(None).map_err(io)?;
    Ok(found)
}

/// The server's side of the set-up on `c`, after the hello: the client must present `token`
/// on the Unix socket within `timeout`.
pub(super) fn server(c: &mut TcpStream, token: &[u8; 16], timeout: Duration) -> Result<Found> {
    let name = format!("monel-xfer-{}", hex(&nonce()));
    let addr = UnixAddr::from_abstract_name(name.as_bytes()).map_err(io)?;
    let l = UnixListener::bind_addr(&addr).map_err(io)?;
    l.set_nonblocking(true).map_err(io)?;
    let mut hello = vec![name.len() as u8];
    hello.extend_from_slice(name.as_bytes());
    c.write_all(&hello).map_err(io)?;
    let deadline = Instant::now() + timeout;
    // Anyone in the namespace can see the name and knock; only the peer has the token.
    let u = loop {
        match l.accept() {
            Ok((mut u, _)) => {
                u.set_nonblocking(false).map_err(io)?;
                u.set_read_timeout(Some(Duration::from_millis(500)))
                    .map_err(io)?;
                let mut t = [0u8; 16];
                if u.read_exact(&mut t).is_ok() && t == *token {
                    break u;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline || closed(c) {
                    return Err(XferError::Transport(
                        "the client did not come to the shared-memory socket (another host \
                         or network namespace?)"
                            .into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(io(e)),
        }
    };
    let found = peer_of(&u)?;
    c.set_read_timeout(Some(timeout)).map_err(io)?;
    probe(c, &found)?;
    c.set_read_timeout(None).map_err(io)?;
    Ok(found)
}

/// Whether the client closed `c` (one that could not reach the socket goes elsewhere).
fn closed(c: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    let _ = c.set_nonblocking(true);
    let r = c.peek(&mut b);
    let _ = c.set_nonblocking(false);
    !matches!(r, Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// The process at the other end of `u`, from the kernel, held by a pidfd.
fn peer_of(u: &UnixStream) -> Result<Found> {
    let cred =
        getsockopt(u, PeerCredentials).map_err(|e| XferError::from(std::io::Error::from(e)))?;
    let pid = cred.pid();
    if pid <= 0 {
        return Err(XferError::Transport(
            "the peer's process is not visible here (another pid namespace)".into(),
        ));
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
    // is passed.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a descriptor pidfd_open just returned, owned by nobody else.
    #[allow(unsafe_code)]
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // Still connected after the pidfd was taken: the pidfd is that process's.
    let mut b = [0u8; 1];
    u.set_nonblocking(true).map_err(io)?;
    match (&*u).read(&mut b) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        _ => {
            return Err(XferError::PeerLost(
                "the peer left during the shared-memory set-up".into(),
            ));
        }
    }
    Ok(Found { pid, pidfd })
}

/// Both sides show they may read each other's memory (see the module's doc).
fn probe(c: &mut TcpStream, found: &Found) -> Result<()> {
    let mine: Box<[u8; 16]> = Box::new(nonce());
    let mut out = (mine.as_ptr() as u64).to_be_bytes().to_vec();
    out.extend_from_slice(&mine[..]);
    c.write_all(&out).map_err(io)?;
    let mut theirs = [0u8; 24];
    c.read_exact(&mut theirs).map_err(io)?;
    let at = u64::from_be_bytes(theirs[..8].try_into().expect("8"));
    let mut seen = [0u8; 16];
    let ok = copy_raw(found.pid, Op::Read, seen.as_mut_ptr() as u64, at, 16).is_ok()
        && seen[..] == theirs[8..];
    c.write_all(&[u8::from(ok)]).map_err(io)?;
    let mut verdict = [0u8; 1];
    c.read_exact(&mut verdict).map_err(io)?;
    drop(mine); // the peer has read it by now (it answered)
    if !ok {
        return Err(XferError::Transport(
            "cross-memory attach to the peer is not permitted (the same user and \
             kernel.yama.ptrace_scope = 0, or CAP_SYS_PTRACE, are needed)"
                .into(),
        ));
    }
    if verdict[0] != 1 {
        return Err(XferError::Transport(
            "the peer may not attach to this process's memory".into(),
        ));
    }
    Ok(())
}

/// Starts peer `i`'s copying threads.
pub(super) fn start(s: &Arc<Shared>, i: usize, found: Found) -> Result<Cma> {
    let found = Arc::new(found);
    let mut lanes = Vec::with_capacity(LANES);
    for lane in 0..LANES {
        let (tx, rx) = mpsc::channel();
        let (w, f) = (Arc::downgrade(s), found.clone());
        std::thread::Builder::new()
            .name(format!("xfer-shm-{i}.{lane}"))
            .spawn(move || work(&w, i, lane, &f, &rx))
            .map_err(io)?;
        lanes.push((tx, 0));
    }
    Ok(Cma { lanes })
}

fn work(s: &Weak<Shared>, i: usize, lane: usize, found: &Found, rx: &Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let Some(s) = s.upgrade() else { return };
        match job {
            Job::Slice {
                tag,
                op,
                local,
                local_off,
                remote,
                len,
            } => {
                let r = copy(found, op, &local, local_off, remote, len);
                drop(local);
                let mut st = s.state();
                let p = &mut st.peers[i];
                if let Link::Tcp(t) = &mut p.link {
                    if let Some(c) = &mut t.cma {
                        c.lanes[lane].1 = c.lanes[lane].1.saturating_sub(1);
                    }
                }
                // A process that exited is a lost peer, whatever its connection says yet.
                let mut wake = false;
                if let Err(e @ XferError::PeerLost(_)) = &r {
                    p.lost.get_or_insert(e.clone());
                    wake = true;
                }
                wake |= end_slice(&mut st, i, tag, r);
                pump(&mut st);
                drop(st);
                if wake {
                    s.changed.notify_all();
                }
            }
            Job::Revoked(name, left) => {
                if left.fetch_sub(1, Ordering::AcqRel) != 1 {
                    continue; // another thread still has copies queued before it
                }
                let mut st = s.state();
                let p = &mut st.peers[i];
                if let Err(e) = send_msg(p, i, &Msg::Revoked(name)) {
                    p.lost.get_or_insert(e);
                }
                pump(&mut st);
                drop(st);
                s.changed.notify_all();
            }
        }
    }
}

/// Whether the peer's process is gone.
fn exited(found: &Found) -> bool {
    let mut fds = [PollFd::new(found.pidfd.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).map_or(true, |n| n > 0)
}

fn copy(
    found: &Found,
    op: Op,
    local: &MemoryRegion,
    off: usize,
    remote: u64,
    len: usize,
) -> Result<()> {
    if off.checked_add(len).is_none_or(|end| end > local.len()) {
        return Err(XferError::Transport(
            "the local range is outside its segment".into(),
        ));
    }
    if exited(found) {
        return Err(XferError::PeerLost("its process exited".into()));
    }
    copy_raw(found.pid, op, local.addr() + off as u64, remote, len)
}

/// Copies `len` bytes between this process's `local` and process `pid`'s `remote` (a WRITE
/// sends local bytes there, a READ brings them here).
fn copy_raw(pid: i32, op: Op, local: u64, remote: u64, len: usize) -> Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            iov_base: (local as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the kernel copies between the two ranges as a DMA engine would, through
        // the iovecs alone (no Rust reference to either range is made). The local range lies
        // inside a registration this agent holds (an `Arc` kept for the copy, or the probe
        // buffer alive for the call); the remote one inside a segment the peer published and
        // has not revoked, and a bad remote address fails with EFAULT rather than touching
        // this process.
        #[allow(unsafe_code)]
        let n = unsafe {
            match op {
                Op::Write => libc::process_vm_writev(pid, &raw const l, 1, &raw const r, 1, 0),
                Op::Read => libc::process_vm_readv(pid, &raw const l, 1, &raw const r, 1, 0),
            }
        };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) => XferError::PeerLost("its process exited".into()),
                Some(libc::EFAULT) => XferError::Transport(format!(
                    "remote access error: {len} bytes at {remote:#x} are not mapped in the peer"
                )),
                _ => XferError::Transport(format!("cross-memory copy: {e}")),
            });
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether `link` is a shared-memory one.
pub(super) fn is_shm(link: &Link) -> bool {
    matches!(link, Link::Tcp(t) if t.cma.is_some())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_within_this_process_and_refuses_unmapped_memory() {
        let pid = std::process::id() as i32;
        let src: Vec<u8> = (0..=255).cycle().take(10_000).collect();
        let mut dst = vec![0u8; 10_000];
        copy_raw(
            pid,
            Op::Write,
            src.as_ptr() as u64,
            dst.as_mut_ptr() as u64,
            10_000,
        )
        .unwrap();
        assert_eq!(src, dst);
        let mut back = vec![0u8; 4096];
        copy_raw(
            pid,
            Op::Read,
            back.as_mut_ptr() as u64,
            src.as_ptr() as u64 + 100,
            4096,
        )
        .unwrap();
        assert_eq!(back[..], src[100..4196]);
        // Page zero is never mapped.
        let err = copy_raw(pid, Op::Read, back.as_mut_ptr() as u64, 16, 8).unwrap_err();
        assert!(err.to_string().contains("not mapped"), "{err}");
    }
}
