//! Monel's transfer engine for inference memory: KV-cache blocks and other buffers moved
//! between processes by one-sided READ and WRITE, as Mooncake's Transfer Engine and NVIDIA's
//! NIXL move them. The engine's protocol, sans IO:
//!
//! - [`segment`]: named, registered memory an agent publishes (one or more buffers each),
//!   and where a range of it lies;
//! - [`batch`]: a batch of transfer descriptors, checked one by one, cut into slices spread
//!   over lanes, completions gathered per descriptor, the notification released once the
//!   data is in place;
//! - [`notify`]: notifications numbered per sender, each taken once;
//! - [`wire`]: the messages agents exchange (segment tables, notifications, withdrawals),
//!   every count bounded before allocation;
//! - [`stream`]: the TCP transport's opening, proofs and frames;
//!
//! and its I/O edges: [`registry`], where agents of a job find each other by name (etcd);
//! [`agent`]: an agent that reaches each peer over shared memory (a process on the same
//! host), RDMA (Monel's verbs: the soft RNIC, or a kernel RDMA device; authenticated RC
//! queue pairs) or, where neither works, authenticated TCP connections.
//!
//! See `docs/xfer.md` for the model next to Mooncake's and NIXL's.

pub mod agent;
pub mod batch;
pub mod error;
pub mod notify;
pub mod registry;
pub mod segment;
pub mod stream;
pub mod wire;

pub use agent::{Agent, AgentConfig, BatchId, Transport};
pub use batch::{Batch, Desc, DescState, Op, Plan, Slice};
pub use error::{Cause, Result, XferError};
pub use monel_peer::TransportKind;
pub use notify::{Inbox, Notification, Outbox};
pub use registry::Registry;
pub use segment::{Buffer, Location, Segment, SegmentTable};
pub use wire::Msg;
