//! Device limits (`ibv_device_attr`, the part Monel enforces).

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
