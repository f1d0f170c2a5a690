//! The plain attributes verbs objects are created with (`ibv_qp_cap`, `ibv_srq_attr`,
//! `ibv_ah_attr`), shared by the API and its providers.

use crate::device::Gid;

/// Queue pair transport (`ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connection.
    Rc,
    /// Unreliable datagram: one-packet SENDs to any QP with the Q_Key, each with its own
    /// address handle ([`crate::QueuePair::post_send_ud`]).
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

/// Sizes of a shared receive queue (`ibv_srq_init_attr.attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Most receive WQEs queued.
    pub max_wr: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Limit: when fewer WQEs than this remain, [`crate::AsyncEvent::SrqLimitReached`] is
    /// raised once and the limit disarmed (0: disarmed).
    pub srq_limit: u32,
}

impl Default for SrqAttr {
    fn default() -> Self {
        Self {
            max_wr: 1024,
            max_sge: 4,
            srq_limit: 0,
        }
    }
}

/// What an address handle points at (`ibv_ah_attr` with its GRH, as RoCE always has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Local GID index to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
}
