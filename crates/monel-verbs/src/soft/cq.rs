//! The soft RNIC's completion queues: the queue the engine pushes completions into, its
//! completion channel (an eventfd), and polling that drives the device when it is empty.

use std::any::Any;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use monel_rc::WorkCompletion;

use super::engine;
use super::queues::CqShared;
use super::shared::DevShared;
use crate::error::{Result, VerbsError};
use crate::provider::CqOps;

/// A completion queue of the soft RNIC (the handle the API holds).
#[derive(Debug)]
pub(crate) struct SoftCq {
    pub(crate) cq: Arc<CqShared>,
    /// The device, whose sockets a waiting thread drives.
    pub(crate) dev: Weak<DevShared>,
}

impl SoftCq {
    /// The soft RNIC's queue behind `cq`; an error if another provider made it.
    pub(crate) fn of(cq: &dyn CqOps) -> Result<Arc<CqShared>> {
        cq.as_any()
            .downcast_ref::<Self>()
            .map(|c| c.cq.clone())
            .ok_or_else(|| {
                VerbsError::invalid(
                    "ibv_create_qp",
                    "init_attr.send_cq/recv_cq belongs to another device",
                )
            })
    }
}

impl CqOps for SoftCq {
    fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        if !self.cq.has_completions() {
            if let Some(dev) = self.dev.upgrade() {
                engine::progress_once(&dev);
            }
        }
        self.poll_queued(max, out)
    }

    fn poll_queued(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let mut s = self.cq.state.lock().unwrap_or_else(PoisonError::into_inner);
        let n = max.min(s.wcs.len());
        out.extend(s.wcs.drain(..n));
        n
    }

    fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        match self.dev.upgrade() {
            Some(dev) => engine::wait_cq(&dev, &self.cq, deadline),
            // The device is gone: nothing more can arrive.
            None => self.cq.has_completions(),
        }
    }

    fn overflowed(&self) -> bool {
        self.cq
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .overflowed
    }

    fn capacity(&self) -> usize {
        self.cq.capacity
    }

    fn req_notify(&self) {
        self.cq.req_notify();
        // The caller is about to sleep on the channel and no longer drives the sockets: the
        // progress thread must watch them (it leaves them alone while threads poll).
        if let Some(dev) = self.dev.upgrade() {
            // Responses this thread deferred to its next post go now: it is not posting.
            engine::send_deferred(&dev);
            dev.last_poll_ns.store(0, Ordering::SeqCst);
            if !dev.engine_watches.load(Ordering::SeqCst) {
                dev.ring();
            }
        }
    }

    fn get_event(&self) -> bool {
        self.cq.channel.read().is_ok()
    }

    fn channel_fd(&self) -> BorrowedFd<'_> {
        self.cq.channel.as_fd()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
