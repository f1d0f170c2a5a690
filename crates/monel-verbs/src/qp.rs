//! Queue pairs (`ibv_qp`): creation attributes, connection parameters, and the verbs on a QP.

use monel_rc::congestion::ControllerMetrics;
use monel_rc::{
    AccessFlags, AttrMask, Mtu, QpAttr, QpState, QpStats, RecvWr, SendFlags, SendOp, SendWr,
};
use monel_wire::{Psn, QKey, Qpn};

use crate::ah::AddressHandle;
use crate::attr::{QpCap, QpType};
use crate::cq::CompletionQueue;
use crate::device::{Device, Gid};
use crate::error::Result;
use crate::provider::QpOps;
use crate::srq::SharedReceiveQueue;

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
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).expect("OS random generator");
    Psn::new(u32::from_le_bytes(b) & 0xff_ffff)
}

/// A queue pair (`ibv_qp`).
#[derive(Debug)]
pub struct QueuePair {
    pub(crate) ops: Box<dyn QpOps>,
}

impl QueuePair {
    /// The QP number.
    pub fn qp_num(&self) -> Qpn {
        self.ops.qp_num()
    }
    /// The device it lives on.
    pub fn device(&self) -> &Device {
        self.ops.device()
    }
    /// The sizes it was created with.
    pub fn cap(&self) -> QpCap {
        self.ops.cap()
    }
    /// The UDP port its device listens on for GID `gid_index`.
    pub fn local_udp_port(&self, gid_index: u8) -> Result<u16> {
        self.ops.local_udp_port(gid_index)
    }

    /// Modifies attributes and state (`ibv_modify_qp`), with the verbs state table's
    /// required and allowed masks.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.ops.modify(attr, mask)
    }

    /// Current state and attributes (`ibv_query_qp`).
    pub fn query(&self) -> Result<(QpState, QpAttr)> {
        self.ops.query()
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

    /// Protects every packet of this RC QP with `p`: a tag (and, with
    /// [`crate::protect::PacketAuth::Encrypt`], encryption) that only the peer holding the
    /// same keys makes and checks; forged, altered and replayed packets are dropped and
    /// counted ([`crate::DeviceCounters::auth_failed`], `replayed`). Both sides must protect
    /// with matching keys ([`crate::protect::Protection::between`]) before they connect. A
    /// soft-RNIC extension between Monel peers: rxe and hardware peers speak plain RoCEv2.
    pub fn protect(&self, p: &crate::protect::Protection) -> Result<()> {
        self.ops.protect(p)
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
        attr.ah_attr.traffic_class = self.ops.traffic_class();
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
            self.ops.set_peer_udp_port(port)?;
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

    /// Brings a UD QP from RESET to RTS (INIT with `qkey`, RTR, RTS with `sq_psn`), as
    /// rdma-core's `ibv_ud_pingpong` does.
    pub fn ready_ud(&self, qkey: QKey, sq_psn: Psn) -> Result<()> {
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )?;
        attr.qp_state = QpState::Rtr;
        self.modify(&attr, AttrMask::STATE)?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = sq_psn;
        self.modify(&attr, AttrMask::STATE | AttrMask::SQ_PSN)
    }

    /// Posts a send work request (`ibv_post_send`).
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        self.ops.post_send(wr)
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
        self.ops.post_send_inline(wr_id, op, data, flags)
    }

    /// Posts a UD send (`ibv_post_send` with `wr.ud`): SEND or SEND with immediate of at
    /// most the port MTU, to QP `remote_qpn` at `ah`, carrying `remote_qkey` (top bit set:
    /// this QP's own Q_Key). The receiver's buffer gets 40 bytes of GRH first.
    pub fn post_send_ud(
        &self,
        wr: SendWr,
        ah: &AddressHandle,
        remote_qpn: Qpn,
        remote_qkey: QKey,
    ) -> Result<()> {
        self.ops
            .post_send_ud(wr, ah.ops.as_ref(), remote_qpn, remote_qkey)
    }

    /// Posts a receive work request (`ibv_post_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.ops.post_recv(wr)
    }

    /// This QP's counters.
    pub fn stats(&self) -> Result<QpStats> {
        self.ops.stats()
    }

    /// This QP's congestion controller state (DCQCN's rate, target, alpha; CNPs seen).
    pub fn congestion(&self) -> Result<ControllerMetrics> {
        self.ops.congestion()
    }
}
