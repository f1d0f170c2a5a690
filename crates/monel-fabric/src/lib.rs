//! Monel's fabric planner: RDMA fabrics (leaf-spine, k-ary fat-trees, rail-optimized) with
//! ECMP, servers of GPUs and NICs on them, and Monel's own collective schedules
//! (`monel-sched`'s plain data, replayed, not re-implemented) running on them in a fluid model
//! that shares links max-min fairly; training steps and prices on top.
//!
//! ```text
//! units (400Gbps, 1us) --> LeafSpine | FatTree | RailOptimized --> Fabric --+ Server --> Cluster
//! monel_sched::plan::schedule(...) --> engine::event (async ranks, <= 4096 ranks)
//!                                --> engine::lockstep (symmetric algorithms, 100,000 GPUs)
//!                                --> engine::packet (PFC, ECN, DCQCN)
//! scenario: collectives (NCCL-style channels on NIC rails), training steps, cost
//! design (config: TOML in) --> report (text, sweep rows; `monel fabric sweep` charts them)
//! ```
//! Everything is deterministic: the same inputs give the same answer, bit for bit.

#![forbid(unsafe_code)]
pub mod cluster;
mod config;
mod design;
pub mod engine;
mod error;
pub mod flows;
mod radix;
mod report;
pub mod scenario;
pub mod topology;
pub mod traffic;
pub mod tuner;
pub mod units;

pub use cluster::{Cluster, Server};
pub use config::parse_design;
pub use design::{Design, Transport};
pub use engine::event::{Job, Replay, ReplayError, replay, sport};
pub use engine::flow::{drain, drain_timed, max_min_rates, max_min_rates_by};
pub use engine::lockstep::{Lockstep, SymJob, Symmetry, lockstep, symmetric};
pub use engine::packet::{
    Ecn, Flow, FlowControl, PacketError, PacketParams, PacketReport, Sample,
    simulate_dependent_flows, simulate_flows, simulate_jobs,
};
pub use error::{ConfigError, PlanError};
pub use flows::{FlowEngine, TrafficReport, run_traffic};
pub use report::{Report, SweepRow, evaluate};
pub use scenario::{
    Background, CollectiveSpec, Cost, Engine, Outcome, PACKET_ENGINE_MAX_PACKETS, Placement,
    Prices, Scenario, StepReport, Training, busbw_factor, cost, run_collective, run_scenario,
    training_step,
};
pub use topology::{
    Fabric, FatTree, LeafSpine, LinkId, LinkKind, RailOptimized, Routing, TopologyError,
};
pub use traffic::{TrafficError, TrafficFlow, parse_cm, parse_csv, parse_pins, sport_for_spine};
pub use units::{UnitError, parse_bandwidth, parse_bytes, parse_time};
