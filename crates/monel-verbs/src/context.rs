//! An open device (`ibv_context`): where protection domains and completion queues come from.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::ContextConfig;
use crate::counters::DeviceCounters;
use crate::cq::CompletionQueue;
use crate::device::{Device, GidEntry, PortAttr};
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::limits;
use crate::pd::ProtectionDomain;
use crate::provider::ContextOps;

/// An open device (`ibv_context`). On the soft RNIC: its sockets and its progress thread,
/// which stop when the context and every object made from it are dropped.
#[derive(Debug)]
pub struct Context {
    ops: Arc<dyn ContextOps>,
}

impl Context {
    /// Opens `device` (`ibv_open_device`). On the soft RNIC: binds a UDP socket on every
    /// GID's address and starts the progress thread.
    pub fn open(device: &Device, config: ContextConfig) -> Result<Self> {
        if config.batch == 0 || config.batch > 1024 {
            return Err(VerbsError::invalid(
                "ibv_open_device",
                "batch must be 1..=1024",
            ));
        }
        Ok(Self {
            ops: crate::providers::open(device, config)?,
        })
    }

    /// The device, as listed when it was opened.
    pub fn device(&self) -> &Device {
        self.ops.device()
    }
    /// The configuration.
    pub fn config(&self) -> &ContextConfig {
        self.ops.config()
    }
    /// GID table entry `index` as it is now (`ibv_query_gid`): a soft device's table follows
    /// its interface's addresses (an address that appears takes the first unused index; one
    /// that goes leaves its entry zero), so a GID is read here rather than from the listing
    /// in [`Self::device`]. An index past the table is an error; an unused one is a zero GID.
    pub fn query_gid(&self, index: u8) -> Result<GidEntry> {
        self.ops.query_gid(index)
    }
    /// The port's attributes as they are now (`ibv_query_port`): state, MTUs, GID table
    /// length.
    pub fn query_port(&self) -> PortAttr {
        self.ops.query_port()
    }
    /// The UDP address bound for GID `index`.
    pub fn local_addr(&self, gid_index: u8) -> Result<SocketAddr> {
        self.ops.local_addr(gid_index)
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            ops: self.ops.alloc_pd(),
        }
    }

    /// Creates a completion queue with room for `cqe` completions (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: usize) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > limits::MAX_CQE {
            return Err(VerbsError::invalid(
                "ibv_create_cq",
                format!("cqe {cqe} not in 1..={}", limits::MAX_CQE),
            ));
        }
        Ok(CompletionQueue {
            ops: self.ops.create_cq(cqe)?,
        })
    }

    /// The next asynchronous event, if any (`ibv_get_async_event`).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.ops.poll_async_event()
    }

    /// Device counters, with the per-QP counters summed in (`rdma statistic`).
    pub fn counters(&self) -> DeviceCounters {
        self.ops.counters()
    }
}
