//! Shared receive queues (`ibv_srq`): one pool of receive WQEs that many RC QPs draw from,
//! each taking one exactly when an in-sequence SEND or WRITE with immediate needs it.

use monel_rc::RecvWr;

use crate::attr::SrqAttr;
use crate::error::Result;
use crate::provider::SrqOps;

/// A shared receive queue (`ibv_srq`). Attach QPs through [`crate::QpInitAttr::srq`];
/// their own `post_recv` is then refused. Dropping it destroys it (`ibv_destroy_srq`); while
/// QPs still draw from it, it lives on until the last of them is destroyed.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    pub(crate) ops: Box<dyn SrqOps>,
}

impl SharedReceiveQueue {
    /// This SRQ's handle number (as in [`crate::AsyncEvent::SrqLimitReached`]).
    pub fn id(&self) -> u32 {
        self.ops.id()
    }

    /// Posts a receive WQE (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.ops.post_recv(wr)
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`); 0 disarms.
    pub fn set_limit(&self, srq_limit: u32) -> Result<()> {
        self.ops.set_limit(srq_limit)
    }

    /// Sizes, the armed limit, and how many WQEs are queued now (`ibv_query_srq`).
    pub fn query(&self) -> Result<(SrqAttr, usize)> {
        self.ops.query()
    }
}
