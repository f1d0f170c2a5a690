//! Shared receive queues (`ibv_srq`): one pool of receive WQEs that many RC QPs draw from,
//! each taking one exactly when an in-sequence SEND or WRITE with immediate needs it.

use std::collections::VecDeque;
use std::sync::Arc;

use monel_rc::RecvWr;

use crate::context::{AsyncEvent, DevShared, ProtectionDomain};
use crate::error::{ErrorKind, Result, VerbsError};

/// Sizes of a shared receive queue (`ibv_srq_init_attr.attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Most receive WQEs queued.
    pub max_wr: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Limit: when fewer WQEs than this remain, [`AsyncEvent::SrqLimitReached`] is raised
    /// once and the limit disarmed (0: disarmed).
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

/// The device's copy of an SRQ.
#[derive(Debug)]
pub(crate) struct SrqState {
    attr: SrqAttr,
    queue: VecDeque<RecvWr>,
    /// QPs attached; the SRQ is removed with its handle only when none is left.
    pub(crate) users: usize,
    /// The handle was dropped while QPs still used it.
    orphaned: bool,
}

impl SrqState {
    /// Takes the next WQE; raises the limit event into `events` when it falls below.
    pub(crate) fn take(&mut self, id: u32, events: &mut VecDeque<AsyncEvent>) -> Option<RecvWr> {
        let wr = self.queue.pop_front()?;
        let limit = self.attr.srq_limit;
        if limit > 0 && (self.queue.len() as u32) < limit {
            self.attr.srq_limit = 0;
            events.push_back(AsyncEvent::SrqLimitReached(id));
        }
        Some(wr)
    }

    /// A QP detached; true if the SRQ should now go.
    pub(crate) fn detach(&mut self) -> bool {
        self.users -= 1;
        self.users == 0 && self.orphaned
    }
}

/// A shared receive queue (`ibv_srq`). Attach QPs through
/// [`crate::QpInitAttr::srq`]; their own `post_recv` is then refused.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    shared: Arc<DevShared>,
    pub(crate) id: u32,
    pub(crate) pd: u32,
}

impl ProtectionDomain {
    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, attr: &SrqAttr) -> Result<SharedReceiveQueue> {
        const V: &str = "ibv_create_srq";
        use crate::context::limits;
        if attr.max_wr == 0 || attr.max_wr > limits::MAX_QP_WR {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.max_wr = {}, allowed 1..={}",
                    attr.max_wr,
                    limits::MAX_QP_WR
                ),
            ));
        }
        if attr.max_sge == 0 || attr.max_sge > limits::MAX_SGE {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.max_sge = {}, allowed 1..={}",
                    attr.max_sge,
                    limits::MAX_SGE
                ),
            ));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.srq_limit {} above max_wr {}",
                    attr.srq_limit, attr.max_wr
                ),
            ));
        }
        let mut core = self.shared.core();
        let id = core.fresh_id();
        core.srqs.insert(
            id,
            SrqState {
                attr: *attr,
                queue: VecDeque::with_capacity(attr.max_wr as usize),
                users: 0,
                orphaned: false,
            },
        );
        Ok(SharedReceiveQueue {
            shared: self.shared.clone(),
            id,
            pd: self.id,
        })
    }
}

impl SharedReceiveQueue {
    fn with<R>(&self, verb: &'static str, f: impl FnOnce(&mut SrqState) -> Result<R>) -> Result<R> {
        let mut core = self.shared.core();
        let s = core.srqs.get_mut(&self.id).ok_or_else(|| {
            VerbsError::new(verb, ErrorKind::NotFound(format!("SRQ {}", self.id)))
        })?;
        f(s)
    }

    /// This SRQ's handle number (as in [`AsyncEvent::SrqLimitReached`]).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Posts a receive WQE (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        const V: &str = "ibv_post_srq_recv";
        self.with(V, |s| {
            if wr.sg_list.len() > s.attr.max_sge as usize {
                return Err(VerbsError::new(
                    V,
                    ErrorKind::Post(monel_rc::PostError::TooManySge),
                ));
            }
            if s.queue.len() >= s.attr.max_wr as usize {
                return Err(VerbsError::new(
                    V,
                    ErrorKind::Post(monel_rc::PostError::QueueFull),
                ));
            }
            s.queue.push_back(wr);
            Ok(())
        })
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`); 0 disarms.
    pub fn set_limit(&self, srq_limit: u32) -> Result<()> {
        const V: &str = "ibv_modify_srq";
        self.with(V, |s| {
            if srq_limit > s.attr.max_wr {
                return Err(VerbsError::invalid(
                    V,
                    format!("attr.srq_limit {srq_limit} above max_wr {}", s.attr.max_wr),
                ));
            }
            s.attr.srq_limit = srq_limit;
            Ok(())
        })
    }

    /// Sizes, the armed limit, and how many WQEs are queued now (`ibv_query_srq`).
    pub fn query(&self) -> Result<(SrqAttr, usize)> {
        self.with("ibv_query_srq", |s| Ok((s.attr, s.queue.len())))
    }
}

impl Drop for SharedReceiveQueue {
    /// Destroys the SRQ (`ibv_destroy_srq`). While QPs still draw from it, it lives on
    /// until the last of them is destroyed.
    fn drop(&mut self) {
        let mut core = self.shared.core();
        let remove = match core.srqs.get_mut(&self.id) {
            Some(s) if s.users > 0 => {
                s.orphaned = true;
                false
            }
            Some(_) => true,
            None => false,
        };
        if remove {
            core.srqs.remove(&self.id);
        }
    }
}
