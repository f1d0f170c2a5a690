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
//!  links to peers (link, tcp)    byte streams; a status endpoint names missing ranks on timeout
//! ```
//!
//! The same schedules run in memory in [`sim`], which the property tests use.

pub mod bootstrap;
pub mod buffers;
pub mod comm;
pub mod copy;
mod cpus;
pub mod dtype;
pub mod error;
mod exec;
pub mod fp8;
pub mod link;
pub mod plan;
pub mod rdma;
pub mod reduce;
pub mod schedule;
pub mod shm;
pub mod sim;
pub mod tune;
pub mod window;

pub use bootstrap::UniqueId;
pub use comm::{CommConfig, Communicator, GroupOp, Io};
pub use dtype::{DataType, RedOp};
pub use error::{CclError, ErrorKind, Result};
pub use plan::{Algorithm, Collective};
pub use window::Window;
