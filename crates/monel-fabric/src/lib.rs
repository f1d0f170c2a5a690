//! Monel's fabric planner (first slice): leaf-spine fabrics with ECMP, a flow-level engine
//! that shares links max-min fairly, and Monel's own collective schedules (`monel-ccl`'s plain
//! data, replayed step by step, not re-implemented) running on them.
//!
//! ```text
//! units (400Gbps, 1us) --> LeafSpine --paths (ECMP by 5-tuple hash)--> Fabric
//! monel_ccl::plan::schedule(...) per rank --replay--> flows --max-min fair--> completion time
//! ```
//! Everything is deterministic: the same inputs give the same answer, bit for bit.

pub mod flow;
pub mod replay;
pub mod topology;
pub mod units;

pub use flow::{Flow, max_min_rates};
pub use replay::{Replay, ReplayError, replay};
pub use topology::{Fabric, LeafSpine, LinkId, TopologyError};
pub use units::{UnitError, parse_bandwidth, parse_bytes, parse_time};
