//! Which provider opens a device: rdma-core's libibverbs for the kernel's RDMA devices,
//! the soft RNIC for the rest.

use std::sync::Arc;

use crate::config::ContextConfig;
use crate::device::{Device, Provider};
use crate::error::Result;
use crate::provider::ContextOps;

/// Opens `device` with the provider that serves it.
pub(crate) fn open(device: &Device, config: ContextConfig) -> Result<Arc<dyn ContextOps>> {
    match device.provider {
        Provider::Soft => Ok(Arc::new(crate::soft::SoftContext::open(device, config)?)),
        Provider::RdmaCore { .. } => {
            Ok(Arc::new(crate::rdma_core::HwContext::open(device, config)?))
        }
    }
}
