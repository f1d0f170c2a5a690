//! The provider boundary: what the verbs objects ask of the NIC underneath them, as
//! rdma-core's `verbs_context_ops` is what libibverbs asks of a provider.
//!
//! Each API object ([`crate::Context`], [`crate::ProtectionDomain`], [`crate::QueuePair`],
//! ...) holds one of these trait objects and adds only what every provider shares: argument
//! checks that need no device, and the helpers built from the verbs (`connect`, `poll_n`,
//! `read`/`write` on a region). The soft RNIC ([`crate::soft`]) is one provider; a second
//! (a hardware NIC through rdma-core) implements the same traits and is chosen in
//! [`crate::providers`], with no change to the API files.
//!
//! Objects passed back into a provider (the CQs of a new QP, its SRQ, a UD send's address
//! handle) are the provider's own: it recovers its type through `as_any`, as a C provider
//! does with `container_of`.

use std::any::Any;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use monel_rc::congestion::ControllerMetrics;
use monel_rc::{
    AccessFlags, AttrMask, QpAttr, QpState, QpStats, RecvWr, SendFlags, SendOp, SendWr,
};
use monel_wire::{LKey, QKey, Qpn, RKey};

use crate::WorkCompletion;
use crate::attr::{AhAttr, QpCap, QpType, SrqAttr};
use crate::config::ContextConfig;
use crate::counters::DeviceCounters;
use crate::device::{Device, Gid, GidEntry, PortAttr};
use crate::error::Result;
use crate::event::AsyncEvent;

/// An open device (`ibv_context`).
pub(crate) trait ContextOps: Send + Sync + Debug {
    fn device(&self) -> &Device;
    fn config(&self) -> &ContextConfig;
    /// The UDP address bound for GID `gid_index`.
    fn local_addr(&self, gid_index: u8) -> Result<SocketAddr>;
    /// GID table entry `index` now (a zero GID for an unused entry).
    fn query_gid(&self, index: u8) -> Result<GidEntry>;
    /// The port's attributes now.
    fn query_port(&self) -> PortAttr;
    fn alloc_pd(&self) -> Arc<dyn PdOps>;
    fn create_cq(&self, cqe: usize) -> Result<Arc<dyn CqOps>>;
    fn poll_async_event(&self) -> Option<AsyncEvent>;
    fn counters(&self) -> DeviceCounters;
}

/// A protection domain (`ibv_pd`). Access flags arrive checked.
pub(crate) trait PdOps: Send + Sync + Debug {
    fn id(&self) -> u32;
    fn reg_mr(&self, buf: Vec<u8>, access: AccessFlags) -> Result<Box<dyn MrOps>>;
    /// Registers caller memory by address.
    ///
    /// # Safety
    /// As [`crate::ProtectionDomain::reg_mr_raw`].
    #[allow(unsafe_code)]
    unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>>;
    fn create_qp(&self, init: &QpInit<'_>) -> Result<Box<dyn QpOps>>;
    fn create_srq(&self, attr: &SrqAttr) -> Result<Box<dyn SrqOps>>;
    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AhOps>>;
}

/// What a provider's `create_qp` gets: [`crate::QpInitAttr`] with the provider objects.
#[derive(Debug)]
pub(crate) struct QpInit<'a> {
    pub(crate) send_cq: &'a dyn CqOps,
    pub(crate) recv_cq: &'a dyn CqOps,
    pub(crate) srq: Option<&'a dyn SrqOps>,
    pub(crate) cap: QpCap,
    pub(crate) qp_type: QpType,
    pub(crate) sq_sig_all: bool,
}

/// A queue pair (`ibv_qp`).
pub(crate) trait QpOps: Send + Sync + Debug {
    fn qp_num(&self) -> Qpn;
    fn device(&self) -> &Device;
    fn cap(&self) -> QpCap;
    /// The IP traffic class the device puts on this QP's packets.
    fn traffic_class(&self) -> u8;
    fn local_udp_port(&self, gid_index: u8) -> Result<u16>;
    fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()>;
    /// Sends to the peer's `port` instead of the RoCEv2 port (a soft-RNIC extension; a
    /// hardware provider refuses it).
    fn set_peer_udp_port(&self, port: u16) -> Result<()>;
    /// Seals and opens every packet of this RC QP from now on (a soft-RNIC extension for
    /// Monel peers; before the QP leaves INIT).
    fn protect(&self, p: &crate::protect::Protection) -> Result<()>;
    fn query(&self) -> Result<(QpState, QpAttr)>;
    fn post_send(&self, wr: SendWr) -> Result<()>;
    fn post_send_inline(&self, wr_id: u64, op: SendOp, data: &[u8], flags: SendFlags)
    -> Result<()>;
    fn post_send_ud(
        &self,
        wr: SendWr,
        ah: &dyn AhOps,
        remote_qpn: Qpn,
        remote_qkey: QKey,
    ) -> Result<()>;
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    fn stats(&self) -> Result<QpStats>;
    fn congestion(&self) -> Result<ControllerMetrics>;
}

/// A completion queue (`ibv_cq`) with its completion channel.
pub(crate) trait CqOps: Send + Sync + Debug {
    /// Appends up to `max` completions to `out`, driving the device first if none is queued.
    fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize;
    /// Appends up to `max` completions already queued to `out`.
    fn poll_queued(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize;
    /// Blocks until a completion is queued or `timeout` passes.
    fn wait(&self, timeout: Duration) -> bool;
    fn overflowed(&self) -> bool;
    fn capacity(&self) -> usize;
    fn req_notify(&self);
    fn get_event(&self) -> bool;
    fn channel_fd(&self) -> BorrowedFd<'_>;
    fn as_any(&self) -> &dyn Any;
}

/// A shared receive queue (`ibv_srq`).
pub(crate) trait SrqOps: Send + Sync + Debug {
    fn id(&self) -> u32;
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    fn set_limit(&self, srq_limit: u32) -> Result<()>;
    fn query(&self) -> Result<(SrqAttr, usize)>;
    fn as_any(&self) -> &dyn Any;
}

/// A registered memory region (`ibv_mr`).
pub(crate) trait MrOps: Send + Sync + Debug {
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
    fn lkey(&self) -> LKey;
    fn rkey(&self) -> RKey;
    fn access(&self) -> AccessFlags;
    /// Runs `f` on the whole region.
    fn with(&self, f: &mut dyn FnMut(&mut [u8]));
    /// The buffer the region owns, locked (None for caller memory).
    fn lock(&self) -> Option<MutexGuard<'_, Box<[u8]>>>;
}

/// An address handle (`ibv_ah`).
pub(crate) trait AhOps: Send + Sync + Debug {
    fn dgid(&self) -> Gid;
    fn as_any(&self) -> &dyn Any;
}
