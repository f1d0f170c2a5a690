//! An open kernel RDMA device (`ibv_context`) as a provider context: the NIC runs itself,
//! so there is no progress thread; asynchronous events are read from the context's
//! non-blocking event file.
#![allow(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use super::cq::HwCq;
use super::ffi;
use super::loader::Libibverbs;
use super::pd::HwPd;
use super::raw::{RawCtx, set_nonblocking};
use crate::config::ContextConfig;
use crate::counters::DeviceCounters;
use crate::device::{Device, GidEntry, PortAttr, Provider};
use crate::error::{ErrorKind, Result, VerbsError};
use crate::event::AsyncEvent;
use crate::provider::{ContextOps, CqOps, PdOps};
use monel_peer::gid::GidKind;

/// An open rdma-core device.
#[derive(Debug)]
pub(crate) struct HwContext {
    raw: Arc<RawCtx>,
    device: Device,
    config: ContextConfig,
}

impl HwContext {
    /// Opens port `device`'s kernel device through libibverbs.
    pub(crate) fn open(device: &Device, config: ContextConfig) -> Result<Self> {
        let Provider::RdmaCore { port, .. } = device.provider else {
            return Err(VerbsError::invalid(
                "ibv_open_device",
                "not an rdma-core device",
            ));
        };
        let unsupported = |e: String| VerbsError::new("ibv_open_device", ErrorKind::Unsupported(e));
        let lib = Libibverbs::shared().map_err(unsupported)?;
        let kernel_name = device.name.split(':').next().unwrap_or(&device.name);
        let ctx = super::device::open_by_name(lib, kernel_name)
            .map_err(|e| VerbsError::new("ibv_open_device", ErrorKind::NotFound(e)))?;
        let raw = Arc::new(RawCtx { lib, ctx, port });
        // SAFETY: `ctx` is open; `async_fd` is the context's own event file.
        let afd = unsafe { (*ctx).async_fd };
        set_nonblocking(afd).map_err(|e| VerbsError::io("ibv_open_device", e))?;
        let mut device = device.clone();
        // Fresh port state and MTU (the listing may be old).
        if let Ok(attr) = super::device::query_port(lib, ctx, port) {
            device.up = attr.state == ffi::IBV_PORT_ACTIVE;
            device.provider = Provider::RdmaCore {
                port,
                max_mtu: super::device::mtu_of(attr.max_mtu),
                active_mtu: super::device::mtu_of(attr.active_mtu),
            };
        }
        Ok(Self {
            raw,
            device,
            config,
        })
    }
}

impl ContextOps for HwContext {
    fn device(&self) -> &Device {
        &self.device
    }
    fn config(&self) -> &ContextConfig {
        &self.config
    }
    fn local_addr(&self, gid_index: u8) -> Result<SocketAddr> {
        let g = self.device.gid(gid_index)?;
        Ok(SocketAddr::new(g.gid.to_ip(), monel_wire::ROCE_V2_UDP_PORT))
    }

    fn query_gid(&self, index: u8) -> Result<GidEntry> {
        let port = self.raw.port;
        let len = super::device::query_port(self.raw.lib, self.raw.ctx, port)
            .map(|a| usize::try_from(a.gid_tbl_len).unwrap_or(0))
            .unwrap_or(self.device.gids.len());
        if usize::from(index) >= len {
            return Err(VerbsError::new(
                "ibv_query_gid",
                ErrorKind::NotFound(format!(
                    "GID index {index} ({} port {port} has {len} entries)",
                    self.device.name
                )),
            ));
        }
        let kernel_name = self
            .device
            .name
            .split(':')
            .next()
            .unwrap_or(&self.device.name);
        let root = std::path::Path::new(super::sysfs::SYSFS_ROOT);
        Ok(
            match super::sysfs::read_gid(root, kernel_name, port, u16::from(index)) {
                Some((slot, ndev)) => GidEntry {
                    gid: slot.gid,
                    ifindex: ndev
                        .and_then(|n| nix::net::if_::if_nametoindex(n.as_str()).ok())
                        .unwrap_or(0),
                    kind: slot.kind,
                },
                None => GidEntry {
                    gid: Default::default(),
                    ifindex: 0,
                    kind: GidKind::RoceV2,
                },
            },
        )
    }
    fn query_port(&self) -> PortAttr {
        let mut d = self.device.clone();
        if let Ok(attr) = super::device::query_port(self.raw.lib, self.raw.ctx, self.raw.port) {
            d.up = attr.state == ffi::IBV_PORT_ACTIVE;
            d.provider = Provider::RdmaCore {
                port: self.raw.port,
                max_mtu: super::device::mtu_of(attr.max_mtu),
                active_mtu: super::device::mtu_of(attr.active_mtu),
            };
            let mut p = d.port_attr();
            p.gid_tbl_len = u32::try_from(attr.gid_tbl_len).unwrap_or(0);
            return p;
        }
        d.port_attr()
    }

