//! Asynchronous events (`ibv_get_async_event`).

use monel_wire::Qpn;

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
