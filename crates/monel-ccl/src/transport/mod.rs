//! Transports: a reliable, ordered byte stream to each peer behind one [`Link`] trait
//! (NCCL's transport interface), and the loop that sets each pair up on the first
//! transport both ends can use: shared memory, then RDMA, then TCP.
//!
//! Every pair starts as a TCP connection from the bootstrap mesh. Each transport in turn
//! (`monel_peer::select::ORDER`) runs its handshake over the pairs still on TCP; both ends of
//! a pair always agree on the outcome, and a pair a transport declines comes back with the
//! reason, which the pair's `Selection` keeps and its path-log line prints.

use std::io;
use std::net::{IpAddr, SocketAddr};

use monel_peer::channel::Channel;

use crate::bootstrap::Peer;
use std::os::fd::RawFd;
use std::time::Instant;

use monel_peer::select::{ORDER, Selection, TransportKind};
use nix::poll::PollFlags;

use crate::error::{CclError, Result};

#[cfg(test)]
pub(crate) mod mem;
pub(crate) mod rdma;
pub(crate) mod segment;
pub(crate) mod shm;
pub(crate) mod tcp;

pub use rdma::RdmaConfig;
pub use shm::ShmConfig;

/// Memory registered with a transport's NIC ([`Link::register`]), until dropped.
pub(crate) type Registration = Box<dyn std::any::Any + Send + Sync>;

