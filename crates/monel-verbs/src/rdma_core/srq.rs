//! Shared receive queues on an rdma-core device.
#![allow(unsafe_code)]

use std::any::Any;
use std::sync::Arc;

use monel_rc::{PostError, RecvWr, Sge};

use super::ffi;
use super::raw::{RawPd, os_error};
use crate::attr::SrqAttr;
use crate::error::{ErrorKind, Result, VerbsError};
use crate::provider::SrqOps;

/// The SRQ pointer, destroyed after the last QP drawing from it (each holds it).
#[derive(Debug)]
pub(crate) struct RawSrq {
    pd: Arc<RawPd>,
    pub(crate) srq: *mut ffi::ibv_srq,
}

// SAFETY: see `RawCtx`: libibverbs objects may be used from any thread.
unsafe impl Send for RawSrq {}
// SAFETY: as above.
unsafe impl Sync for RawSrq {}

impl Drop for RawSrq {
    fn drop(&mut self) {
        // SAFETY: created by `HwSrq::create`, destroyed once, after its QPs.
        unsafe { (self.pd.ctx.lib.destroy_srq)(self.srq) };
    }
}

/// A shared receive queue on an rdma-core device.
#[derive(Debug)]
pub(crate) struct HwSrq {
    pub(crate) raw: Arc<RawSrq>,
    attr: SrqAttr,
}

impl HwSrq {
    pub(crate) fn create(pd: &Arc<RawPd>, attr: &SrqAttr) -> Result<Self> {
        const V: &str = "ibv_create_srq";
        if attr.srq_limit > attr.max_wr {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.srq_limit {} above max_wr {}",
                    attr.srq_limit, attr.max_wr
                ),
            ));
        }
        let mut init = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                srq_limit: attr.srq_limit,
            },
        };
        // SAFETY: the PD is live and `init` complete.
        let srq = unsafe { (pd.ctx.lib.create_srq)(pd.pd, &mut init) };
        if srq.is_null() {
            return Err(os_error(V, -1));
        }
        Ok(Self {
            raw: Arc::new(RawSrq {
                pd: pd.clone(),
                srq,
            }),
            attr: SrqAttr {
                max_wr: init.attr.max_wr,
                max_sge: init.attr.max_sge,
                srq_limit: attr.srq_limit,
            },
        })
    }
}

impl SrqOps for HwSrq {
    fn id(&self) -> u32 {
        // SAFETY: a live SRQ.
        unsafe { (*self.raw.srq).handle }
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        const V: &str = "ibv_post_srq_recv";
        if wr.sg_list.len() > self.attr.max_sge as usize {
            return Err(VerbsError::new(V, ErrorKind::Post(PostError::TooManySge)));
        }
        let mut sges: Vec<ffi::ibv_sge> = wr
            .sg_list
            .iter()
            .map(|s: &Sge| ffi::ibv_sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey.0,
            })
            .collect();
        let mut w = ffi::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: std::ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: sges.len() as i32,
        };
        let ctx = &self.raw.pd.ctx;
        // SAFETY: the context is open; the provider filled `post_srq_recv` at open.
        let post = unsafe { (*ctx.ctx).ops.post_srq_recv }
            .ok_or_else(|| VerbsError::new(V, ErrorKind::Unsupported("no SRQ posts".into())))?;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live SRQ; `w` and its SGEs are valid for the call.
        let rc = unsafe { post(self.raw.srq, &mut w, &mut bad) };
        match rc {
            0 => Ok(()),
            libc::ENOMEM => Err(VerbsError::new(V, ErrorKind::Post(PostError::QueueFull))),
            rc => Err(os_error(V, rc)),
        }
    }

    fn set_limit(&self, srq_limit: u32) -> Result<()> {
        const V: &str = "ibv_modify_srq";
        if srq_limit > self.attr.max_wr {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.srq_limit {srq_limit} above max_wr {}",
                    self.attr.max_wr
                ),
            ));
        }
        let mut a = ffi::ibv_srq_attr {
            srq_limit,
            ..Default::default()
        };
        // SAFETY: a live SRQ; `a` complete.
        let rc =
            unsafe { (self.raw.pd.ctx.lib.modify_srq)(self.raw.srq, &mut a, ffi::IBV_SRQ_LIMIT) };
        if rc != 0 {
            return Err(os_error(V, rc));
        }
        Ok(())
    }

    fn query(&self) -> Result<(SrqAttr, usize)> {
        let mut a = ffi::ibv_srq_attr::default();
        // SAFETY: a live SRQ; `a` complete.
        let rc = unsafe { (self.raw.pd.ctx.lib.query_srq)(self.raw.srq, &mut a) };
        if rc != 0 {
            return Err(os_error("ibv_query_srq", rc));
        }
        let attr = SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        // The NIC does not say how many WQEs it still holds.
        Ok((attr, 0))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
