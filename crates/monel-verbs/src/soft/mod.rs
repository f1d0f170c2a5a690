//! The soft RNIC: the provider that turns verbs into RoCEv2 datagrams on UDP sockets,
//! through the sans-IO RC and UD engines of `monel-rc`.
//!
//! ```text
//!  SoftContext / SoftPd / SoftQp / SoftCq / SoftSrq / SoftMr   the provider objects (ops)
//!     |  post: the caller's thread services its QP (engine::kick)
//!     v
//!  shared: DevShared { Core (QP slots, SRQs, events, counters), MrTable, Sockets }
//!     |
//!  engine: progress loop, service, deliver (ICRC check, RcQp::handle_packet)
//!     |
//!  tx (send batches, GSO, zero-copy lending), netio + mmsg (sockets, recvmmsg/sendmmsg)
//!     |
//!  gid_table + addr_watch: the GID table (and its sockets) following the interface's addresses
//! ```
//! The progress thread (the "NIC") runs `engine::run`; threads that poll or wait on a CQ
//! drive the sockets themselves while they do.

mod addr_watch;
mod ah;
mod cq;
mod engine;
mod gid_table;
mod gso;
mod idmap;
mod mmsg;
mod mr;
mod netio;
mod pd;
mod qp;
mod qp_kind;
mod queues;
mod shared;
mod srq;
mod tx;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use nix::sys::eventfd::{EfdFlags, EventFd};

use self::addr_watch::AddrWatch;
use self::cq::SoftCq;
use self::mr::MrTable;
use self::netio::Sockets;
use self::pd::SoftPd;
use self::queues::CqShared;
use self::shared::{Core, DevShared};
use crate::config::ContextConfig;
use crate::counters::DeviceCounters;
use crate::device::{Device, GidEntry, PortAttr};
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::provider::{ContextOps, CqOps, PdOps};

/// An open soft RNIC: its sockets and its progress thread, stopped on drop.
#[derive(Debug)]
pub(crate) struct SoftContext {
    shared: Arc<DevShared>,
    thread: Option<JoinHandle<()>>,
}

impl SoftContext {
    /// Binds a UDP socket on every GID's address and starts the progress thread.
    pub(crate) fn open(device: &Device, config: ContextConfig) -> Result<Self> {
        let sockets = Sockets::bind(device, &config)?;
        // A device on an interface follows its addresses, as rxe's follows netdev events.
        let addr_watch = if device.follows_interface() {
            match AddrWatch::open() {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(
                        "{}: the GID table stays as opened (no netlink: {e})",
                        device.name
                    );
                    None
                }
            }
        } else {
            None
        };
        // What changed between the listing and the watch.
        if addr_watch.is_some() {
            if let Ok(addrs) = crate::device::interface_addresses(&device.ifname) {
                sockets.follow(&device.name, &addrs, &config);
            }
        }
        let doorbell = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| VerbsError::io("ibv_open_device", e))?;
        let shared = Arc::new(DevShared {
            device: device.clone(),
            config,
            core: Mutex::new(Core::default()),
            mrs: Arc::new(Mutex::new(MrTable::default())),
            sockets,
            addr_watch,
            doorbell,
            stop: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            callers: Default::default(),
            rx_lock: Mutex::new(()),
            last_poll_ns: Default::default(),
            engine_watches: AtomicBool::new(true),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("monel-{}", device.name))
            .spawn(move || engine::run(&s2))
            .map_err(|e| VerbsError::io("ibv_open_device", e))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }
}

impl ContextOps for SoftContext {
    fn device(&self) -> &Device {
        &self.shared.device
    }
    fn config(&self) -> &ContextConfig {
        &self.shared.config
    }
    fn local_addr(&self, gid_index: u8) -> Result<SocketAddr> {
        self.shared
            .sockets
            .load()
            .local_addr(usize::from(gid_index))
    }
    fn query_gid(&self, index: u8) -> Result<GidEntry> {
        self.shared.sockets.load().gid(usize::from(index))
    }
    fn query_port(&self) -> PortAttr {
        let mut d = self.shared.device.clone();
        d.gids = self.shared.sockets.load().gids.clone();
        d.refresh_link();
        d.port_attr()
    }

    fn alloc_pd(&self) -> Arc<dyn PdOps> {
        let id = self.shared.core().fresh_id();
        Arc::new(SoftPd {
            shared: self.shared.clone(),
            id,
        })
    }

    fn create_cq(&self, cqe: usize) -> Result<Arc<dyn CqOps>> {
        let id = self.shared.core().fresh_id();
        Ok(Arc::new(SoftCq {
            cq: Arc::new(CqShared::new(id, cqe)?),
            dev: Arc::downgrade(&self.shared),
        }))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.shared.core().events.pop_front()
    }

    fn counters(&self) -> DeviceCounters {
        let core = self.shared.core();
        let mut c = core.counters;
        let mut q = core.retired;
        for slot in core.qps.values() {
            q += slot.qp.stats();
        }
        c.qp = q;
        c.qps = core.qps.len() as u64;
        c.mrs = self
            .shared
            .mrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64;
        c
    }
}

impl Drop for SoftContext {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.doorbell.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
