//! The agent: the engine's I/O edge over Monel's verbs (the soft RNIC, or a kernel RDMA
//! device through rdma-core). Each peer is one RC queue pair, set up by Monel's connection
//! manager (both sides prove the job secret, and the queue pair's packets are then
//! protected with keys from it); the agents' messages (names, segment tables,
//! notifications) go as SENDs on that queue pair, so they are as protected as the data;
//! READs and WRITEs go straight between registered segments.
//!
//! Two threads per agent: one accepts peers, one drives completions (it decodes messages,
//! ends slices, posts what waits, wakes waiters). A peer whose queue pair fails is lost:
//! its batches' slices fail with [`XferError::PeerLost`], nothing else is touched.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use monel_verbs::cm::{self, CmConfig, Listener};
use monel_verbs::protect::PacketAuth;
use monel_verbs::{
    AccessFlags, CompletionQueue, ConnectParams, Context, ContextConfig, Device, MemoryRegion, Mtu,
    ProtectionDomain, QpCap, QpInitAttr, QpType, QueuePair, RKey, RecvWr, RemoteAddr, SendFlags,
    SendOp, SendWr, VerbsError, WcOpcode, WcStatus,
};

use crate::batch::{Batch, Desc, DescState, Plan};
use crate::error::{Result, XferError};
use crate::notify::{Inbox, Notification, Outbox};
use crate::segment::{Buffer, Segment, SegmentTable};
use crate::wire::Msg;

/// Largest message between agents on the wire (a segment table of about 6,000 buffers, or
/// a 64 KiB notification).
const MSG_MAX: usize = 128 << 10;
/// Receive slots per peer for its messages, and send slots for ours.
const RX_SLOTS: usize = 16;
const TX_SLOTS: usize = 16;
/// Messages queued for one peer beyond its send slots (notifications of batches that
/// finished faster than the peer takes them).
const MAX_QUEUED: usize = 4096;
/// Work requests each peer's queue pair holds.
const SQ_DEPTH: u32 = 256;
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
const WR_MSG_TX: u64 = 2 << 56;
const WR_MSG_RX: u64 = 3 << 56;

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

struct Peer {
    name: Option<String>,
    qp: QueuePair,
    remote: SegmentTable,
    rx: MemoryRegion,
    tx: MemoryRegion,
    tx_free: Vec<usize>,
    /// Messages waiting for a send slot, in order.
    queued: VecDeque<Vec<u8>>,
    outbox: Outbox,
    /// Slices posted and not yet ended.
    in_flight: u32,
    /// Its segment table arrived.
    published: bool,
    lost: Option<XferError>,
}

/// This agent's segments: the table (with local keys) and each one's registration.
struct Local {
    table: SegmentTable,
    mrs: HashMap<String, MemoryRegion>,
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
}

