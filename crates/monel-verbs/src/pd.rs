//! Protection domains (`ibv_pd`): regions, QPs, SRQs and address handles of one PD see only
//! each other.

use std::sync::Arc;

use monel_rc::AccessFlags;

use crate::ah::AddressHandle;
use crate::attr::{AhAttr, SrqAttr};
use crate::error::{Result, VerbsError};
use crate::mr::MemoryRegion;
use crate::provider::{PdOps, QpInit};
use crate::qp::{QpInitAttr, QueuePair};
use crate::srq::SharedReceiveQueue;

/// A protection domain (`ibv_pd`).
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) ops: Arc<dyn PdOps>,
}

fn check_access(verb: &'static str, access: AccessFlags) -> Result<()> {
    if access.0 & !AccessFlags::ALL.0 != 0 {
        return Err(VerbsError::invalid(
            verb,
            format!("unknown access bits {:#x}", access.0),
        ));
    }
    let remote_mod = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.0 & remote_mod.0 != 0 && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(VerbsError::invalid(
            verb,
            "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
        ));
    }
    Ok(())
}

impl ProtectionDomain {
    /// This PD's handle number.
    pub fn id(&self) -> u32 {
        self.ops.id()
    }

    /// Registers a buffer the region then owns (`ibv_reg_mr`). Its address is the buffer's.
    pub fn reg_mr(&self, buf: Vec<u8>, access: AccessFlags) -> Result<MemoryRegion> {
        check_access("ibv_reg_mr", access)?;
        Ok(MemoryRegion {
            ops: self.ops.reg_mr(buf, access)?,
        })
    }

    /// Registers caller memory by address (`ibv_reg_mr` on a raw pointer).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be valid for reads and writes until the returned region is
    /// dropped, and must not be accessed by the caller while an RDMA operation on it may be in
    /// progress (the soft RNIC copies in and out of it from its progress thread, as a NIC
    /// DMAs). Drop the region before freeing the memory.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        check_access("ibv_reg_mr", access)?;
        if ptr.is_null() && len > 0 {
            return Err(VerbsError::invalid("ibv_reg_mr", "null address"));
        }
        // SAFETY: the caller upholds this function's contract, which is the provider's.
        let ops = unsafe { self.ops.reg_mr_raw(ptr, len, access)? };
        Ok(MemoryRegion { ops })
    }

    /// Creates a queue pair in RESET (`ibv_create_qp`).
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        let init = QpInit {
            send_cq: init.send_cq.ops.as_ref(),
            recv_cq: init.recv_cq.ops.as_ref(),
            srq: init.srq.map(|s| s.ops.as_ref()),
            cap: init.cap,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all,
        };
        Ok(QueuePair {
            ops: self.ops.create_qp(&init)?,
        })
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, attr: &SrqAttr) -> Result<SharedReceiveQueue> {
        Ok(SharedReceiveQueue {
            ops: self.ops.create_srq(attr)?,
        })
    }

    /// Creates an address handle (`ibv_create_ah`): the source GID index must exist and the
    /// destination be of the same IP family.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        Ok(AddressHandle {
            ops: self.ops.create_ah(attr)?,
        })
    }
}