    fn alloc_pd(&self) -> Arc<dyn PdOps> {
        Arc::new(HwPd::alloc(&self.raw, &self.device, &self.config))
    }

    fn create_cq(&self, cqe: usize) -> Result<Arc<dyn CqOps>> {
        Ok(Arc::new(HwCq::create(
            &self.raw,
            cqe,
            self.config.busy_poll,
        )?))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let lib = self.raw.lib;
        loop {
            let mut ev = ffi::ibv_async_event {
                element: std::ptr::null_mut(),
                event_type: 0,
            };
            // SAFETY: the context is open and its event file non-blocking; `ev` is valid.
            if unsafe { (lib.get_async_event)(self.raw.ctx, &mut ev) } != 0 {
                return None;
            }
            let mapped = map_event(&ev);
            // SAFETY: `ev` came from `ibv_get_async_event` and is acknowledged once.
            unsafe { (lib.ack_async_event)(&mut ev) };
            if let Some(e) = mapped {
                return Some(e);
            }
        }
    }

    fn counters(&self) -> DeviceCounters {
        super::counters::read_port(&self.device)
    }
}

/// An rdma-core event as Monel's (None for kinds Monel has no word for).
fn map_event(ev: &ffi::ibv_async_event) -> Option<AsyncEvent> {
    let qpn = || {
        // SAFETY: for QP events `element` is the `ibv_qp` the event is about, alive until
        // the event is acknowledged.
        let n = unsafe { (*(ev.element as *const ffi::ibv_qp)).qp_num };
        monel_wire::Qpn::new(n & 0xff_ffff)
    };
    let port = || ev.element as usize as u8;
    let handle_cq = || {
        // SAFETY: for CQ events `element` is the `ibv_cq`, alive until acknowledged.
        unsafe { (*(ev.element as *const ffi::ibv_cq)).handle }
    };
    let handle_srq = || {
        // SAFETY: for SRQ events `element` is the `ibv_srq`, alive until acknowledged.
        unsafe { (*(ev.element as *const ffi::ibv_srq)).handle }
    };
    Some(match ev.event_type {
        ffi::IBV_EVENT_CQ_ERR => AsyncEvent::CqError(handle_cq()),
        ffi::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal(qpn()),
        ffi::IBV_EVENT_QP_REQ_ERR => AsyncEvent::QpRequestError(qpn()),
        ffi::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpAccessError(qpn()),
        ffi::IBV_EVENT_COMM_EST => AsyncEvent::CommEstablished(qpn()),
        ffi::IBV_EVENT_SQ_DRAINED => AsyncEvent::SqDrained(qpn()),
        ffi::IBV_EVENT_QP_LAST_WQE_REACHED => AsyncEvent::LastWqeReached(qpn()),
        ffi::IBV_EVENT_SRQ_LIMIT_REACHED => AsyncEvent::SrqLimitReached(handle_srq()),
        ffi::IBV_EVENT_SRQ_ERR => AsyncEvent::SrqError(handle_srq()),
        ffi::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive(port()),
        ffi::IBV_EVENT_PORT_ERR => AsyncEvent::PortError(port()),
        ffi::IBV_EVENT_GID_CHANGE => AsyncEvent::GidChange(port()),
        ffi::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
        _ => return None,
    })
}
