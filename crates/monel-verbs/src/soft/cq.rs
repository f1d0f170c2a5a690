//! The soft RNIC's completion queues: the queue the engine pushes completions into, its
//! completion channel (an eventfd), and polling that drives the device when it is empty.

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use monel_rc::WorkCompletion;
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::engine;
use super::shared::DevShared;
use crate::cq::CompletionQueue;
use crate::error::{Result, VerbsError};
use crate::provider::CqOps;

#[derive(Debug, Default)]
struct CqState {
    wcs: VecDeque<WorkCompletion>,
    overflowed: bool,
}

/// The part of a CQ the progress engine shares.
#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) id: u32,
    capacity: usize,
    state: Mutex<CqState>,
    /// The completion channel: written once per `req_notify` when a completion arrives.
    pub(crate) channel: EventFd,
    armed: AtomicBool,
    /// The device, whose sockets a waiting thread drives.
    dev: Weak<DevShared>,
}

impl CqShared {
    pub(crate) fn new(id: u32, capacity: usize, dev: Weak<DevShared>) -> Result<Self> {
        let channel = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| VerbsError::io("ibv_create_comp_channel", e))?;
        Ok(Self {
            id,
            capacity,
            state: Mutex::new(CqState::default()),
            channel,
            armed: AtomicBool::new(false),
            dev,
        })
    }

    pub(crate) fn has_completions(&self) -> bool {
        !self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .wcs
            .is_empty()
    }

    /// Arms the channel: the next completion writes it (`ibv_req_notify_cq`).
    pub(crate) fn req_notify(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// Disarms the channel without consuming a notification already written.
    pub(crate) fn disarm(&self) {
        self.armed.store(false, Ordering::Release);
    }

    /// Adds completions; returns false (and drops the overflow) if the queue was full.
    pub(crate) fn push(&self, wcs: impl IntoIterator<Item = WorkCompletion>) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ok = true;
        let mut any = false;
        for wc in wcs {
            if s.wcs.len() >= self.capacity {
                s.overflowed = true;
                ok = false;
                continue;
            }
            s.wcs.push_back(wc);
            any = true;
        }
        if any {
            // Threads waiting on this CQ sleep on the channel when armed (see `wait_cq`).
            if self.armed.swap(false, Ordering::AcqRel) {
                let _ = self.channel.write(1);
            }
        }
        ok
    }
}

/// A completion queue of the soft RNIC (the handle the API holds).
#[derive(Debug)]
pub(crate) struct SoftCq(pub(crate) Arc<CqShared>);

impl SoftCq {
    /// The soft RNIC's queue behind `cq`; an error if another provider made it.
    pub(crate) fn of(cq: &CompletionQueue) -> Result<Arc<CqShared>> {
        cq.ops
            .as_any()
            .downcast_ref::<Self>()
            .map(|c| c.0.clone())
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
        if !self.0.has_completions() {
            if let Some(dev) = self.0.dev.upgrade() {
                engine::progress_once(&dev);
            }
        }
        self.poll_queued(max, out)
    }

    fn poll_queued(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let mut s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        let n = max.min(s.wcs.len());
        out.extend(s.wcs.drain(..n));
        n
    }

    fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        match self.0.dev.upgrade() {
            Some(dev) => engine::wait_cq(&dev, &self.0, deadline),
            // The device is gone: nothing more can arrive.
            None => self.0.has_completions(),
        }
    }

    fn overflowed(&self) -> bool {
        self.0
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .overflowed
    }

    fn capacity(&self) -> usize {
        self.0.capacity
    }

    fn req_notify(&self) {
        self.0.req_notify();
        // The caller is about to sleep on the channel and no longer drives the sockets: the
        // progress thread must watch them (it leaves them alone while threads poll).
        if let Some(dev) = self.0.dev.upgrade() {
            // Responses this thread deferred to its next post go now: it is not posting.
            engine::send_deferred(&dev);
            dev.last_poll_ns.store(0, Ordering::SeqCst);
            if !dev.engine_watches.load(Ordering::SeqCst) {
                dev.ring();
            }
        }
    }

    fn get_event(&self) -> bool {
        self.0.channel.read().is_ok()
    }

    fn channel_fd(&self) -> BorrowedFd<'_> {
        self.0.channel.as_fd()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
