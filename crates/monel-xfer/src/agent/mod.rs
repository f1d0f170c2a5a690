//! The agent: the engine's I/O edge. Each peer is reached over one link, the best that
//! works ([`Transport`]):
//!
//! - RDMA, over Monel's verbs (the soft RNIC, or a kernel RDMA device through rdma-core):
//!   [`RDMA_LANES`] RC queue pairs, each set up by Monel's connection manager (both sides
//!   prove the job secret, and the queue pair's packets are then protected with keys from
//!   it); the agents' messages (names, segment tables, notifications, the token that joins
//!   the further queue pairs to the first) go as SENDs on the first, so they are as
//!   protected as the data; READs and WRITEs go straight between registered segments, spread
//!   over the queue pairs;
//! - TCP, where RDMA does not work: one connection whose two sides proved the job
//!   secret; the target carries out each READ and WRITE against its own registrations;
//! - shared memory, between agents on one host: the messages go as on TCP, and each READ
//!   and WRITE is one copy by the initiator between the two processes' memory
//!   (cross-memory attach).
//!
//! One address serves all three: a client's first bytes say which link it opens
//! ([`crate::stream`]). Threads: one accepts peers (each handshake on a thread of its own),
//! one drives RDMA completions (it decodes messages, ends slices, posts what waits, wakes
//! waiters), two per TCP peer (one reads, one writes), and one more per shared-memory peer
//! (it copies). A peer whose link fails is lost: its
//! batches' slices fail with [`XferError::PeerLost`], nothing else is touched.
//!
//! This file is over the project's thousand lines, and stays one piece until its transports
//! stop calling back into it: `rdma`, `tcp` and `cma` run threads that lock the agent's state
//! and call its `pump`, `apply`, `end_slice`, `push_peer` and `send_msg`, and `pump` calls
//! them in turn. Split into files as it stands, that would be a loop between siblings. The
//! split comes with a lane boundary (post a slice, room left, send a message) whose
//! transports return events (slice done, message, peer lost) for the agent to apply.

mod cma;
mod rdma;
mod tcp;

pub use rdma::RDMA_LANES;
use rdma::{RX_SLOTS, SQ_DEPTH, TX_SLOTS};

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use monel_peer::greeter::Greeter;
use monel_peer::select::{self, Attempt, Selection, TransportKind};
use monel_verbs::cm;
use monel_verbs::protect::PacketAuth;
use monel_verbs::{
    AccessFlags, CompletionQueue, Context, ContextConfig, Device, MemoryRegion, ProtectionDomain,
    QueuePair, VerbsError,
};

use crate::batch::{Batch, Desc, DescState, Plan};
use crate::error::{Result, XferError};
use crate::notify::{Inbox, Notification, Outbox};
use crate::registry::Registry;
use crate::segment::{Buffer, Segment, SegmentTable};
use crate::wire::Msg;

/// Largest message between agents on the wire (a segment table of about 6,000 buffers, or
/// a 64 KiB notification).
const MSG_MAX: usize = 128 << 10;
/// Messages queued for one peer beyond its send slots (notifications of batches that
/// finished faster than the peer takes them).
const MAX_QUEUED: usize = 4096;
/// Completions the agent's one CQ holds (rxe allows at most 32,767).
const CQ_DEPTH: usize = 16 << 10;
/// Most live peers: each can have its queue pair's every work request complete at once.
pub const MAX_PEERS: usize = CQ_DEPTH / (SQ_DEPTH as usize + TX_SLOTS + RX_SLOTS);
/// What peers may do to a segment.
const SEGMENT_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_READ.0,
);
/// `wr_id` kinds.
const WR_SLICE: u64 = 1 << 56;

/// Which links an agent opens to its peers, and accepts from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Shared memory where it works (a peer on this host), else RDMA, else TCP (each
    /// fallback logged with the reason); accepts all three.
    #[default]
    Auto,
    /// RDMA only.
    Rdma,
    /// TCP only.
    Tcp,
    /// Shared memory only (peers on this host).
    Shm,
}

/// How an agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Its name, unique in the job (peers address it by this name).
    pub name: String,
    /// The RDMA device (a soft device bound to an address, or a kernel device's port).
    pub device: Device,
    /// Where peers connect (TCP; port 0 picks one).
    pub listen: SocketAddr,
    /// The job secret every peer must prove; `None` only for tests on a trusted host.
    pub secret: Option<Vec<u8>>,
    /// Packet protection on the soft RNIC (with a secret): a tag, or encryption.
    pub auth: PacketAuth,
    /// How batches are cut.
    pub plan: Plan,
    /// Limit on each connection setup.
    pub timeout: Duration,
    /// The soft RNIC's UDP port: RoCE's 4791, where hardware peers and rxe send; another
    /// (or 0, any free one) lets several agents share an address with soft peers only.
    pub udp_port: u16,
    /// The links [`Agent::connect`] opens and the listener accepts.
    pub transport: Transport,
    /// Where the agent registers its name and finds others by theirs (etcd); `None`: peers
    /// meet by address only.
    pub registry: Option<Registry>,
}

impl AgentConfig {
    /// An agent named `name` on `device`, listening on any port of `listen_ip`, with a
    /// secret (packets tagged) or without.
    pub fn new(name: &str, device: Device, listen: SocketAddr, secret: Option<Vec<u8>>) -> Self {
        let auth = if secret.is_some() {
            PacketAuth::Mac
        } else {
            PacketAuth::None
        };
        Self {
            name: name.to_string(),
            device,
            listen,
            secret,
            auth,
            plan: Plan::default(),
            timeout: Duration::from_secs(10),
            udp_port: ContextConfig::default().udp_port,
            transport: Transport::Auto,
            registry: None,
        }
    }
}

