//! Completion queues (`ibv_cq`): batch polling, blocking waits on the completion channel,
//! and overflow reported as an asynchronous error.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use monel_rc::WorkCompletion;

use crate::provider::CqOps;

/// A completion queue (`ibv_cq`).
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) ops: Arc<dyn CqOps>,
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
        self.ops.poll_into(max, out)
    }
    /// Appends up to `max` completions already queued to `out`, without driving the device
    /// (for a thread about to sleep on the channel: see [`Self::req_notify`]).
    pub fn poll_queued(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        self.ops.poll_queued(max, out)
    }
    /// Blocks until a completion is queued or `timeout` passes (`ibv_req_notify_cq` plus
    /// `ibv_get_cq_event` on a completion channel). Returns true if one is queued. On the
    /// soft RNIC the waiting thread receives and processes the device's packets itself, so
    /// the packet that completes the work wakes it with no hop between threads; on a
    /// busy-polling device it spins on the sockets instead of sleeping.
    pub fn wait(&self, timeout: Duration) -> bool {
        self.ops.wait(timeout)
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
        self.ops.overflowed()
    }
    /// Capacity (`cqe`).
    pub fn capacity(&self) -> usize {
        self.ops.capacity()
    }

    /// Arms the completion channel (`ibv_req_notify_cq`): the next completion makes the
    /// channel's file descriptor ([`AsFd`]) readable, for epoll loops.
    pub fn req_notify(&self) {
        self.ops.req_notify();
    }

    /// Consumes the channel's pending notification (`ibv_get_cq_event`); returns true if
    /// there was one.
    pub fn get_event(&self) -> bool {
        self.ops.get_event()
    }
}

impl AsFd for CompletionQueue {
    /// The completion channel's file descriptor (`ibv_comp_channel.fd`).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ops.channel_fd()
    }
}
