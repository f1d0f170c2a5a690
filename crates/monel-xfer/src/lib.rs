//! Monel's transfer engine for inference memory: KV-cache blocks and other buffers moved
//! between processes by one-sided READ and WRITE, as Mooncake's Transfer Engine and NVIDIA's
//! NIXL move them. This crate is the engine's protocol, sans IO:
//!
//! - [`segment`]: named, registered memory an agent publishes (one or more buffers each),
//!   and where a range of it lies;
//! - [`batch`]: a batch of transfer descriptors, checked one by one, cut into slices spread
//!   over lanes, completions gathered per descriptor, the notification released once the
//!   data is in place;
//! - [`notify`]: notifications numbered per sender, each taken once;
//! - [`wire`]: the messages agents exchange (segment tables, notifications, withdrawals),
//!   every count bounded before allocation.
//!
//! See `docs/xfer.md` for the model next to Mooncake's and NIXL's.

pub mod batch;
pub mod error;
pub mod notify;
pub mod segment;
pub mod wire;

pub use batch::{Batch, Desc, DescState, Op, Plan, Slice};
pub use error::{Result, XferError};
pub use notify::{Inbox, Notification, Outbox};
pub use segment::{Buffer, Location, Segment, SegmentTable};
pub use wire::Msg;