/// A batch's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchId(u32);

impl BatchId {
    /// The batch numbered `n` (as [`Self::get`] gave it).
    pub fn new(n: u32) -> Self {
        Self(n)
    }
    /// Its number.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// How a peer is reached.
enum Link {
    /// Queue pairs (lanes, each with its slices in flight; the first carries the
    /// messages), the regions the messages go through, and the token further lanes present.
    Rdma {
        qps: Vec<(QueuePair, u32)>,
        rx: MemoryRegion,
        tx: MemoryRegion,
        tx_free: Vec<usize>,
        token: Option<[u8; 16]>,
    },
    /// TCP connections.
    Tcp(tcp::Lanes),
    /// A lost peer's link, released (its queue pair, buffers or connections), and the
    /// transport it was.
    Gone(TransportKind),
}

impl Link {
    /// The transport the link runs on.
    fn kind(&self) -> TransportKind {
        match self {
            Self::Rdma { .. } => TransportKind::Roce,
            Self::Tcp(t) if t.cma.is_some() => TransportKind::Shm,
            Self::Tcp(_) => TransportKind::Tcp,
            Self::Gone(was) => *was,
        }
    }
}

struct Peer {
    name: Option<String>,
    link: Link,
    remote: SegmentTable,
    /// Messages waiting for a send slot, in order.
    queued: VecDeque<Vec<u8>>,
    outbox: Outbox,
    /// Its segment table arrived.
    published: bool,
    lost: Option<XferError>,
    /// The lane the next batch's first slice goes on.
    next_lane: usize,
}

/// This agent's segments: the table (with local keys) and each one's registration.
struct Local {
    table: SegmentTable,
    /// Shared with the copies of shared-memory links in flight.
    mrs: HashMap<String, Arc<MemoryRegion>>,
}

impl Local {
    /// The segments as peers reach them: the same buffers, with remote keys.
    fn published(&self) -> Vec<Segment> {
        self.table
            .iter()
            .map(|seg| {
                let rkey = self.mrs.get(&seg.name).map_or(0, |m| m.rkey().0);
                Segment {
                    name: seg.name.clone(),
                    buffers: seg
                        .buffers
                        .iter()
                        .map(|b| Buffer { key: rkey, ..*b })
                        .collect(),
                }
            })
            .collect()
    }
}

struct BatchEntry {
    peer: usize,
    batch: Batch,
    notified: bool,
}

struct State {
    local: Local,
    peers: Vec<Peer>,
    batches: HashMap<u32, BatchEntry>,
    next_batch: u32,
    inbox: Inbox,
    /// What peers sent that was refused without cutting them off.
    refused: Vec<XferError>,
    /// Segments being revoked: the shared-memory peers that have not said they stopped
    /// using each.
    revoking: HashMap<String, Vec<usize>>,
}

struct Shared {
    name: String,
    cfg: AgentConfig,
    // Fields drop in this order: the queue pairs and regions in `state` before the CQ, the
    // protection domain and the context they were made from.
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    _ctx: Context,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An agent: registers segments, connects to peers, moves bytes between them.
pub struct Agent {
    shared: Arc<Shared>,
    addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    /// The registry lease its name is held under.
    lease: Option<i64>,
}

fn verbs(e: VerbsError) -> XferError {
    XferError::from(e)
}

fn io(e: std::io::Error) -> XferError {
    XferError::from(e)
}

impl Agent {
    /// Opens the device and starts listening for peers.
    pub fn new(cfg: AgentConfig) -> Result<Self> {
        crate::segment::check_name(&cfg.name)?;
        let ctx = Context::open(
            &cfg.device,
            ContextConfig {
                udp_port: cfg.udp_port,
                ..ContextConfig::default()
            },
        )
        .map_err(verbs)?;
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(CQ_DEPTH).map_err(verbs)?;
        let listener = TcpListener::bind(cfg.listen).map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let lease = match &cfg.registry {
            None => None,
            Some(r) => {
                if addr.ip().is_unspecified() {
                    return Err(XferError::Transport(format!(
                        "listening on {addr}: give a specific address to register it"
                    )));
                }
                let lease = r.grant()?;
                if let Err(e) = r.claim(&cfg.name, addr, lease) {
                    let _ = r.revoke(lease);
                    return Err(e);
                }
                Some(lease)
            }
        };
        let shared = Arc::new(Shared {
            name: cfg.name.clone(),
            cfg,
            pd,
            cq,
            state: Mutex::new(State {
                local: Local {
                    table: SegmentTable::new(),
                    mrs: HashMap::new(),
                },
                peers: Vec::new(),
                batches: HashMap::new(),
                next_batch: 0,
                inbox: Inbox::new(),
                refused: Vec::new(),
                revoking: HashMap::new(),
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            _ctx: ctx,
        });
        let s1 = shared.clone();
        let s2 = shared.clone();
        let mut threads = vec![
            std::thread::Builder::new()
                .name(format!("xfer-accept-{}", shared.name))
                .spawn(move || accept_loop(&s1, listener))
                .map_err(io)?,
            std::thread::Builder::new()
                .name(format!("xfer-progress-{}", shared.name))
                .spawn(move || rdma::progress_loop(&s2))
                .map_err(io)?,
        ];
        if let (Some(id), Some(r)) = (lease, shared.cfg.registry.clone()) {
            let s3 = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("xfer-lease-{}", shared.name))
                    .spawn(move || keep_lease(&s3, &r, id))
                    .map_err(io)?,
            );
        }
        Ok(Self {
            shared,
            addr,
            threads,
            lease,
        })
    }

