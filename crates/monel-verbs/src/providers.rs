//! Which providers offer devices, and which one opens a device: rdma-core's libibverbs for
//! the kernel's RDMA devices, the soft RNIC for the rest.

use std::net::IpAddr;
use std::sync::Arc;

use crate::config::ContextConfig;
use crate::device::{Device, Provider, soft_device_of, soft_devices};
use crate::error::{ErrorKind, Result, VerbsError};
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

/// Lists the devices (`ibv_get_device_list`): each port of the kernel's RDMA devices that
/// libibverbs can open (none where rdma-core or kernel RDMA is missing), then one soft
/// device per IP interface that has addresses.
pub fn devices() -> Result<Vec<Device>> {
    let mut all = crate::rdma_core::device::list().unwrap_or_default();
    all.extend(soft_devices()?);
    Ok(all)
}

impl Device {
    /// A device from a command-line argument: an IP address to bind to, or a device or
    /// interface name.
    pub fn from_arg(s: &str) -> Result<Self> {
        match s.parse::<IpAddr>() {
            Ok(ip) => Self::bind(ip),
            Err(_) => Self::by_name(s),
        }
    }

    /// Finds a device by name (`rxe0`, `mlx5_0:2`, `monel_lo`), or the soft device of an
    /// interface (`lo`), also one with no address yet (its GID table fills as addresses
    /// appear).
    pub fn by_name(name: &str) -> Result<Self> {
        let all = devices()?;
        if let Some(d) = all.iter().find(|d| d.name == name) {
            return Ok(d.clone());
        }
        let known: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
        if let Some(d) = all
            .iter()
            .find(|d| d.provider == Provider::Soft && d.ifname == name)
        {
            return Ok(d.clone());
        }
        let ifname = name.strip_prefix("monel_").unwrap_or(name);
        soft_device_of(ifname)?.ok_or_else(|| {
            VerbsError::new(
                "ibv_get_device_list",
                ErrorKind::NotFound(format!("{name} (devices: {})", known.join(", "))),
            )
        })
    }
}
