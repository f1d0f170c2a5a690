//! Monel's collective communication library: NCCL's operations, data types and reductions
//! for CPU memory, over shared memory, the soft RNIC and TCP.
//!
//! ```text
//!  Communicator (comm)          init from a unique id or torchrun/Slurm/mpirun variables
//!     |  picks an algorithm (tune) and builds a per-rank Schedule (schedule: plain data)
//!     v
//!  exec: runs the steps          local copy/reduce (buffers, reduce), then sends/receives
//!     |                          framed with the collective's signature (mismatch detection)
//!     v
//!  transport: links to peers     shared memory, RDMA or TCP, chosen per pair (frame: headers)
//! ```
//!
//! The schedules themselves are plain data in `monel-sched`, which also runs them in memory.

mod bootstrap;
mod comm;
mod cpus;
pub mod doctor;
mod error;
mod exec;
mod frame;
#[doc(hidden)]
pub mod fuzzing;
mod liveness;
pub mod log;
pub mod queue;
mod transport;
mod window;

pub use bootstrap::UniqueId;
pub use comm::{
    CommConfig, Communicator, Element, GroupOp, Io, MONITORED_BARRIER_TAG, STASH_MAX, Transports,
};
pub use error::{CclError, ErrorKind, Result};
pub use monel_sched::{Algorithm, Call, Collective, CollectiveKind, DataType, RedOp};
pub use transport::{RdmaConfig, ShmConfig};
pub use window::{MIN_BYTES as WINDOW_MIN_BYTES, Window};