fn verbs(e: VerbsError) -> XferError {
    XferError::Transport(e.to_string())
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
        let listener = Listener::bind(cfg.listen).map_err(verbs)?;
        let addr = listener.local_addr().map_err(verbs)?;
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
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            _ctx: ctx,
        });
        let s1 = shared.clone();
        let s2 = shared.clone();
        let threads = vec![
            std::thread::Builder::new()
                .name(format!("xfer-accept-{}", shared.name))
                .spawn(move || accept_loop(&s1, &listener))
                .map_err(|e| XferError::Transport(e.to_string()))?,
            std::thread::Builder::new()
                .name(format!("xfer-progress-{}", shared.name))
                .spawn(move || progress_loop(&s2))
                .map_err(|e| XferError::Transport(e.to_string()))?,
        ];
        Ok(Self {
            shared,
            addr,
            threads,
        })
    }

    /// This agent's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Where peers connect.
    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// Registers a segment of `len` zeroed bytes (one buffer) and publishes it to every
    /// peer.
    pub fn register(&self, name: &str, len: usize) -> Result<()> {
        let mut st = self.shared.state();
        if st.local.table.get(name).is_ok() {
            return Err(XferError::Duplicate(name.to_string()));
        }
        let mr = self
            .shared
            .pd
            .reg_mr(vec![0u8; len], SEGMENT_ACCESS)
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

    /// Withdraws a segment: peers are told, and its memory is deregistered at once
    /// (transfers still using it fail).
    pub fn deregister(&self, name: &str) -> Result<()> {
        let mut st = self.shared.state();
        st.local.table.remove(name)?;
        st.local.mrs.remove(name);
        broadcast(&mut st, &Msg::Revoke(name.to_string()));
        Ok(())
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

    /// Connects to the agent listening at `addr`; returns its name once its segment table
    /// has arrived.
    pub fn connect(&self, addr: SocketAddr) -> Result<String> {
        let qp = new_qp(&self.shared)?;
        cm::connect(addr, &qp, None, &cm_config(&self.shared.cfg)).map_err(verbs)?;
        let i = add_peer(&self.shared, qp)?;
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
                return Err(XferError::PeerLost(format!(
                    "{addr} connected but did not introduce itself within {:?}",
                    self.shared.cfg.timeout
                )));
            }
            st = wait(&self.shared, st, left);
        }
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
        let batch = Batch::plan(
            descs,
            &st.local.table,
            &st.peers[i].remote,
            Plan {
                lanes: 1,
                ..self.shared.cfg.plan
            },
            notification,
        )?;
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

    /// What peers sent that was refused without cutting them off (a repeated notification,
    /// a full inbox), oldest first.
    pub fn refused(&self) -> Vec<XferError> {
        std::mem::take(&mut self.shared.state().refused)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn cm_config(cfg: &AgentConfig) -> CmConfig {
    CmConfig {
        secret: cfg.secret.clone(),
        mtu: Mtu::Mtu4096,
        // RoCE v2 over IPv4 where the port has it (a kernel device's GID 0 is RoCE v1).
        gid_index: cfg.device.ipv4_gid_index().unwrap_or(0),
        timeout: cfg.timeout,
        params: ConnectParams {
            // A peer that is gone ends in about a second, not never.
            retry_cnt: 5,
            ..ConnectParams::default()
        },
        auth: cfg.auth,
    }
}

fn new_qp(s: &Shared) -> Result<QueuePair> {
    s.pd.create_qp(&QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        cap: QpCap {
            max_send_wr: SQ_DEPTH + TX_SLOTS as u32,
            max_recv_wr: RX_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })
    .map_err(verbs)
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
    st.local.mrs.insert(name.to_string(), mr);
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

/// Takes a connected queue pair in as a peer: posts its receives, introduces this agent and
/// publishes its segments.
fn add_peer(s: &Shared, qp: QueuePair) -> Result<usize> {
    let rx =
        s.pd.reg_mr(vec![0u8; RX_SLOTS * MSG_MAX], AccessFlags::LOCAL_WRITE)
            .map_err(verbs)?;
    let tx =
        s.pd.reg_mr(vec![0u8; TX_SLOTS * MSG_MAX], AccessFlags::LOCAL_WRITE)
            .map_err(verbs)?;
    let mut st = s.state();
    let i = st.peers.len();
    if i >= 1 << 16 || st.peers.iter().filter(|p| p.lost.is_none()).count() >= MAX_PEERS {
        return Err(XferError::TooLarge(format!(
            "more than {MAX_PEERS} live peers on one agent"
        )));
    }
    for slot in 0..RX_SLOTS {
        qp.post_recv(RecvWr {
            wr_id: WR_MSG_RX | (i as u64) << 16 | slot as u64,
            sg_list: vec![rx.sge(slot * MSG_MAX, MSG_MAX)],
        })
        .map_err(verbs)?;
    }
    st.peers.push(Peer {
        name: None,
        qp,
        remote: SegmentTable::new(),
        rx,
        tx,
        tx_free: (0..TX_SLOTS).collect(),
        queued: VecDeque::new(),
        outbox: Outbox::default(),
        in_flight: 0,
        published: false,
        lost: None,
    });
    let hello = Msg::Hello(s.name.clone());
    let table = Msg::Segments(st.local.published());
    let p = &mut st.peers[i];
    send_msg(p, i, &hello)?;
    send_msg(p, i, &table)?;
    Ok(i)
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

/// Sends queued messages to peer `i` while it has free send slots.
fn send_queued(p: &mut Peer, i: usize) -> Result<()> {
    while p.lost.is_none() && !p.queued.is_empty() {
        let Some(slot) = p.tx_free.pop() else {
            return Ok(());
        };
        let bytes = p.queued.pop_front().expect("not empty");
        p.tx.write(slot * MSG_MAX, &bytes).map_err(verbs)?;
        p.qp.post_send(SendWr {
            wr_id: WR_MSG_TX | (i as u64) << 16 | slot as u64,
            op: SendOp::Send,
            sg_list: vec![p.tx.sge(slot * MSG_MAX, bytes.len())],
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        })
        .map_err(verbs)?;
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
    let State { peers, batches, .. } = st;
    for (&id, e) in batches.iter_mut() {
        let p = &mut peers[e.peer];
        if let Some(err) = &p.lost {
            e.batch.fail_lane(0, err);
        }
        while p.lost.is_none() && p.in_flight < SQ_DEPTH {
            let Some(sl) = e.batch.take(0) else { break };
            let remote = RemoteAddr {
                addr: sl.remote_addr,
                rkey: RKey(sl.remote_key),
            };
            let op = match sl.op {
                crate::batch::Op::Write => SendOp::Write(remote),
                crate::batch::Op::Read => SendOp::Read(remote),
            };
            let wr = SendWr {
                wr_id: WR_SLICE | u64::from(id) << 32 | sl.id as u64,
                op,
                sg_list: vec![monel_verbs::Sge {
                    addr: sl.local_addr,
                    length: sl.len,
                    lkey: monel_verbs::LKey(sl.local_key),
                }],
                flags: SendFlags {
                    signaled: true,
                    ..SendFlags::default()
                },
            };
            match p.qp.post_send(wr) {
                Ok(()) => p.in_flight += 1,
                Err(err) => e.batch.complete(sl.id, Err(verbs(err))),
            }
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
}

fn wait<'a>(s: &'a Shared, st: MutexGuard<'a, State>, left: Duration) -> MutexGuard<'a, State> {
    s.changed
        .wait_timeout(st, left.min(Duration::from_millis(100)))
        .unwrap_or_else(PoisonError::into_inner)
        .0
}

fn accept_loop(s: &Arc<Shared>, listener: &Listener) {
    // One server for the agent's life: a client still in its handshake when a wait ends
    // is finished by the next, not closed.
    let mut server = loop {
        match listener.server(&cm_config(&s.cfg)) {
            Ok(server) => break server,
            Err(_) if !s.stop.load(Ordering::Acquire) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(_) => return,
        }
    };
    // The queue pair the next client gets (kept while none comes).
    let mut spare = None;
    while !s.stop.load(Ordering::Acquire) {
        let qp = match spare.take() {
            Some(q) => q,
            None => match new_qp(s) {
                Ok(q) => q,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            },
        };
        // A bad or silent client costs this one attempt; the listener goes on.
        let served = server.serve(&qp, None, Some(Duration::from_millis(200)));
        match served {
            Ok(_) => {
                let _ = add_peer(s, qp);
                s.changed.notify_all();
            }
            Err(_) => spare = Some(qp),
        }
    }
}

fn progress_loop(s: &Arc<Shared>) {
    let mut wcs = Vec::new();
    while !s.stop.load(Ordering::Acquire) {
        wcs.clear();
        if s.cq.poll_into(64, &mut wcs) == 0 {
            s.cq.wait(Duration::from_millis(20));
            continue;
        }
        let mut st = s.state();
        for wc in &wcs {
            handle(&mut st, wc);
        }
        pump(&mut st);
        drop(st);
        s.changed.notify_all();
    }
}

fn handle(st: &mut State, wc: &monel_verbs::WorkCompletion) {
    let kind = wc.wr_id & (0xff << 56);
    let ok = wc.status == WcStatus::Success;
    match kind {
        WR_SLICE => {
            let id = ((wc.wr_id >> 32) & 0x00ff_ffff) as u32;
            let slice = (wc.wr_id & 0xffff_ffff) as usize;
            if let Some(e) = st.batches.get_mut(&id) {
                let p = &mut st.peers[e.peer];
                p.in_flight = p.in_flight.saturating_sub(1);
                if ok {
                    e.batch.complete(slice, Ok(()));
                } else {
                    let err = lost(p, wc.status);
                    e.batch.complete(slice, Err(err));
                }
            }
        }
        WR_MSG_TX => {
            let (i, slot) = (
                ((wc.wr_id >> 16) & 0xffff) as usize,
                (wc.wr_id & 0xffff) as usize,
            );
            if let Some(p) = st.peers.get_mut(i) {
                p.tx_free.push(slot);
                if !ok {
                    lost(p, wc.status);
                }
            }
        }
        WR_MSG_RX => {
            let (i, slot) = (
                ((wc.wr_id >> 16) & 0xffff) as usize,
                (wc.wr_id & 0xffff) as usize,
            );
            if i >= st.peers.len() {
                return;
            }
            if !ok || wc.opcode != WcOpcode::Recv {
                lost(&mut st.peers[i], wc.status);
                return;
            }
            let len = (wc.byte_len as usize).min(MSG_MAX);
            let mut bytes = vec![0u8; len];
            let _ = st.peers[i].rx.read(slot * MSG_MAX, &mut bytes);
            let taken = Msg::decode(&bytes).and_then(|m| apply(st, i, m));
            let p = &mut st.peers[i];
            if let Err(e) = taken {
                // A peer that breaks the protocol is cut off; the others go on.
                p.lost = Some(e);
                return;
            }
            let _ = p.qp.post_recv(RecvWr {
                wr_id: wc.wr_id,
                sg_list: vec![p.rx.sge(slot * MSG_MAX, MSG_MAX)],
            });
        }
        _ => {}
    }
}

fn lost(p: &mut Peer, status: WcStatus) -> XferError {
    let e = XferError::PeerLost(format!(
        "{}: {status:?}",
        p.name.as_deref().unwrap_or("a peer")
    ));
    p.lost.get_or_insert(e).clone()
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
        }
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
