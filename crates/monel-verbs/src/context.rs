//! The verbs objects: [`Context`], [`ProtectionDomain`], [`QueuePair`], and the device state
//! they share with the progress engine.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use monel_rc::congestion::CongestionConfig;
use monel_rc::{
    AccessFlags, AddressVector, AttrMask, Mtu, QpAttr, QpCaps, QpEvent, QpState, QpStats, RcQp,
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdQp,
};
use monel_wire::{LKey, Psn, Qpn};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::counters::DeviceCounters;
use crate::cq::{CompletionQueue, CqShared};
use crate::device::{Device, Gid, is_link_local};
use crate::error::{ErrorKind, Result, VerbsError};
use crate::idmap::IdMap;
use crate::mr::{Backing, MemoryRegion, MrShared, MrTable, random_key};
use crate::netio::Sockets;
use crate::qp_kind::QpKind;
use crate::srq::{SharedReceiveQueue, SrqState};

/// Device limits (`ibv_device_attr`, the part Monel enforces).
pub mod limits {
    /// Most work requests per queue.
    pub const MAX_QP_WR: u32 = 16384;
    /// Most SGEs per work request.
    pub const MAX_SGE: u32 = 32;
    /// Most completions per CQ.
    pub const MAX_CQE: usize = 1 << 20;
    /// Most inline bytes per send.
    pub const MAX_INLINE_DATA: u32 = 512;
    /// Most outstanding READ/atomic requests per QP.
    pub const MAX_QP_RD_ATOM: u8 = 16;
    /// Most QPs per device.
    pub const MAX_QP: usize = 1 << 16;
}

/// How a context runs its soft RNIC.
#[derive(Debug, Clone)]
pub struct ContextConfig {
    /// UDP port to bind and to send to (RoCEv2: 4791).
    pub udp_port: u16,
    /// Threads waiting on a CQ spin on the sockets instead of sleeping (lower latency, one
    /// core spinning per waiting thread; the progress thread still sleeps between timers).
    pub busy_poll: bool,
    /// DSCP for outgoing packets.
    pub dscp: u8,
    /// Mark outgoing packets ECN-capable (ECT(0)) so switches can mark CE for DCQCN.
    pub ecn: bool,
    /// Congestion control for new QPs.
    pub congestion: CongestionConfig,
    /// Datagrams per recvmmsg batch; a send batch holds four times as many packets (a
    /// sendmmsg carries several GSO messages of up to 15 4 KiB packets each).
    pub batch: usize,
    /// UDP segmentation offload: a run of equal-size packets to one peer leaves as one GSO
    /// message, each segment's ICRC computed for the IPv4 ID the kernel will give it; and
    /// UDP GRO on receive. Falls back to plain datagrams if the kernel refuses.
    pub gso: bool,
    /// Send-only UDP sockets per GID, on ports the kernel picks; each QP sends from one of
    /// them, chosen by its QPN, so ECMP switches hashing the 5-tuple spread QPs over paths
    /// (RoCE NICs and rxe give each QP its own source port). 0: every packet leaves from
    /// `udp_port`. Receiving is always on `udp_port`. At most 256.
    pub source_ports: usize,
    /// Zero-copy sends: request payloads of at least 512 bytes go from the registered
    /// region straight into the send system call (an iovec per piece), not through a
    /// packet buffer. The region's lock is held while the batch is sent.
    pub zero_copy: bool,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            udp_port: monel_wire::ROCE_V2_UDP_PORT,
            busy_poll: false,
            dscp: 26,
            ecn: true,
            congestion: CongestionConfig::None,
            batch: 32,
            gso: true,
            source_ports: 8,
            zero_copy: true,
        }
    }
}

impl ContextConfig {
    /// The IP traffic class byte sent: DSCP << 2 | ECN.
    pub fn traffic_class(&self) -> u8 {
        (self.dscp << 2) | if self.ecn { 0b10 } else { 0 }
    }
}