/// One peer's connection.
pub(crate) trait Link: Send {
    /// The transport it runs on.
    fn kind(&self) -> TransportKind;
    /// Writes what it can without blocking (`Ok(0)` when full).
    fn write_some(&mut self, data: &[u8]) -> io::Result<usize>;
    /// Writes `a` then `b` as one stream, as much as fits without blocking (a frame header
    /// and its payload in one system call or one ring update).
    fn write_two(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        let n = self.write_some(a)?;
        if n < a.len() {
            return Ok(n);
        }
        Ok(n + self.write_some(b)?)
    }
    /// As [`Self::write_two`], with `b` left unchanged by the caller until [`Self::settle`]
    /// returns: where `b` lies in memory registered with the transport
    /// ([`Self::register`]), it is sent from there instead of through a staging copy.
    fn write_two_stable(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        self.write_two(a, b)
    }
    /// Waits until no write reads the caller's memory any more (see
    /// [`Self::write_two_stable`]), or `deadline`.
    fn settle(&mut self, deadline: Instant) -> io::Result<()> {
        let _ = deadline;
        Ok(())
    }
    /// Bytes sent straight from registered memory, without a staging copy.
    fn zero_copy_bytes(&self) -> u64 {
        0
    }
    /// Registers `[ptr, ptr + len)` with the transport's NIC, so stable writes from it skip
    /// the staging copy; the registration lasts as long as the returned handle, which holds
    /// for every link of the communicator on the same NIC. `None`: the transport has no
    /// such registration.
    ///
    /// # Safety
    /// The memory must stay valid until the returned handle is dropped.
    #[allow(unsafe_code)]
    unsafe fn register(&self, ptr: *mut u8, len: usize) -> Option<io::Result<Registration>> {
        let _ = (ptr, len);
        None
    }
    /// Reads what is there without blocking; `Err(UnexpectedEof)` once the peer closed.
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Looks at what is there without consuming it (`Err(UnexpectedEof)` once closed).
    fn peek(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// The descriptor to sleep on.
    fn fd(&self) -> RawFd;
    /// Prepares to sleep on [`Self::fd`] until the link can be read (`read`) or written
    /// (`write`): returns the poll events to wait for, or `None` when there is already
    /// something to do (do not sleep).
    fn arm(&mut self, read: bool, write: bool) -> Option<PollFlags> {
        let mut f = PollFlags::empty();
        if read {
            f |= PollFlags::POLLIN;
        }
        if write {
            f |= PollFlags::POLLOUT;
        }
        Some(f)
    }
    /// Writes all of `a` then `b` as one stream, or nothing (`Ok(false)`: no room now, or
    /// the transport cannot promise it; then nothing was written).
    fn write_whole(&mut self, a: &[u8], b: &[u8]) -> io::Result<bool> {
        let _ = (a, b);
        Ok(false)
    }
    /// After a sleep: withdraws the wake-up requests [`Self::arm`] made.
    fn disarm(&mut self) {}
    /// The transport's counters for the logs (retransmissions and the like), if it has any.
    /// The path's counters for the liveness check: retransmission timeouts, and packets
    /// taken from the peer (`None`: no path of its own to watch).
    fn path_progress(&self) -> Option<(u64, u64)> {
        None
    }
    fn counters(&self) -> Option<String> {
        None
    }
    /// Hands up to `max` received bytes, contiguous, to `f` where they lie (a ring), without
    /// copying them out; `f` returns how many it used, and those are consumed. `None` when
    /// the transport has no such buffer (read with [`Self::read_some`]); `Ok(0)` when nothing
    /// is there yet.
    fn read_in_place(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Option<io::Result<usize>> {
        let _ = (max, f);
        None
    }
}

/// What a transport's handshake gave one pair.
pub(crate) enum Setup<L> {
    /// The pair runs on the transport: its link, and a description for the path log.
    Up(L, String),
    /// The set-up channel back, and why the transport was not used.
    Declined(Channel, String),
}

/// What setting up every pair needs to know.
pub(crate) struct Plan<'a> {
    pub(crate) rank: usize,
    /// The address this rank reaches the others from.
    pub(crate) local_ip: IpAddr,
    /// Each rank's data address (the TCP path log names the peer's).
    pub(crate) peers: &'a [SocketAddr],
    pub(crate) shm: &'a ShmConfig,
    pub(crate) rdma: &'a RdmaConfig,
    /// Whether a pair may stay on TCP (`MONEL_TRANSPORT`).
    pub(crate) tcp: bool,
    /// TCP congestion controls to ask for, in order.
    pub(crate) tcp_congestion: &'a [String],
    pub(crate) deadline: Instant,
}

/// The links to every peer (`None` for this rank), and one path-log line per peer.
pub(crate) type Links = (Vec<Option<Box<dyn Link>>>, Vec<String>);

/// Sets up every pair in `streams` (indexed by peer; `None` for this rank) on the first
/// transport that takes it, in the order shared memory, RDMA, TCP.
pub(crate) fn connect(streams: Vec<Option<Peer>>, p: &Plan<'_>) -> Result<Links> {
    let n = streams.len();
    let streams: Vec<Option<Channel>> = streams
        .into_iter()
        .enumerate()
        .map(|(j, o)| o.map(|(s, key)| Channel::new(s, key, p.rank, j)))
        .collect();
    let mut links: Vec<Option<Box<dyn Link>>> = (0..n).map(|_| None).collect();
    let mut paths = vec![String::new(); n];
    let mut selections: Vec<Selection> = (0..n)
        .map(|j| Selection::new(format!("rank {}", p.rank), j))
        .collect();
    let mut rest = streams;
    // The transports with a handshake, in the peer layer's order; TCP takes what is left.
    type Upgrade<'p> =
        dyn Fn(Vec<Option<Channel>>) -> Result<Vec<Option<Setup<Box<dyn Link>>>>> + 'p;
    let shm: &Upgrade<'_> = &|s| {
        shm::upgrade(s, p.rank, p.shm, p.deadline)
            .map(boxed)
            .map_err(|e| CclError::io("shared-memory handshake", e))
    };
    let rdma: &Upgrade<'_> = &|s| {
        rdma::upgrade(s, p.local_ip, p.rdma, p.deadline)
            .map(boxed)
            .map_err(|e| CclError::io("RDMA handshake", e))
    };
    for kind in ORDER {
        let upgrade = match kind {
            TransportKind::Shm => shm,
            TransportKind::Roce => rdma,
            TransportKind::Tcp => break,
        };
        let outcomes = upgrade(std::mem::take(&mut rest))?;
        rest = (0..n).map(|_| None).collect();
        for (j, o) in outcomes.into_iter().enumerate() {
            match o {
                Some(Setup::Up(link, detail)) => {
                    paths[j] = selections[j].chosen(kind, &detail, &[]);
                    links[j] = Some(link);
                }
                Some(Setup::Declined(s, why)) => {
                    rest[j] = Some(s);
                    selections[j].decline(kind, why);
                }
                None => {}
            }
        }
    }
    for (j, s) in rest.into_iter().enumerate() {
        let Some(s) = s else { continue };
        if !p.tcp {
            return Err(CclError::bootstrap(format!(
                "rank {} -> {j}: MONEL_TRANSPORT forbids TCP; {}",
                p.rank,
                selections[j].reasons()
            )));
        }
        let link = tcp::TcpLink::new(s.s).map_err(|e| CclError::io("link", e))?;
        let cc = link.choose_congestion(p.tcp_congestion);
        let detail = format!("{} -> {}", p.local_ip, p.peers[j]);
        paths[j] = selections[j].chosen(TransportKind::Tcp, &detail, &[format!("congestion {cc}")]);
        links[j] = Some(Box::new(link));
    }
    paths.retain(|l| !l.is_empty());
    Ok((links, paths))
}

fn boxed<L: Link + 'static>(v: Vec<Option<Setup<L>>>) -> Vec<Option<Setup<Box<dyn Link>>>> {
    v.into_iter()
        .map(|o| {
            o.map(|s| match s {
                Setup::Up(l, d) => Setup::Up(Box::new(l) as Box<dyn Link>, d),
                Setup::Declined(s, why) => Setup::Declined(s, why),
            })
        })
        .collect()
}
