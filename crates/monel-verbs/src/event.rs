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
    /// A QP's peer sent a request it could not carry out (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError(Qpn),
    /// A QP's peer broke an access rule (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError(Qpn),
    /// A QP on an SRQ will take no more receives (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached(Qpn),
    /// An SRQ failed (`IBV_EVENT_SRQ_ERR`).
    SrqError(u32),
    /// A port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive(u8),
    /// A port went down (`IBV_EVENT_PORT_ERR`).
    PortError(u8),
    /// A port's GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange(u8),
    /// The device failed and every object on it is unusable (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal,
}