/// Asynchronous events (`ibv_async_event`).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// First packet on a QP in RTR (`IBV_EVENT_COMM_EST`).
    CommEstablished(Qpn),
    /// A QP in SQD drained (`IBV_EVENT_SQ_DRAINED`).
    SqDrained(Qpn),
    /// A QP went to ERR (`IBV_EVENT_QP_FATAL`).
    QpFatal(Qpn),
    /// A CQ overflowed and lost a completion (`IBV_EVENT_CQ_ERR`).
    CqError(u32),
    /// An SRQ fell below its armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit is now
    /// disarmed.
    SrqLimitReached(u32),
}

/// Queue pair transport (`ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connection.
    Rc,
    /// Unreliable datagram: one-packet SENDs to any QP with the Q_Key, each with its own
    /// address handle ([`QueuePair::post_send_ud`]).
    Ud,
}

/// Queue sizes (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send.
    pub max_send_sge: u32,
    /// SGEs per receive.
    pub max_recv_sge: u32,
    /// Inline bytes per send.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        Self {
            max_send_wr: 128,
            max_recv_wr: 512,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// What `create_qp` needs (`ibv_qp_init_attr`).
#[derive(Debug, Clone)]
pub struct QpInitAttr<'a> {
    /// Where send completions go.
    pub send_cq: &'a CompletionQueue,
    /// Where receive completions go.
    pub recv_cq: &'a CompletionQueue,
    /// Sizes.
    pub cap: QpCap,
    /// Transport.
    pub qp_type: QpType,
    /// Every send generates a completion, whatever its flags.
    pub sq_sig_all: bool,
    /// Take receives from this shared receive queue (RC only; same PD) instead of the QP's own.
    pub srq: Option<&'a SharedReceiveQueue>,
}

/// One QP as the device holds it.
#[derive(Debug)]
pub(crate) struct QpSlot {
    pub(crate) qp: QpKind,
    pub(crate) pd: u32,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub(crate) sq_sig_all: bool,
    /// The SRQ this QP draws receives from.
    pub(crate) srq: Option<u32>,
    /// Socket index and address of the peer, set at RTR.
    pub(crate) peer: Option<(usize, SocketAddr)>,
    pub(crate) inline: Option<(Arc<MrShared>, u32)>,
    pub(crate) inline_next: u32,
}

/// Device state shared by the API and the progress engine. Lock order: `core`, then `mrs`.
#[derive(Debug, Default)]
pub(crate) struct Core {
    pub(crate) qps: IdMap<QpSlot>,
    pub(crate) events: VecDeque<AsyncEvent>,
    pub(crate) counters: DeviceCounters,
    /// Stats of destroyed QPs, so device totals never go backwards.
    pub(crate) retired: QpStats,
    /// QPs that received packets since an application thread last serviced them.
    pub(crate) dirty: Vec<u32>,
    /// QPs whose transmissions (ACKs, mostly) an application thread deferred, so they can
    /// leave with its next post in one batch.
    pub(crate) pending_tx: Vec<u32>,
    /// A spare QP list for the engine's passes (no allocation per pass).
    pub(crate) scratch: Vec<u32>,
    /// When the progress thread next wakes on its own (`None`: only when rung).
    pub(crate) engine_wake_at: Option<monel_rc::Instant>,
    /// Shared receive queues by handle.
    pub(crate) srqs: IdMap<SrqState>,
    next_id: u32,
}

impl Core {
    /// A handle number not used before on this device.
    pub(crate) fn fresh_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }
}

#[derive(Debug)]
pub(crate) struct DevShared {
    pub(crate) device: Device,
    pub(crate) config: ContextConfig,
    pub(crate) core: Mutex<Core>,
    pub(crate) mrs: Arc<Mutex<MrTable>>,
    pub(crate) sockets: Sockets,
    pub(crate) doorbell: EventFd,
    pub(crate) stop: AtomicBool,
    pub(crate) epoch: std::time::Instant,
    /// Application threads waiting on a CQ (and so driving the sockets).
    pub(crate) callers: std::sync::atomic::AtomicUsize,
    /// Held while a thread reads the sockets and delivers what it read, so two threads
    /// never deliver one socket's datagrams out of order.
    pub(crate) rx_lock: Mutex<()>,
    /// When an application thread last polled a CQ (ns since `epoch`; 0 once it armed a
    /// completion channel to sleep on).
    pub(crate) last_poll_ns: std::sync::atomic::AtomicU64,
    /// The progress thread is watching the sockets in its sleep (it leaves them to threads
    /// that poll or wait on a CQ).
    pub(crate) engine_watches: AtomicBool,
}

