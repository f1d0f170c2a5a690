//! The soft RNIC's device state, shared by its verbs objects and its progress engine.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use monel_rc::{AddressVector, QpEvent, QpStats};
use monel_wire::Qpn;
use nix::sys::eventfd::EventFd;

use super::addr_watch::AddrWatch;
use super::idmap::IdMap;
use super::mr::{MrShared, MrTable};
use super::netio::Sockets;
use super::qp_kind::QpKind;
use super::queues::CqShared;
use super::queues::SrqState;
use crate::config::ContextConfig;
use crate::counters::DeviceCounters;
use crate::device::{Device, Gid, is_link_local};
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;

/// One QP as the device holds it.
#[derive(Debug)]
pub(crate) struct QpSlot {
    pub(crate) qp: QpKind,
    pub(crate) pd: u32,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub(crate) sq_sig_all: bool,
    /// The SRQ this QP draws receives from.
    pub(crate) srq: Option<u32>,
    /// Socket index and address of the peer, set at RTR.
    pub(crate) peer: Option<(usize, SocketAddr)>,
    pub(crate) inline: Option<(Arc<MrShared>, u32)>,
    pub(crate) inline_next: u32,
    /// Packet protection (`QueuePair::protect`): every packet sealed and opened.
    pub(crate) sealer: Option<crate::protect::Sealer>,
    /// The peer's UDP source port, pinned at its first packet the QP accepted.
    pub(crate) src_port: Option<u16>,
}

/// Device state shared by the API and the progress engine. Lock order: `core`, then `mrs`.
#[derive(Debug, Default)]
pub(crate) struct Core {
    pub(crate) qps: IdMap<QpSlot>,
    pub(crate) events: VecDeque<AsyncEvent>,
    pub(crate) counters: DeviceCounters,
    /// Stats of destroyed QPs, so device totals never go backwards.
    pub(crate) retired: QpStats,
    /// QPs that received packets since an application thread last serviced them.
    pub(crate) dirty: Vec<u32>,
    /// QPs whose transmissions (ACKs, mostly) an application thread deferred, so they can
    /// leave with its next post in one batch.
    pub(crate) pending_tx: Vec<u32>,
    /// A spare QP list for the engine's passes (no allocation per pass).
    pub(crate) scratch: Vec<u32>,
    /// When the progress thread next wakes on its own (`None`: only when rung).
    pub(crate) engine_wake_at: Option<monel_rc::Instant>,
    /// Shared receive queues by handle.
    pub(crate) srqs: IdMap<SrqState>,
    next_id: u32,
}

impl Core {
    /// A handle number not used before on this device.
    pub(crate) fn fresh_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }
}

#[derive(Debug)]
pub(crate) struct DevShared {
    pub(crate) device: Device,
    pub(crate) config: ContextConfig,
    pub(crate) core: Mutex<Core>,
    pub(crate) mrs: Arc<Mutex<MrTable>>,
    pub(crate) sockets: Sockets,
    /// Address changes on the device's interface, which its GID table follows (`None` for a
    /// device bound to one address, or where netlink is refused).
    pub(crate) addr_watch: Option<AddrWatch>,
    pub(crate) doorbell: EventFd,
    pub(crate) stop: AtomicBool,
    pub(crate) epoch: std::time::Instant,
    /// Application threads waiting on a CQ (and so driving the sockets).
    pub(crate) callers: std::sync::atomic::AtomicUsize,
    /// Held while a thread reads the sockets and delivers what it read, so two threads
    /// never deliver one socket's datagrams out of order.
    pub(crate) rx_lock: Mutex<()>,
    /// When an application thread last polled a CQ (ns since `epoch`; 0 once it armed a
    /// completion channel to sleep on).
    pub(crate) last_poll_ns: std::sync::atomic::AtomicU64,
    /// The progress thread is watching the sockets in its sleep (it leaves them to threads
    /// that poll or wait on a CQ).
    pub(crate) engine_watches: AtomicBool,
}

impl DevShared {
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// Where packets with address vector `av` go: the socket of its source GID and the
    /// destination's UDP address. Errors name `verb`.
    pub(crate) fn resolve_av(
        &self,
        verb: &'static str,
        av: &AddressVector,
    ) -> Result<(usize, SocketAddr)> {
        let sgid = self
            .sockets
            .load()
            .gid(usize::from(av.sgid_index))
            .ok()
            .filter(|g| g.gid != Gid::default())
            .ok_or_else(|| {
                VerbsError::invalid(
                    verb,
                    format!(
                        "ah_attr.grh.sgid_index {} not in the GID table",
                        av.sgid_index
                    ),
                )
            })?;
        let dgid = Gid(av.dgid);
        let (sip, dip) = (sgid.gid.to_ip(), dgid.to_ip());
        if sip.is_ipv4() != dip.is_ipv4() {
            return Err(VerbsError::invalid(
                verb,
                format!(
                    "ah_attr.grh.dgid {dgid} and sgid {} differ in IP family",
                    sgid.gid
                ),
            ));
        }
        if !dgid.is_global() {
            return Err(VerbsError::invalid(
                verb,
                "ah_attr.grh.dgid has a zero interface ID",
            ));
        }
        let mut dst = SocketAddr::new(dip, self.config.udp_port);
        if let SocketAddr::V6(s6) = &mut dst {
            if is_link_local(&dip) {
                s6.set_scope_id(sgid.ifindex);
            }
        }
        Ok((usize::from(av.sgid_index), dst))
    }

    pub(crate) fn ring(&self) {
        let _ = self.doorbell.write(1);
    }
}

/// Converts the engine's QP events into device events.
pub(crate) fn device_event(qpn: Qpn, e: QpEvent) -> Option<AsyncEvent> {
    Some(match e {
        QpEvent::CommEstablished => AsyncEvent::CommEstablished(qpn),
        QpEvent::SqDrained => AsyncEvent::SqDrained(qpn),
        QpEvent::QpFatal => AsyncEvent::QpFatal(qpn),
        _ => return None,
    })
}
