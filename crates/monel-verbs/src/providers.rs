//! Which provider opens a device. Today every device is the soft RNIC's; a hardware
//! provider (rdma-core's libibverbs, loaded at run time) is chosen here, per device.

use std::sync::Arc;

use crate::config::ContextConfig;
use crate::device::Device;
use crate::error::Result;
use crate::provider::ContextOps;

/// Opens `device` with the provider that serves it.
pub(crate) fn open(device: &Device, config: ContextConfig) -> Result<Arc<dyn ContextOps>> {
    Ok(Arc::new(crate::soft::SoftContext::open(device, config)?))
}