impl DevShared {
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// Where packets with address vector `av` go: the socket of its source GID and the
    /// destination's UDP address. Errors name `verb`.
    pub(crate) fn resolve_av(
        &self,
        verb: &'static str,
        av: &AddressVector,
    ) -> Result<(usize, SocketAddr)> {
        let dev = &self.device;
        let sgid = dev.gid(av.sgid_index).map_err(|_| {
            VerbsError::invalid(
                verb,
                format!(
                    "ah_attr.grh.sgid_index {} not in the GID table",
                    av.sgid_index
                ),
            )
        })?;
        let dgid = Gid(av.dgid);
        let (sip, dip) = (sgid.gid.to_ip(), dgid.to_ip());
        if sip.is_ipv4() != dip.is_ipv4() {
            return Err(VerbsError::invalid(
                verb,
                format!(
                    "ah_attr.grh.dgid {dgid} and sgid {} differ in IP family",
                    sgid.gid
                ),
            ));
        }
        if !dgid.is_global() {
            return Err(VerbsError::invalid(
                verb,
                "ah_attr.grh.dgid has a zero interface ID",
            ));
        }
        let mut dst = SocketAddr::new(dip, self.config.udp_port);
        if let SocketAddr::V6(s6) = &mut dst {
            if is_link_local(&dip) {
                s6.set_scope_id(sgid.ifindex);
            }
        }
        Ok((usize::from(av.sgid_index), dst))
    }

    pub(crate) fn ring(&self) {
        let _ = self.doorbell.write(1);
    }
}

/// An open device (`ibv_context`): its sockets and its progress thread.
#[derive(Debug)]
pub struct Context {
    shared: Arc<DevShared>,
    thread: Option<JoinHandle<()>>,
}

impl Context {
    /// Opens `device` (`ibv_open_device`): binds a UDP socket on every GID's address and starts
    /// the progress thread.
    pub fn open(device: &Device, config: ContextConfig) -> Result<Self> {
        if config.batch == 0 || config.batch > 1024 {
            return Err(VerbsError::invalid(
                "ibv_open_device",
                "batch must be 1..=1024",
            ));
        }
        let sockets = Sockets::bind(device, &config)?;
        let doorbell = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| VerbsError::io("ibv_open_device", e))?;
        let shared = Arc::new(DevShared {
            device: device.clone(),
            config,
            core: Mutex::new(Core::default()),
            mrs: Arc::new(Mutex::new(MrTable::default())),
            sockets,
            doorbell,
            stop: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            callers: Default::default(),
            rx_lock: Mutex::new(()),
            last_poll_ns: Default::default(),
            engine_watches: AtomicBool::new(true),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("monel-{}", device.name))
            .spawn(move || crate::engine::run(&s2))
            .map_err(|e| VerbsError::io("ibv_open_device", e))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }
    /// The configuration.
    pub fn config(&self) -> &ContextConfig {
        &self.shared.config
    }
    /// The UDP address bound for GID `index`.
    pub fn local_addr(&self, gid_index: u8) -> Result<SocketAddr> {
        self.shared.sockets.local_addr(usize::from(gid_index))
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let mut core = self.shared.core();
        core.next_id += 1;
        ProtectionDomain {
            shared: self.shared.clone(),
            id: core.next_id,
        }
    }

    /// Creates a completion queue with room for `cqe` completions (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: usize) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > limits::MAX_CQE {
            return Err(VerbsError::invalid(
                "ibv_create_cq",
                format!("cqe {cqe} not in 1..={}", limits::MAX_CQE),
            ));
        }
        let mut core = self.shared.core();
        core.next_id += 1;
        Ok(CompletionQueue {
            shared: Arc::new(CqShared::new(
                core.next_id,
                cqe,
                Arc::downgrade(&self.shared),
            )?),
        })
    }

    /// The next asynchronous event, if any (`ibv_get_async_event`).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.shared.core().events.pop_front()
    }

    /// Device counters, with the per-QP counters summed in (`rdma statistic`).
    pub fn counters(&self) -> DeviceCounters {
        let core = self.shared.core();
        let mut c = core.counters;
        let mut q = core.retired;
        for slot in core.qps.values() {
            q += slot.qp.stats();
        }
        c.qp = q;
        c.qps = core.qps.len() as u64;
        c.mrs = self
            .shared
            .mrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64;
        c
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.doorbell.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A protection domain (`ibv_pd`): regions and QPs of one PD see only each other.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) shared: Arc<DevShared>,
    pub(crate) id: u32,
}

