//! The device side of the soft RNIC's queues, which the engine fills and drains: completion
//! queues with their channel, and shared receive queues.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use monel_rc::{RecvWr, WorkCompletion};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::attr::SrqAttr;
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;

#[derive(Debug, Default)]
pub(crate) struct CqState {
    pub(crate) wcs: VecDeque<WorkCompletion>,
    pub(crate) overflowed: bool,
}

/// The part of a CQ the progress engine shares.
#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) id: u32,
    pub(crate) capacity: usize,
    pub(crate) state: Mutex<CqState>,
    /// The completion channel: written once per `req_notify` when a completion arrives.
    pub(crate) channel: EventFd,
    armed: AtomicBool,
}

impl CqShared {
    pub(crate) fn new(id: u32, capacity: usize) -> Result<Self> {
        let channel = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| VerbsError::io("ibv_create_comp_channel", e))?;
        Ok(Self {
            id,
            capacity,
            state: Mutex::new(CqState::default()),
            channel,
            armed: AtomicBool::new(false),
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

/// The device's copy of an SRQ.
#[derive(Debug)]
pub(crate) struct SrqState {
    pub(crate) attr: SrqAttr,
    pub(crate) queue: VecDeque<RecvWr>,
    /// QPs attached; the SRQ is removed with its handle only when none is left.
    pub(crate) users: usize,
    /// The handle was dropped while QPs still used it.
    pub(crate) orphaned: bool,
}

impl SrqState {
    /// Takes the next WQE; raises the limit event into `events` when it falls below.
    pub(crate) fn take(&mut self, id: u32, events: &mut VecDeque<AsyncEvent>) -> Option<RecvWr> {
        let wr = self.queue.pop_front()?;
        let limit = self.attr.srq_limit;
        if limit > 0 && (self.queue.len() as u32) < limit {
            self.attr.srq_limit = 0;
            events.push_back(AsyncEvent::SrqLimitReached(id));
        }
        Some(wr)
    }

    /// A QP detached; true if the SRQ should now go.
    pub(crate) fn detach(&mut self) -> bool {
        self.users -= 1;
        self.users == 0 && self.orphaned
    }
}
