//! The soft RNIC's shared receive queues: the device's copy of each SRQ, from which the
//! engine takes a WQE exactly when an in-sequence SEND or WRITE with immediate needs one.

use std::any::Any;
use std::sync::Arc;

use monel_rc::RecvWr;

use super::queues::SrqState;
use super::shared::DevShared;
use crate::attr::SrqAttr;
use crate::error::{ErrorKind, Result, VerbsError};
use crate::provider::SrqOps;

/// A shared receive queue of the soft RNIC: a handle on the device's copy.
#[derive(Debug)]
pub(crate) struct SoftSrq {
    pub(crate) shared: Arc<DevShared>,
    pub(crate) id: u32,
    pub(crate) pd: u32,
}

impl SoftSrq {
    /// The soft RNIC's SRQ behind `srq`; an error if another provider made it.
    pub(crate) fn of(srq: &dyn SrqOps) -> Result<&Self> {
        srq.as_any().downcast_ref().ok_or_else(|| {
            VerbsError::invalid(
                "ibv_create_qp",
                "init_attr.srq belongs to another protection domain or device",
            )
        })
    }

    fn with<R>(&self, verb: &'static str, f: impl FnOnce(&mut SrqState) -> Result<R>) -> Result<R> {
        let mut core = self.shared.core();
        let s = core.srqs.get_mut(&self.id).ok_or_else(|| {
            VerbsError::new(verb, ErrorKind::NotFound(format!("SRQ {}", self.id)))
        })?;
        f(s)
    }
}

impl SrqOps for SoftSrq {
    fn id(&self) -> u32 {
        self.id
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
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

    fn set_limit(&self, srq_limit: u32) -> Result<()> {
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

    fn query(&self) -> Result<(SrqAttr, usize)> {
        self.with("ibv_query_srq", |s| Ok((s.attr, s.queue.len())))
    }
}

impl Drop for SoftSrq {
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
