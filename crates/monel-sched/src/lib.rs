//! Monel's collectives as plain data: what each rank sends, receives, copies and reduces,
//! with no I/O and no unsafe code.
//!
//! ```text
//!  plan      a collective call -> the algorithm's per-rank Schedule (NCCL's layouts)
//!  tune      the cost model that picks the algorithm per transport
//!  schedule  the steps: local copy/reduce/divide, then sends and receives
//!  buffers   the memory a schedule runs on, with the local operations
//!  dtype, reduce, fp8   element types and reduction kernels
//!  sim       every rank's schedule run in memory: the oracle of the property tests
//! ```
//!
//! `monel-ccl` runs these schedules over real transports; `monel-fabric` replays them on a
//! simulated cluster.
#![forbid(unsafe_code)]

pub mod buffers;
pub mod dtype;
pub mod error;
pub mod fp8;
pub mod plan;
pub mod reduce;
pub mod schedule;
pub mod sim;
pub mod tune;

pub use dtype::{DataType, RedOp};
pub use error::{SchedError, SchedErrorKind};
pub use plan::{Algorithm, Call, Collective, CollectiveKind, ScheduleRequest};
