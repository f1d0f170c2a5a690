//! Address handles on an rdma-core device (UD sends).
#![allow(unsafe_code)]

use std::sync::Arc;

use super::ffi;
use super::raw::{RawPd, os_error};
use crate::attr::AhAttr;
use crate::device::Gid;
use crate::error::Result;
use crate::provider::AhOps;

/// An `ibv_ah_attr` with its GRH (RoCE always has one).
pub(crate) fn ah_attr(
    dgid: [u8; 16],
    sgid_index: u8,
    hop_limit: u8,
    tc: u8,
    port: u8,
) -> ffi::ibv_ah_attr {
    ffi::ibv_ah_attr {
        grh: ffi::ibv_global_route {
            dgid: ffi::ibv_gid { raw: dgid },
            flow_label: 0,
            sgid_index,
            hop_limit,
            traffic_class: tc,
        },
        is_global: 1,
        port_num: port,
        ..Default::default()
    }
}

/// An address handle.
#[derive(Debug)]
pub(crate) struct HwAh {
    pd: Arc<RawPd>,
    pub(crate) ah: *mut ffi::ibv_ah,
    dgid: Gid,
}

impl HwAh {
    /// `ibv_create_ah` towards `attr.dgid`, with traffic class `tc`.
    pub(crate) fn create(pd: &Arc<RawPd>, attr: &AhAttr, tc: u8) -> Result<Self> {
        let mut a = ah_attr(
            attr.dgid.0,
            attr.sgid_index,
            attr.hop_limit,
            tc,
            pd.ctx.port,
        );
        // SAFETY: the PD is live and `a` a complete `ibv_ah_attr`.
        let ah = unsafe { (pd.ctx.lib.create_ah)(pd.pd, &mut a) };
        if ah.is_null() {
            return Err(os_error("ibv_create_ah", -1));
        }
        Ok(Self {
            pd: pd.clone(),
            ah,
            dgid: attr.dgid,
        })
    }
}

// SAFETY: see `RawCtx`.
unsafe impl Send for HwAh {}
// SAFETY: as above.
unsafe impl Sync for HwAh {}

impl Drop for HwAh {
    fn drop(&mut self) {
        // SAFETY: created by `create_ah`, destroyed once.
        unsafe { (self.pd.ctx.lib.destroy_ah)(self.ah) };
    }
}

impl AhOps for HwAh {
    fn dgid(&self) -> Gid {
        self.dgid
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