    /// Connects to the agent registered as `name` in the job ([`AgentConfig::registry`]);
    /// the agent found must introduce itself by that name.
    pub fn connect_name(&self, name: &str) -> Result<String> {
        let r = self.shared.cfg.registry.as_ref().ok_or_else(|| {
            XferError::Transport("no registry configured: connect by address".into())
        })?;
        let addr = r
            .lookup(name)?
            .ok_or_else(|| XferError::UnknownPeer(name.to_string()))?;
        let got = self.connect(addr)?;
        if got != name {
            let mut st = self.shared.state();
            if let Ok(i) = find_peer(&st, &got) {
                st.peers[i]
                    .lost
                    .get_or_insert(XferError::PeerLost(format!("{got} was found as {name}")));
                if let Link::Tcp(t) = &st.peers[i].link {
                    t.close();
                }
            }
            return Err(XferError::BadMessage(format!(
                "the agent registered as {name:?} at {addr} says it is {got:?}"
            )));
        }
        Ok(got)
    }

    /// The agents registered in the job now (this one included), by name.
    pub fn registered(&self) -> Result<Vec<String>> {
        let r = self
            .shared
            .cfg
            .registry
            .as_ref()
            .ok_or_else(|| XferError::Transport("no registry configured".into()))?;
        Ok(r.agents()?.into_iter().map(|(n, _)| n).collect())
    }

    /// This agent's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Where peers connect.
    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// Registers a segment of `len` zeroed bytes (one buffer, on huge pages where the
    /// kernel has them) and publishes it to every peer.
    pub fn register(&self, name: &str, len: usize) -> Result<()> {
        let mut st = self.shared.state();
        if st.local.table.get(name).is_ok() {
            return Err(XferError::Duplicate(name.to_string()));
        }
        let mr = self
            .shared
            .pd
            .reg_mr(huge_zeroed(len), SEGMENT_ACCESS)
            .map_err(verbs)?;
        publish(&mut st, name, mr)
    }

    /// Registers the caller's memory `[ptr, ptr + len)` in place as segment `name` (one
    /// buffer) and publishes it to every peer: peers READ it and WRITE into it directly.
    ///
    /// # Safety
    /// The memory must stay valid for reads and writes until the segment is deregistered or
    /// the agent dropped, and must not be touched while a transfer on it may be in progress
    /// (peers and the RNIC access it as a NIC DMAs), as
    /// [`monel_verbs::ProtectionDomain::reg_mr_raw`] asks.
    #[allow(unsafe_code)]
    pub unsafe fn register_in_place(&self, name: &str, ptr: *mut u8, len: usize) -> Result<()> {
        let mut st = self.shared.state();
        if st.local.table.get(name).is_ok() {
            return Err(XferError::Duplicate(name.to_string()));
        }
        // SAFETY: this function's contract is `reg_mr_raw`'s; the region lives in the
        // agent's table until `deregister` or the agent's drop, which is as long as the
        // caller keeps the memory.
        let mr = unsafe { self.shared.pd.reg_mr_raw(ptr, len, SEGMENT_ACCESS) }.map_err(verbs)?;
        publish(&mut st, name, mr)
    }

    /// Withdraws a segment: peers are told, and its memory is deregistered (transfers
    /// still using it fail). Peers on shared memory copy into it themselves: the call waits
    /// (up to the agent's timeout) until each said it stopped, and cuts off one that did
    /// not; bytes already on their way over TCP finish moving first (a peer whose
    /// connection stalls past the timeout is cut off), so the memory is free once this
    /// returns.
    pub fn deregister(&self, name: &str) -> Result<()> {
        let mut st = self.shared.state();
        st.local.table.remove(name)?;
        let mr = st.local.mrs.remove(name);
        broadcast(&mut st, &Msg::Revoke(name.to_string()));
        let deadline = Instant::now() + self.shared.cfg.timeout;
        drop(self.stop_copies(st, name, deadline));
        if let Some(mr) = mr {
            release(&self.shared, &mr, deadline);
        }
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Waits until every shared-memory peer said it stopped copying into or out of segment
    /// `name` (cutting off those that did not by `deadline`).
    fn stop_copies<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        name: &str,
        deadline: Instant,
    ) -> MutexGuard<'a, State> {
        let using: Vec<usize> = (0..st.peers.len())
            .filter(|&i| st.peers[i].lost.is_none() && cma::is_shm(&st.peers[i].link))
            .collect();
        if using.is_empty() {
            return st;
        }
        st.revoking.insert(name.to_string(), using);
        loop {
            let State {
                revoking, peers, ..
            } = &mut *st;
            let waiting = revoking.get_mut(name).expect("inserted above");
            waiting.retain(|&i| peers[i].lost.is_none());
            if waiting.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                for &i in waiting.iter() {
                    peers[i].lost.get_or_insert(XferError::PeerLost(format!(
                        "it did not stop using segment {name:?} within {:?} of its revocation",
                        self.shared.cfg.timeout
                    )));
                }
                pump(&mut st);
                break;
            }
            st = wait(&self.shared, st, left);
        }
        st.revoking.remove(name);
        st
    }

    /// Writes `data` into this agent's segment `name` at `offset`.
    pub fn write_local(&self, name: &str, offset: usize, data: &[u8]) -> Result<()> {
        self.with_region(name, |mr| mr.write(offset, data))
    }

    /// Reads this agent's segment `name` at `offset` into `out`.
    pub fn read_local(&self, name: &str, offset: usize, out: &mut [u8]) -> Result<()> {
        self.with_region(name, |mr| mr.read(offset, out))
    }

    fn with_region(
        &self,
        name: &str,
        f: impl FnOnce(&MemoryRegion) -> monel_verbs::Result<()>,
    ) -> Result<()> {
        let st = self.shared.state();
        let mr = st
            .local
            .mrs
            .get(name)
            .ok_or_else(|| XferError::UnknownSegment(name.to_string()))?;
        f(mr).map_err(verbs)
    }