fn check_access(verb: &'static str, access: AccessFlags) -> Result<()> {
    if access.0 & !AccessFlags::ALL.0 != 0 {
        return Err(VerbsError::invalid(
            verb,
            format!("unknown access bits {:#x}", access.0),
        ));
    }
    let remote_mod = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.0 & remote_mod.0 != 0 && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(VerbsError::invalid(
            verb,
            "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
        ));
    }
    Ok(())
}

impl ProtectionDomain {
    /// This PD's handle number.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Puts a region in the device's key table; it stays there until removed.
    fn insert_region(
        &self,
        addr: u64,
        len: u64,
        access: AccessFlags,
        backing: Backing,
    ) -> Arc<MrShared> {
        let mut t = self
            .shared
            .mrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (lkey, rkey) = t.fresh_keys();
        let mr = Arc::new(MrShared {
            pd: self.id,
            addr,
            len,
            access,
            lkey,
            rkey,
            backing,
        });
        t.insert(mr.clone());
        mr
    }

    /// A region handle that deregisters on drop.
    fn register(&self, addr: u64, len: u64, access: AccessFlags, backing: Backing) -> MemoryRegion {
        MemoryRegion {
            shared: self.insert_region(addr, len, access, backing),
            table: self.shared.mrs.clone(),
        }
    }

    /// Registers a buffer the region then owns (`ibv_reg_mr`). Its address is the buffer's.
    pub fn reg_mr(&self, buf: Vec<u8>, access: AccessFlags) -> Result<MemoryRegion> {
        check_access("ibv_reg_mr", access)?;
        let buf = buf.into_boxed_slice();
        let (addr, len) = (buf.as_ptr() as u64, buf.len() as u64);
        Ok(self.register(addr, len, access, Backing::Owned(Mutex::new(buf))))
    }

