//! Completion queues with batch polling, blocking waits (the completion channel) and overflow
//! reported as an asynchronous error.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use monel_rc::WorkCompletion;
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::context::DevShared;
use crate::error::{Result, VerbsError};

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

/// A completion queue (`ibv_cq`).
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
}

impl CompletionQueue {
    /// Takes up to `max` completions (`ibv_poll_cq`).
    pub fn poll(&self, max: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out);
        out
    }
    /// Appends up to `max` completions to `out`; returns how many. When the queue is empty,
    /// the calling thread first receives and processes what the device's sockets hold
    /// (without blocking), as a NIC would have done meanwhile.
    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        if !self.shared.has_completions() {
            if let Some(dev) = self.shared.dev.upgrade() {
                crate::engine::progress_once(&dev);
            }
        }
        self.poll_queued(max, out)
    }
    /// Appends up to `max` completions already queued to `out`, without driving the device
    /// (for a thread about to sleep on the channel: see [`Self::req_notify`]).
    pub fn poll_queued(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let mut s = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = max.min(s.wcs.len());
        out.extend(s.wcs.drain(..n));
        n
    }
    /// Blocks until a completion is queued or `timeout` passes (`ibv_req_notify_cq` plus
    /// `ibv_get_cq_event` on a completion channel). Returns true if one is queued. The
    /// waiting thread receives and processes the device's packets itself, so the packet that
    /// completes the work wakes it with no hop between threads; on a busy-polling device it
    /// spins on the sockets instead of sleeping.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        match self.shared.dev.upgrade() {
            Some(dev) => crate::engine::wait_cq(&dev, &self.shared, deadline),
            // The device is gone: nothing more can arrive.
            None => self.shared.has_completions(),
        }
    }
    /// Polls until `n` completions arrived or `timeout` passed; returns what arrived.
    pub fn poll_n(&self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        // Waiting first: on a sleeping device the wait's ppoll is the only look at the
        // sockets an empty queue needs.
        while out.len() < n {
            if !self.wait(deadline.saturating_duration_since(Instant::now())) {
                break;
            }
            self.poll_into(n - out.len(), &mut out);
        }
        out
    }
    /// True once a completion was dropped because the queue was full (also reported as
    /// [`crate::AsyncEvent::CqError`]).
    pub fn overflowed(&self) -> bool {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .overflowed
    }
    /// Capacity (`cqe`).
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Arms the completion channel (`ibv_req_notify_cq`): the next completion makes the
    /// channel's file descriptor ([`AsFd`]) readable, for epoll loops.
    pub fn req_notify(&self) {
        self.shared.req_notify();
        // The caller is about to sleep on the channel and no longer drives the sockets: the
        // progress thread must watch them (it leaves them alone while threads poll).
        if let Some(dev) = self.shared.dev.upgrade() {
            // Responses this thread deferred to its next post go now: it is not posting.
            crate::engine::send_deferred(&dev);
            dev.last_poll_ns.store(0, Ordering::SeqCst);
            if !dev.engine_watches.load(Ordering::SeqCst) {
                dev.ring();
            }
        }
    }

    /// Consumes the channel's pending notification (`ibv_get_cq_event`); returns true if
    /// there was one.
    pub fn get_event(&self) -> bool {
        self.shared.channel.read().is_ok()
    }
}

impl AsFd for CompletionQueue {
    /// The completion channel's file descriptor (`ibv_comp_channel.fd`).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.channel.as_fd()
    }
}