    /// Connects to the agent listening at `addr` over the configured [`Transport`]; returns
    /// its name once its segment table has arrived. With [`Transport::Auto`] the peer layer's
    /// order is tried (shared memory, RDMA, TCP) and one line logs which was taken and why
    /// the faster ones were not; a peer that none takes gets the last transport's error.
    pub fn connect(&self, addr: SocketAddr) -> Result<String> {
        let order: &[TransportKind] = match self.shared.cfg.transport {
            Transport::Auto => &select::ORDER,
            Transport::Rdma => &[TransportKind::Roce],
            Transport::Tcp => &[TransportKind::Tcp],
            Transport::Shm => &[TransportKind::Shm],
        };
        let mut last = None;
        let chosen = select::select(Selection::new(&self.shared.name, addr), order, |kind| {
            let tried = match kind {
                TransportKind::Shm => self.connect_shm(addr),
                TransportKind::Roce => self.connect_rdma(addr),
                TransportKind::Tcp => self.connect_tcp(addr),
            };
            match tried {
                Ok(name) => Attempt::Up(name, String::new()),
                Err(e) => {
                    let why = e.to_string();
                    last = Some(e);
                    Attempt::Declined(why)
                }
            }
        });
        match chosen {
            Ok(c) => {
                tracing::info!(target: "monel::xfer", "{} (peer {})", c.line, c.link);
                Ok(c.link)
            }
            Err(none) => {
                tracing::info!(target: "monel::xfer", "{none}");
                Err(last.expect("every transport tried left its error"))
            }
        }
    }

    fn connect_shm(&self, addr: SocketAddr) -> Result<String> {
        let (secret, timeout) = (self.shared.cfg.secret.as_deref(), self.shared.cfg.timeout);
        let token = tcp::token();
        let open = crate::stream::OPEN_SHM;
        let mut stream = tcp::open(dial(addr, timeout)?, open, secret, timeout, &token, 0)?;
        let found = cma::client(&mut stream, &token, timeout)?;
        let i = tcp::add_peer(&self.shared, stream, token, Some(found))?;
        self.introduced(i, addr)
    }

    fn connect_rdma(&self, addr: SocketAddr) -> Result<String> {
        let i = rdma::connect(&self.shared, addr)?;
        let name = self.introduced(i, addr)?;
        rdma::add_lanes(&self.shared, i, addr, &name)?;
        Ok(name)
    }

    fn connect_tcp(&self, addr: SocketAddr) -> Result<String> {
        let (secret, timeout) = (self.shared.cfg.secret.as_deref(), self.shared.cfg.timeout);
        let token = tcp::token();
        let open = crate::stream::OPEN_TCP;
        let stream = tcp::open(dial(addr, timeout)?, open, secret, timeout, &token, 0)?;
        let i = tcp::add_peer(&self.shared, stream, token, None)?;
        let name = self.introduced(i, addr)?;
        // More lanes, once the peer knows the first.
        for lane in 1..tcp::LANES as u8 {
            let added = dial(addr, timeout)
                .and_then(|c| tcp::open(c, open, secret, timeout, &token, lane))
                .and_then(|c| tcp::attach(&self.shared, i, c, lane));
            if let Err(e) = added {
                tracing::info!(target: "monel::xfer", "{}: TCP lane {lane} to {name}: {e}", self.shared.name);
                break;
            }
        }
        Ok(name)
    }