    /// Registers caller memory by address (`ibv_reg_mr` on a raw pointer).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be valid for reads and writes until the returned region is
    /// dropped, and must not be accessed by the caller while an RDMA operation on it may be in
    /// progress (the soft RNIC copies in and out of it from its progress thread, as a NIC
    /// DMAs). Drop the region before freeing the memory.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        check_access("ibv_reg_mr", access)?;
        if ptr.is_null() && len > 0 {
            return Err(VerbsError::invalid("ibv_reg_mr", "null address"));
        }
        let addr = ptr as usize;
        Ok(self.register(
            addr as u64,
            len as u64,
            access,
            Backing::Raw { ptr: addr, len },
        ))
    }

    /// Creates a queue pair in RESET (`ibv_create_qp`).
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        const V: &str = "ibv_create_qp";
        let c = init.cap;
        for (name, v, max) in [
            ("max_send_wr", c.max_send_wr, limits::MAX_QP_WR),
            ("max_recv_wr", c.max_recv_wr, limits::MAX_QP_WR),
            ("max_send_sge", c.max_send_sge, limits::MAX_SGE),
            ("max_recv_sge", c.max_recv_sge, limits::MAX_SGE),
            (
                "max_inline_data",
                c.max_inline_data,
                limits::MAX_INLINE_DATA,
            ),
        ] {
            if v > max || (v == 0 && !name.starts_with("max_inline")) {
                return Err(VerbsError::invalid(
                    V,
                    format!("cap.{name} = {v}, allowed 1..={max}"),
                ));
            }
        }
        let caps = QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_rd_atomic: limits::MAX_QP_RD_ATOM,
            ..QpCaps::default()
        };
        let mut core = self.shared.core();
        if let Some(srq) = init.srq {
            if init.qp_type != QpType::Rc {
                return Err(VerbsError::invalid(
                    V,
                    "init_attr.srq: SRQs serve RC QPs only",
                ));
            }
            if srq.pd != self.id || !core.srqs.contains_key(&srq.id) {
                return Err(VerbsError::invalid(
                    V,
                    "init_attr.srq belongs to another protection domain or device",
                ));
            }
        }
        if core.qps.len() >= limits::MAX_QP {
            return Err(VerbsError::new(
                V,
                ErrorKind::Busy("device has limits::MAX_QP QPs".into()),
            ));
        }
        // The inline bounce region belongs to the QP slot; QueuePair's drop removes its keys.
        let inline = (c.max_inline_data > 0).then(|| {
            let n = c.max_inline_data as usize * c.max_send_wr as usize;
            let buf = vec![0u8; n].into_boxed_slice();
            let (addr, len) = (buf.as_ptr() as u64, n as u64);
            let mr = self.insert_region(
                addr,
                len,
                AccessFlags::NONE,
                Backing::Owned(Mutex::new(buf)),
            );
            (mr, c.max_inline_data)
        });
        let qpn = random_key(|k| {
            let q = k & 0xff_ffff;
            q < 0x11 || q == 0xff_ffff || core.qps.contains_key(&q)
        }) & 0xff_ffff;
        let engine = match init.qp_type {
            QpType::Rc => QpKind::Rc(RcQp::new(
                Qpn::new(qpn),
                caps,
                self.shared.config.congestion,
            )),
            QpType::Ud => QpKind::Ud(UdQp::new(
                Qpn::new(qpn),
                caps,
                self.shared.device.port_attr().active_mtu.bytes(),
            )),
        };
        let slot = QpSlot {
            qp: engine,
            pd: self.id,
            send_cq: init.send_cq.shared.clone(),
            recv_cq: init.recv_cq.shared.clone(),
            sq_sig_all: init.sq_sig_all,
            srq: init.srq.map(|q| q.id),
            peer: None,
            inline,
            inline_next: 0,
        };
        if let Some(s) = slot.srq.and_then(|id| core.srqs.get_mut(&id)) {
            s.users += 1;
        }
        core.qps.insert(qpn, slot);
        Ok(QueuePair {
            shared: self.shared.clone(),
            qpn,
            cap: c,
        })
    }
}

/// What a peer tells about its QP for a connection (what the OOB exchange carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    /// The peer's QP number.
    pub qpn: Qpn,
    /// The PSN the peer starts sending with.
    pub psn: Psn,
    /// The peer's GID.
    pub gid: Gid,
}

/// Connection parameters for [`QueuePair::connect`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectParams {
    /// Local GID index.
    pub sgid_index: u8,
    /// PSN this side starts sending with.
    pub local_psn: Psn,
    /// Path MTU.
    pub mtu: Mtu,
    /// Remote access allowed to the peer.
    pub access: AccessFlags,
    /// ACK timeout exponent (14 = 67 ms, as the rdma-core tools).
    pub timeout: u8,
    /// Retry count (7 = forever, as rxe).
    pub retry_cnt: u8,
    /// RNR retry count (7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code for our NAKs (12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests each way.
    pub rd_atomic: u8,
    /// IP hop limit.
    pub hop_limit: u8,
    /// The peer's UDP port, when it is not this context's own (`ContextConfig::udp_port`,
    /// 4791 by default): a soft-RNIC extension for several processes sharing one address,
    /// each bound to its own port. Real RoCE peers always listen on 4791.
    pub udp_port: Option<u16>,
}

impl Default for ConnectParams {
    fn default() -> Self {
        Self {
            sgid_index: 0,
            local_psn: Psn::new(0),
            mtu: Mtu::Mtu1024,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 16,
            hop_limit: 64,
            udp_port: None,
        }
    }
}

/// A random 24-bit PSN for a new connection.
pub fn random_psn() -> Psn {
    Psn::new(random_key(|_| false) & 0xff_ffff)
}

/// A queue pair (`ibv_qp`).
#[derive(Debug)]
pub struct QueuePair {
    pub(crate) shared: Arc<DevShared>,
    pub(crate) qpn: u32,
    cap: QpCap,
}

