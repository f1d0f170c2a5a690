//! Work requests and work completions (`ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`), with enums in
//! place of C unions.

use monel_wire::{LKey, Qpn, RKey};

/// One scatter/gather element: `length` bytes at `addr` in the region named by `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address (in the memory provider's address space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: LKey,
}

/// A remote buffer: address and R_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: RKey,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendImm(u32),
    /// SEND that invalidates a remote key at the responder.
    SendInv(RKey),
    /// RDMA WRITE.
    Write(RemoteAddr),
    /// RDMA WRITE with immediate data (consumes a receive at the responder).
    WriteImm(RemoteAddr, u32),
    /// RDMA READ into the local SGEs.
    Read(RemoteAddr),
    /// 64-bit compare and swap; the original value lands in the 8-byte local SGE.
    CompareSwap {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Value to compare with.
        compare: u64,
        /// Value to store if equal.
        swap: u64,
    },
    /// 64-bit fetch and add; the original value lands in the 8-byte local SGE.
    FetchAdd {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Addend.
        add: u64,
    },
}

impl SendOp {
    /// True for READ and the atomics (they use responder resources).
    pub const fn is_rd_atomic(&self) -> bool {
        matches!(
            self,
            Self::Read(_) | Self::CompareSwap { .. } | Self::FetchAdd { .. }
        )
    }
    /// True for the atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(self, Self::CompareSwap { .. } | Self::FetchAdd { .. })
    }
    /// The completion opcode of this operation.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            Self::Send | Self::SendImm(_) | Self::SendInv(_) => WcOpcode::Send,
            Self::Write(_) | Self::WriteImm(..) => WcOpcode::RdmaWrite,
            Self::Read(_) => WcOpcode::RdmaRead,
            Self::CompareSwap { .. } => WcOpcode::CompSwap,
            Self::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// Send flags (`ibv_send_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags {
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Wait for all earlier READ/atomic requests to complete before starting.
    pub fence: bool,
    /// Set the solicited-event bit on the last packet.
    pub solicited: bool,
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data: gathered for SEND/WRITE, scattered for READ/atomics.
    pub sg_list: Vec<Sge>,
    /// Flags.
    pub flags: SendFlags,
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data lands.
    pub sg_list: Vec<Sge>,
}

/// Completion status (`ibv_wc_status`, same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// The work request completed.
    Success = 0,
    /// Local length error: a receive too small for the SEND, or an SGE list too long.
    LocLenErr = 1,
    /// Local QP operation error: an internal consistency error of the work request.
    LocQpOpErr = 2,
    /// Local protection error: an SGE outside its region or without the needed access.
    LocProtErr = 4,
    /// Flushed because the QP entered the error state.
    WrFlushErr = 5,
    /// Bad response: an unexpected opcode or length from the responder.
    BadRespErr = 7,
    /// Local access error at the responder (protection error on an incoming SEND).
    LocAccessErr = 8,
    /// The responder found the request invalid (NAK invalid request).
    RemInvReqErr = 9,
    /// The responder refused access: R_Key, bounds or access rights (NAK remote access).
    RemAccessErr = 10,
    /// The responder could not complete the operation (NAK remote operational error).
    RemOpErr = 11,
    /// Retries after ACK timeouts or sequence NAKs exhausted.
    RetryExcErr = 12,
    /// Retries after RNR NAKs exhausted.
    RnrRetryExcErr = 13,
    /// Fatal error.
    FatalErr = 19,
}

/// Completion opcode (`ibv_wc_opcode`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred (READ).
    pub byte_len: u32,
    /// Immediate data of a SEND/WRITE with immediate.
    pub imm: Option<u32>,
    /// R_Key invalidated by a SEND with invalidate.
    pub invalidated_rkey: Option<RKey>,
    /// The local QP.
    pub qp_num: Qpn,
    /// The remote QP (receives).
    pub src_qp: Qpn,
    /// The receive buffer starts with 40 bytes of GRH (UD receives; `IBV_WC_GRH`).
    pub grh: bool,
}

impl WorkCompletion {
    /// `Ok` for success, the status otherwise.
    pub fn ok(&self) -> Result<(), WcStatus> {
        if self.status == WcStatus::Success {
            Ok(())
        } else {
            Err(self.status)
        }
    }
}

/// Why a post was refused (the work request never entered the queue).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The QP is in a state that does not accept this queue's posts.
    InvalidState(crate::QpState),
    /// The queue is full.
    QueueFull,
    /// More SGEs than the QP was created for.
    TooManySge,
    /// The message is longer than 2^31 bytes.
    MessageTooLong,
    /// An atomic whose local SGE list is not exactly 8 bytes.
    BadAtomicLength,
    /// An operation this QP type does not have (UD: SEND and SEND with immediate only).
    UnsupportedOp,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InvalidState(s) => write!(f, "post: QP in state {s:?} does not accept this post"),
            Self::QueueFull => f.write_str("post: queue full"),
            Self::TooManySge => f.write_str("post: more SGEs than max_sge"),
            Self::MessageTooLong => f.write_str("post: message longer than 2^31 bytes"),
            Self::BadAtomicLength => f.write_str("post: atomic needs exactly one 8-byte SGE"),
            Self::UnsupportedOp => f.write_str("post: operation not supported on this QP type"),
        }
    }
}
impl std::error::Error for PostError {}