    /// Waits until peer `i` introduced itself and published its table; returns its name.
    fn introduced(&self, i: usize, addr: SocketAddr) -> Result<String> {
        let deadline = Instant::now() + self.shared.cfg.timeout;
        let mut st = self.shared.state();
        loop {
            let p = &st.peers[i];
            if let Some(e) = &p.lost {
                return Err(e.clone());
            }
            if let (Some(n), true) = (&p.name, p.published) {
                return Ok(n.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let e = XferError::PeerLost(format!(
                    "{addr} connected but did not introduce itself within {:?}",
                    self.shared.cfg.timeout
                ));
                st.peers[i].lost.get_or_insert(e.clone());
                return Err(e);
            }
            st = wait(&self.shared, st, left);
        }
    }

    /// The transport peer `peer` is reached over.
    pub fn transport(&self, peer: &str) -> Result<TransportKind> {
        let st = self.shared.state();
        let i = find_peer(&st, peer)?;
        Ok(st.peers[i].link.kind())
    }

    /// The lanes slices to peer `peer` spread over: 1 on RDMA (one queue pair) and on shared
    /// memory (one copying thread), the TCP connections over TCP.
    pub fn lanes(&self, peer: &str) -> Result<usize> {
        let st = self.shared.state();
        let i = find_peer(&st, peer)?;
        Ok(match &st.peers[i].link {
            Link::Rdma { qps, .. } => qps.len(),
            Link::Tcp(t) => t.cma.as_ref().map_or(t.lanes.len(), cma::Cma::lanes),
            Link::Gone(_) => 0,
        })
    }

    /// The peers that introduced themselves, and are not lost.
    pub fn peers(&self) -> Vec<String> {
        let st = self.shared.state();
        st.peers
            .iter()
            .filter(|p| p.lost.is_none())
            .filter_map(|p| p.name.clone())
            .collect()
    }

    /// What peer `peer` publishes.
    pub fn remote_segments(&self, peer: &str) -> Result<Vec<Segment>> {
        let st = self.shared.state();
        let i = find_peer(&st, peer)?;
        Ok(st.peers[i].remote.iter().cloned().collect())
    }

    /// Starts a batch of transfers with `peer`; its notification (if any) reaches the peer
    /// once every descriptor's data is in place. Bad descriptors fail alone (see
    /// [`Self::wait`]).
    pub fn transfer(
        &self,
        peer: &str,
        descs: &[Desc<'_>],
        notification: Option<Vec<u8>>,
    ) -> Result<BatchId> {
        let mut st = self.shared.state();
        let i = find_peer(&st, peer)?;
        if let Some(e) = &st.peers[i].lost {
            return Err(e.clone());
        }
        let mut plan = Plan {
            lanes: 1,
            first_lane: st.peers[i].next_lane,
            ..self.shared.cfg.plan
        };
        if let Link::Rdma { qps, .. } = &st.peers[i].link {
            plan.lanes = qps.len();
        }
        if let Link::Tcp(t) = &st.peers[i].link {
            plan.slice = match &t.cma {
                Some(_) => plan.slice.max(cma::SLICE),
                None => plan
                    .slice
                    .max(tcp::SLICE)
                    .min(crate::stream::MAX_DATA as u64),
            };
            plan.lanes = t.cma.as_ref().map_or(t.lanes.len(), cma::Cma::lanes);
        }
        let batch = Batch::plan(
            descs,
            &st.local.table,
            &st.peers[i].remote,
            plan,
            notification,
        )?;
        // The next batch starts on the lane after this one's last slice.
        let p = &mut st.peers[i];
        p.next_lane = (plan.first_lane + batch.slices().len()) % plan.lanes;
        let id = st.next_batch;
        st.next_batch = st.next_batch.wrapping_add(1) & 0x00ff_ffff;
        st.batches.insert(
            id,
            BatchEntry {
                peer: i,
                batch,
                notified: false,
            },
        );
        pump(&mut st);
        Ok(BatchId(id))
    }

    /// Each descriptor's state now (the batch stays until [`Self::wait`] sees it end).
    pub fn status(&self, id: BatchId) -> Result<Vec<DescState>> {
        let st = self.shared.state();
        Ok(batch_of(&st, id)?.batch.states().to_vec())
    }

    /// Waits until the batch ends (or `timeout`); returns each descriptor's state, and
    /// forgets the batch once it ended.
    pub fn wait(&self, id: BatchId, timeout: Duration) -> Result<Vec<DescState>> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state();
        loop {
            let e = batch_of(&st, id)?;
            if e.batch.is_finished() && e.notified {
                let e = st.batches.remove(&id.0).expect("present");
                return Ok(e.batch.states().to_vec());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(XferError::Timeout(format!(
                    "batch {} not finished within {timeout:?}",
                    id.0
                )));
            }
            st = wait(&self.shared, st, left);
        }
    }

    /// The notifications received and not yet read, oldest first.
    pub fn notifications(&self) -> Vec<Notification> {
        self.shared.state().inbox.take_all()
    }

    /// Waits until a notification is unread (or `timeout`); returns the unread ones,
    /// oldest first (none on a timeout).
    pub fn wait_notifications(&self, timeout: Duration) -> Vec<Notification> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if st.inbox.unread() > 0 || left.is_zero() {
                return st.inbox.take_all();
            }
            st = wait(&self.shared, st, left);
        }
    }

    /// Waits until every message sent to a live peer (notifications, tables) was delivered:
    /// on RDMA, its SEND acknowledged by the peer's NIC; on TCP, written out to the
    /// connection. Dropping the agent does this first, for up to its timeout.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state();
        loop {
            let busy = st.peers.iter().any(|p| {
                p.lost.is_none()
                    && (!p.queued.is_empty()
                        || match &p.link {
                            Link::Rdma { tx_free, .. } => tx_free.len() < TX_SLOTS,
                            Link::Tcp(t) => !t.flushed(),
                            Link::Gone(_) => false,
                        })
            });
            if !busy {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(XferError::Timeout(format!(
                    "messages to peers not delivered within {timeout:?}"
                )));
            }
            st = wait(&self.shared, st, left);
        }
    }

    /// What peers sent that was refused without cutting them off (a repeated notification,
    /// a full inbox), oldest first.
    pub fn refused(&self) -> Vec<XferError> {
        std::mem::take(&mut self.shared.state().refused)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // What was sent (the last notifications) reaches the peers before the agent goes.
        let _ = self.flush(self.shared.cfg.timeout);
        self.shared.stop.store(true, Ordering::Release);
        // Its name goes from the registry at once (a dead agent's, when its lease ends).
        if let (Some(id), Some(r)) = (self.lease, &self.shared.cfg.registry) {
            let _ = r.revoke(id);
        }
        // TCP links' threads end when their connection does.
        for p in &self.shared.state().peers {
            if let Link::Tcp(t) = &p.link {
                t.close();
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Memory registered in place is the caller's again once the agent is gone: wait
        // for the connections' calls on it to end (they fail at once on a closed socket).
        let mrs: Vec<_> = self.shared.state().local.mrs.drain().collect();
        let deadline = Instant::now() + self.shared.cfg.timeout;
        for (_, mr) in &mrs {
            release(&self.shared, mr, deadline);
        }
    }
}

/// Waits until nothing but the caller holds `mr` (a withdrawn registration): copies and
/// TCP connections that move its bytes outside the lock finish first. Peers whose
/// connections still hold it at `deadline` are cut off, which ends their connections' calls.
fn release(s: &Shared, mr: &Arc<MemoryRegion>, deadline: Instant) {
    let mut cut = false;
    while Arc::strong_count(mr) > 1 {
        if !cut && Instant::now() >= deadline {
            let mut st = s.state();
            for p in &mut st.peers {
                if let Link::Tcp(t) = &p.link {
                    if p.lost.is_none() && t.holding(mr) {
                        p.lost.get_or_insert(XferError::PeerLost(format!(
                            "its connection held a withdrawn segment past {:?}",
                            s.cfg.timeout
                        )));
                    }
                }
            }
            pump(&mut st);
            cut = true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Huge pages: a buffer of this size or more is advised onto them.
const HUGE_PAGE: usize = 2 << 20;

/// `len` zeroed bytes, their whole 2 MiB pages advised onto transparent huge pages
/// (`MADV_HUGEPAGE`, as numpy does for its large arrays) before anything touches them. A
/// copy between processes (shared memory's cross-memory attach) pins the target's pages
/// one by one, and the kernel's socket copies walk them: a huge page makes 512 of them one.
/// Where the kernel has no transparent huge pages the advice is refused, and ignored.
fn huge_zeroed(len: usize) -> Vec<u8> {
    let v = vec![0u8; len];
    let start = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
    let end = (v.as_ptr() as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: [start, end) lies inside `v`'s allocation, page-aligned; the advice
        // changes how the kernel backs those pages, never their contents (zeros either way).
        #[allow(unsafe_code)]
        let _ =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    v
}

/// Adds `mr` to the table as segment `name` and sends every peer the new table.
fn publish(st: &mut State, name: &str, mr: MemoryRegion) -> Result<()> {
    let seg = Segment::new(
        name,
        vec![Buffer {
            addr: mr.addr(),
            len: mr.len() as u64,
            key: mr.lkey().0,
        }],
    )?;
    st.local.table.insert(seg)?;
    st.local.mrs.insert(name.to_string(), Arc::new(mr));
    let table = Msg::Segments(st.local.published());
    if table.encode().len() > MSG_MAX {
        st.local.table.remove(name)?;
        st.local.mrs.remove(name);
        return Err(XferError::TooLarge(format!(
            "the segment table with {name:?} is over {MSG_MAX} bytes"
        )));
    }
    broadcast(st, &table);
    Ok(())
}

/// The index the next peer gets, if one more may come.
fn next_peer(st: &State) -> Result<usize> {
    let i = st.peers.len();
    if i >= 1 << 16 || st.peers.iter().filter(|p| p.lost.is_none()).count() >= MAX_PEERS {
        return Err(XferError::TooLarge(format!(
            "more than {MAX_PEERS} live peers on one agent"
        )));
    }
    Ok(i)
}

/// Adds a peer reached over `link` (at [`next_peer`]'s index), introduces this agent and
/// publishes its segments.
fn push_peer(s: &Shared, st: &mut State, link: Link) -> Result<usize> {
    let i = st.peers.len();
    st.peers.push(Peer {
        name: None,
        link,
        remote: SegmentTable::new(),
        queued: VecDeque::new(),
        outbox: Outbox::default(),
        published: false,
        lost: None,
        next_lane: 0,
    });
    let hello = Msg::Hello(s.name.clone());
    let table = Msg::Segments(st.local.published());
    let p = &mut st.peers[i];
    send_msg(p, i, &hello)?;
    send_msg(p, i, &table)?;
    Ok(i)
}

/// A TCP connection to `addr` with Nagle off, dialled again while the peer is not
/// listening yet ([`cm::dial`]).
fn dial(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let s = cm::dial(addr, timeout).map_err(verbs)?;
    s.set_nodelay(true).map_err(io)?;
    Ok(s)
}

fn batch_of(st: &State, id: BatchId) -> Result<&BatchEntry> {
    st.batches.get(&id.0).ok_or(XferError::UnknownBatch(id.0))
}

fn find_peer(st: &State, name: &str) -> Result<usize> {
    st.peers
        .iter()
        .rposition(|p| p.name.as_deref() == Some(name))
        .ok_or_else(|| XferError::PeerLost(format!("no peer named {name:?}")))
}

/// Queues `msg` for peer `i` (in order, after what is queued) and sends what the free send
/// slots allow; the rest goes as slots free up ([`send_queued`]). Nothing goes to a lost
/// peer.
fn send_msg(p: &mut Peer, i: usize, msg: &Msg) -> Result<()> {
    if p.lost.is_some() {
        return Ok(());
    }
    let bytes = msg.encode();
    if bytes.len() > MSG_MAX {
        return Err(XferError::TooLarge(format!(
            "a message of {} bytes (at most {MSG_MAX} between agents)",
            bytes.len()
        )));
    }
    if p.queued.len() >= MAX_QUEUED {
        return Err(XferError::TooLarge(format!(
            "{MAX_QUEUED} messages queued for one peer"
        )));
    }
    p.queued.push_back(bytes);
    send_queued(p, i)
}

/// Sends queued messages to peer `i` while its link takes them (an RDMA link while it has
/// free send slots).
fn send_queued(p: &mut Peer, i: usize) -> Result<()> {
    while p.lost.is_none() && !p.queued.is_empty() {
        match &mut p.link {
            Link::Rdma {
                qps, tx, tx_free, ..
            } => {
                let Some(slot) = tx_free.pop() else {
                    return Ok(());
                };
                let bytes = p.queued.pop_front().expect("not empty");
                rdma::send(&qps[0].0, tx, i, slot, &bytes)?;
            }
            Link::Tcp(t) => {
                let bytes = p.queued.pop_front().expect("not empty");
                t.send(crate::stream::Frame::Msg(bytes))?;
            }
            Link::Gone(_) => return Ok(()),
        }
    }
    Ok(())
}

/// Sends `msg` to every peer; one that cannot take it (its queue is full) is cut off.
fn broadcast(st: &mut State, msg: &Msg) {
    for (i, p) in st.peers.iter_mut().enumerate() {
        if let Err(e) = send_msg(p, i, msg) {
            p.lost.get_or_insert(e);
        }
    }
}

/// Posts what batches have waiting, as far as each peer's send queue allows, and sends the
/// notifications of batches whose data is in place.
fn pump(st: &mut State) {
    let State {
        peers,
        batches,
        local,
        ..
    } = st;
    for (&id, e) in batches.iter_mut() {
        let p = &mut peers[e.peer];
        if let Some(err) = &p.lost {
            for lane in 0..e.batch.lanes() {
                e.batch.fail_lane(lane, err);
            }
        }
        match &mut p.link {
            Link::Rdma { qps, .. } => rdma::post_slices(qps, &mut e.batch, id, p.lost.is_some()),
            Link::Tcp(t) if t.cma.is_some() => {
                let c = t.cma.as_mut().expect("a shared-memory link");
                for lane in 0..c.lanes() {
                    while p.lost.is_none() && c.has_room(lane) {
                        let Some(sl) = e.batch.take(lane) else { break };
                        let tag = WR_SLICE | u64::from(id) << 32 | sl.id as u64;
                        let job = shm_job(local, &p.remote, tag, &sl);
                        if let Err(err) = job.and_then(|j| c.post(lane, j)) {
                            e.batch.complete(sl.id, Err(err));
                        }
                    }
                }
            }
            Link::Tcp(t) => {
                for (lane, l) in t.lanes.iter_mut().enumerate() {
                    while p.lost.is_none() && l.in_flight < tcp::DEPTH {
                        let Some(sl) = e.batch.take(lane) else { break };
                        let tag = WR_SLICE | u64::from(id) << 32 | sl.id as u64;
                        match l.post_slice(tag, &sl, local) {
                            Ok(()) => l.in_flight += 1,
                            Err(err) => e.batch.complete(sl.id, Err(err)),
                        }
                    }
                }
            }
            Link::Gone(_) => {}
        }
        if !e.notified && e.batch.is_finished() {
            if let Some(n) = e.batch.take_notification() {
                let seq = p.outbox.next_seq();
                if let Err(err) = send_msg(p, e.peer, &Msg::Notify { seq, payload: n }) {
                    // Its data is in place; the peer is not told: its queue is full, and the
                    // peer is cut off (it does not take what it is sent).
                    p.lost.get_or_insert(err);
                }
            }
            e.notified = true;
        }
    }
    for (i, p) in peers.iter_mut().enumerate() {
        if let Err(err) = send_queued(p, i) {
            p.lost.get_or_insert(err);
        }
    }
    release_lost(peers);
}

/// Releases what lost peers held (their batches' slices have failed by now): the queue
/// pair before the buffers its work requests named, or the connections; what was queued
/// for them; what they published. Completions that still come for them find nothing.
fn release_lost(peers: &mut [Peer]) {
    for p in peers.iter_mut() {
        if p.lost.is_none() || matches!(p.link, Link::Gone(_)) {
            continue;
        }
        if let Link::Tcp(t) = &p.link {
            t.close();
        }
        let was = p.link.kind();
        drop(std::mem::replace(&mut p.link, Link::Gone(was)));
        p.queued = VecDeque::new();
        p.remote = SegmentTable::new();
    }
}

/// One slice as a copy for a shared-memory peer: its local range resolved to the
/// registration (held while the copy runs), its remote range checked against what the peer
/// publishes now (a revoked segment takes no new copies).
fn shm_job(
    local: &Local,
    remote: &SegmentTable,
    tag: u64,
    sl: &crate::batch::Slice,
) -> Result<cma::Job> {
    let len = sl.len as usize;
    let (mr, off) = tcp::region(local, sl.local_key, false, sl.local_addr, len)
        .ok_or_else(|| XferError::Transport("the local segment is gone".into()))?;
    let end = sl.remote_addr.checked_add(u64::from(sl.len));
    let inside = remote.iter().any(|seg| {
        seg.buffers.iter().any(|b| {
            b.key == sl.remote_key
                && b.addr <= sl.remote_addr
                && end.is_some_and(|e| b.addr.checked_add(b.len).is_some_and(|be| e <= be))
        })
    });
    if !inside {
        return Err(XferError::Transport(
            "remote access error: the peer no longer publishes the range".into(),
        ));
    }
    Ok(cma::Job::Slice {
        tag,
        op: sl.op,
        local: mr.clone(),
        local_off: off,
        remote: sl.remote_addr,
        len,
    })
}

/// Slice `tag` (a batch and slice number, and on RDMA its lane, as posted) ended with
/// `result` on peer `i`; true when that ended its batch (whose waiter is then woken: the
/// other slices' ends wake nobody).
fn end_slice(st: &mut State, i: usize, tag: u64, result: Result<()>) -> bool {
    let id = ((tag >> 32) & 0x00ff_ffff) as u32;
    let slice = (tag & 0x00ff_ffff) as usize;
    match st.batches.get_mut(&id) {
        Some(e) if e.peer == i => {
            e.batch.complete(slice, result);
            e.batch.is_finished()
        }
        _ => false,
    }
}

fn wait<'a>(s: &'a Shared, st: MutexGuard<'a, State>, left: Duration) -> MutexGuard<'a, State> {
    s.changed
        .wait_timeout(st, left.min(Duration::from_millis(100)))
        .unwrap_or_else(PoisonError::into_inner)
        .0
}

/// Keeps the registry lease `id` alive (a third of its time-to-live apart) until the agent
/// stops.
fn keep_lease(s: &Shared, r: &Registry, id: i64) {
    let every = (r.ttl / 3).max(Duration::from_millis(500));
    let mut next = Instant::now() + every;
    while !s.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        if Instant::now() < next {
            continue;
        }
        if let Err(e) = r.keep_alive(id) {
            tracing::warn!(target: "monel::xfer", "{}: registry lease: {e}", s.name);
        }
        next = Instant::now() + every;
    }
}

/// Handshakes under way at most (each on a thread of its own); more connections wait.
const MAX_HANDSHAKES: usize = 16;

fn accept_loop(s: &Arc<Shared>, listener: TcpListener) {
    // Each connection's first bytes (which link it opens) are read on a thread of their
    // own: a silent or slow client holds up nobody.
    let Ok(mut greeter) = Greeter::new(
        listener,
        |c: &mut TcpStream| {
            let mut open = [0u8; 8];
            std::io::Read::read_exact(c, &mut open).map(|()| open)
        },
        s.cfg.timeout,
        "xfer",
    ) else {
        return;
    };
    let busy = Arc::new(AtomicUsize::new(0));
    while !s.stop.load(Ordering::Acquire) {
        let Ok(Some((c, from, open))) = greeter.next(Duration::from_millis(100)) else {
            continue;
        };
        if busy.load(Ordering::Acquire) >= MAX_HANDSHAKES {
            greeter.drop_one(from, &"too many handshakes under way");
            continue;
        }
        busy.fetch_add(1, Ordering::AcqRel);
        let (s2, busy2) = (s.clone(), busy.clone());
        let spawned = std::thread::Builder::new()
            .name("xfer-handshake".into())
            .spawn(move || {
                if let Err(e) = take_peer(&s2, c, &open) {
                    tracing::warn!(target: "monel::xfer", "{}: a peer from {from} refused: {e}", s2.name);
                }
                s2.changed.notify_all();
                busy2.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The server's side of a new connection whose first bytes were `open`.
fn take_peer(s: &Arc<Shared>, c: TcpStream, open: &[u8; 8]) -> Result<usize> {
    let t = s.cfg.transport;
    let wanted = match t {
        Transport::Auto => true,
        Transport::Rdma => {
            open == crate::stream::OPEN_RDMA || open == crate::stream::OPEN_RDMA_LANE
        }
        Transport::Tcp => open == crate::stream::OPEN_TCP,
        Transport::Shm => open == crate::stream::OPEN_SHM,
    };
    if !wanted {
        return Err(XferError::Transport(format!(
            "this agent takes {t:?} links only"
        )));
    }
    if open == crate::stream::OPEN_RDMA {
        rdma::accept(s, c)
    } else if open == crate::stream::OPEN_RDMA_LANE {
        rdma::accept_lane(s, c)
    } else if open == crate::stream::OPEN_TCP {
        let (c, token, lane) = tcp::accept(c, s.cfg.secret.as_deref(), s.cfg.timeout)?;
        if lane == 0 {
            tcp::add_peer(s, c, token, None)
        } else {
            tcp::add_lane(s, c, token, lane)
        }
    } else if open == crate::stream::OPEN_SHM {
        let (mut c, token, lane) = tcp::accept(c, s.cfg.secret.as_deref(), s.cfg.timeout)?;
        if lane != 0 {
            return Err(XferError::BadMessage(
                "a second lane for a shared-memory peer".into(),
            ));
        }
        let found = cma::server(&mut c, &token, s.cfg.timeout)?;
        tcp::add_peer(s, c, token, Some(found))
    } else {
        Err(XferError::BadMessage(
            "not a transfer agent's connection".into(),
        ))
    }
}

fn apply(st: &mut State, i: usize, m: Msg) -> Result<()> {
    match m {
        Msg::Hello(name) => {
            if st.peers[i].name.is_some() {
                return Err(XferError::BadMessage("a second introduction".into()));
            }
            // A peer that comes back under its name replaces the old one.
            for (k, p) in st.peers.iter_mut().enumerate() {
                if k != i && p.name.as_deref() == Some(&name) && p.lost.is_none() {
                    p.lost = Some(XferError::PeerLost(format!("{name} connected again")));
                }
            }
            st.inbox.forget(&name);
            st.peers[i].name = Some(name);
        }
        Msg::Segments(segs) => {
            st.peers[i].remote = SegmentTable::from_segments(segs)?;
            st.peers[i].published = true;
        }
        Msg::Revoke(name) => {
            st.peers[i].remote.remove(&name)?;
            // Over shared memory, the peer keeps the memory until our copies queued so far
            // are done: the copying thread says so after them.
            if let Link::Tcp(t) = &st.peers[i].link {
                if let Some(c) = &t.cma {
                    c.revoked(&name)?;
                }
            }
        }
        Msg::Revoked(name) => {
            if let Some(waiting) = st.revoking.get_mut(&name) {
                waiting.retain(|&k| k != i);
            }
        }
        Msg::Lanes(t) => match &mut st.peers[i].link {
            Link::Rdma {
                token: token @ None,
                ..
            } => *token = Some(t),
            _ => {
                return Err(XferError::BadMessage(
                    "a lane token twice, or off RDMA".into(),
                ));
            }
        },
        Msg::Notify { seq, payload } => {
            let from = st.peers[i].name.clone().ok_or_else(|| {
                XferError::BadMessage("a notification before the introduction".into())
            })?;
            // A repeated or unreadable notification is refused alone: the peer goes on.
            if let Err(e) = st.inbox.accept(&from, seq, payload) {
                st.refused.push(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VmFlags line of the mapping of this process that holds `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside && line.starts_with("VmFlags:") {
                return line.to_string();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn owned_segments_are_advised_onto_huge_pages_where_the_kernel_has_them() {
        let v = huge_zeroed(8 << 20);
        assert!(v.iter().all(|&b| b == 0));
        let inner = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
        let flags = vm_flags(inner);
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            assert!(flags.contains(" hg"), "{flags}");
        } else {
            assert!(!flags.contains(" hg"), "{flags}");
        }
        // Too small for a whole huge page: no advice, nothing else changes.
        let small = huge_zeroed(4096);
        assert_eq!(small.len(), 4096);
    }
}