impl QueuePair {
    /// The QP number.
    pub fn qp_num(&self) -> Qpn {
        Qpn::new(self.qpn)
    }
    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }
    /// The sizes it was created with.
    pub fn cap(&self) -> QpCap {
        self.cap
    }
    /// The UDP port its device listens on for GID `gid_index`.
    pub fn local_udp_port(&self, gid_index: u8) -> Result<u16> {
        Ok(self
            .shared
            .sockets
            .local_addr(usize::from(gid_index))?
            .port())
    }

    pub(crate) fn with_slot<R>(
        &self,
        verb: &'static str,
        f: impl FnOnce(&mut QpSlot) -> Result<R>,
    ) -> Result<R> {
        let mut core = self.shared.core();
        let slot = core.qps.get_mut(&self.qpn).ok_or_else(|| {
            VerbsError::new(verb, ErrorKind::NotFound(format!("QP {:#x}", self.qpn)))
        })?;
        f(slot)
    }

    /// Modifies attributes and state (`ibv_modify_qp`), with the verbs state table's
    /// required and allowed masks.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        const V: &str = "ibv_modify_qp";
        let peer = if mask.contains(AttrMask::AV) {
            Some(self.shared.resolve_av(V, &attr.ah_attr)?)
        } else {
            None
        };
        if mask.contains(AttrMask::PATH_MTU) && attr.path_mtu > Mtu::Mtu4096 {
            return Err(VerbsError::invalid(V, "path_mtu above the port's max_mtu"));
        }
        self.with_slot(V, |slot| {
            slot.qp
                .modify(attr, mask)
                .map_err(|e| VerbsError::new(V, ErrorKind::Modify(e)))?;
            if let Some(p) = peer {
                slot.peer = Some(p);
            }
            Ok(())
        })?;
        self.shared.ring();
        Ok(())
    }

    /// Current state and attributes (`ibv_query_qp`).
    pub fn query(&self) -> Result<(QpState, QpAttr)> {
        self.with_slot("ibv_query_qp", |s| Ok((s.qp.state(), s.qp.attr())))
    }

    /// RESET to INIT on port 1, P_Key index 0, with the remote `access` given.
    pub fn init(&self, access: AccessFlags) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
    }

    /// Brings the QP from RESET to RTS towards `remote` (INIT, RTR and RTS with the
    /// attributes rdma-core's pingpong uses, taken from `p`).
    pub fn connect(&self, remote: &RemoteQp, p: &ConnectParams) -> Result<()> {
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: p.access,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )?;
        attr.qp_state = QpState::Rtr;
        attr.path_mtu = p.mtu;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = p.rd_atomic;
        attr.min_rnr_timer = p.min_rnr_timer;
        attr.ah_attr.dgid = remote.gid.0;
        attr.ah_attr.sgid_index = p.sgid_index;
        attr.ah_attr.hop_limit = p.hop_limit;
        attr.ah_attr.traffic_class = self.shared.config.traffic_class();
        self.modify(
            &attr,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
        )?;
        if let Some(port) = p.udp_port {
            self.with_slot("ibv_modify_qp", |slot| {
                if let Some((_, peer)) = slot.peer.as_mut() {
                    peer.set_port(port);
                }
                Ok(())
            })?;
        }
        attr.qp_state = QpState::Rts;
        attr.timeout = p.timeout;
        attr.retry_cnt = p.retry_cnt;
        attr.rnr_retry = p.rnr_retry;
        attr.sq_psn = p.local_psn;
        attr.max_rd_atomic = p.rd_atomic;
        self.modify(
            &attr,
            AttrMask::STATE
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::SQ_PSN
                | AttrMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// Posts a send work request (`ibv_post_send`).
    pub fn post_send(&self, mut wr: SendWr) -> Result<()> {
        self.with_slot("ibv_post_send", |slot| {
            if slot.sq_sig_all {
                wr.flags.signaled = true;
            }
            slot.qp
                .rc("ibv_post_send")?
                .post_send(wr)
                .map_err(|e| VerbsError::new("ibv_post_send", ErrorKind::Post(e)))
        })?;
        crate::engine::kick(&self.shared, self.qpn);
        Ok(())
    }

    /// Posts a send whose data is copied at post time (`IBV_SEND_INLINE`): `data` may be
    /// reused as soon as this returns. At most `cap.max_inline_data` bytes; SEND and WRITE
    /// kinds only.
    pub fn post_send_inline(
        &self,
        wr_id: u64,
        op: SendOp,
        data: &[u8],
        flags: SendFlags,
    ) -> Result<()> {
        const V: &str = "ibv_post_send";
        if op.is_rd_atomic() {
            return Err(VerbsError::invalid(
                V,
                "IBV_SEND_INLINE on a READ or atomic",
            ));
        }
        self.with_slot(V, |slot| {
            let Some((mr, per)) = slot.inline.clone() else {
                return Err(VerbsError::invalid(V, "QP created with max_inline_data 0"));
            };
            if data.len() > per as usize {
                return Err(VerbsError::invalid(
                    V,
                    format!("{} inline bytes, max_inline_data is {per}", data.len()),
                ));
            }
            if slot.qp.outstanding_sends() >= self.cap.max_send_wr as usize {
                return Err(VerbsError::new(
                    V,
                    ErrorKind::Post(monel_rc::PostError::QueueFull),
                ));
            }
            // One slot per send-queue entry: a slot is reused only after the queue wrapped,
            // by which time the WQE that used it has left the queue.
            let idx = slot.inline_next % self.cap.max_send_wr;
            let off = idx as usize * per as usize;
            mr.with(|b| b[off..off + data.len()].copy_from_slice(data));
            let mut flags = flags;
            if slot.sq_sig_all {
                flags.signaled = true;
            }
            let wr = SendWr {
                wr_id,
                op,
                sg_list: if data.is_empty() {
                    vec![]
                } else {
                    vec![Sge {
                        addr: mr.addr + off as u64,
                        length: data.len() as u32,
                        lkey: LKey(mr.lkey),
                    }]
                },
                flags,
            };
            slot.qp
                .rc(V)?
                .post_send(wr)
                .map_err(|e| VerbsError::new(V, ErrorKind::Post(e)))?;
            slot.inline_next = slot.inline_next.wrapping_add(1);
            Ok(())
        })?;
        crate::engine::kick(&self.shared, self.qpn);
        Ok(())
    }

    /// Posts a receive work request (`ibv_post_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.with_slot("ibv_post_recv", |slot| {
            if slot.srq.is_some() {
                return Err(VerbsError::invalid(
                    "ibv_post_recv",
                    "the QP takes its receives from an SRQ (post to the SRQ)",
                ));
            }
            slot.qp
                .post_recv(wr)
                .map_err(|e| VerbsError::new("ibv_post_recv", ErrorKind::Post(e)))
        })?;
        // Nothing to send: a requester that drew an RNR NAK retries on its own timer.
        Ok(())
    }

    /// This QP's counters.
    pub fn stats(&self) -> Result<QpStats> {
        self.with_slot("ibv_query_qp", |s| Ok(s.qp.stats()))
    }

    /// This QP's congestion controller state (DCQCN's rate, target, alpha; CNPs seen).
    pub fn congestion(&self) -> Result<monel_rc::congestion::ControllerMetrics> {
        self.with_slot("ibv_query_qp", |s| {
            s.qp.congestion().ok_or_else(|| {
                VerbsError::invalid("ibv_query_qp", "a UD QP has no congestion control")
            })
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // ACKs deferred to batch with a next post that will not come go out now.
        if self.shared.core().pending_tx.contains(&self.qpn) {
            crate::engine::kick(&self.shared, self.qpn);
        }
        let mut core = self.shared.core();
        if let Some(slot) = core.qps.remove(&self.qpn) {
            let st = slot.qp.stats();
            core.retired += st;
            if let Some(id) = slot.srq {
                if core.srqs.get_mut(&id).is_some_and(SrqState::detach) {
                    core.srqs.remove(&id);
                }
            }
            if let Some((mr, _)) = slot.inline {
                self.shared
                    .mrs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(mr.lkey, mr.rkey);
            }
        }
    }
}

/// Converts the engine's QP events into device events.
pub(crate) fn device_event(qpn: Qpn, e: QpEvent) -> Option<AsyncEvent> {
    Some(match e {
        QpEvent::CommEstablished => AsyncEvent::CommEstablished(qpn),
        QpEvent::SqDrained => AsyncEvent::SqDrained(qpn),
        QpEvent::QpFatal => AsyncEvent::QpFatal(qpn),
        _ => return None,
    })
}
