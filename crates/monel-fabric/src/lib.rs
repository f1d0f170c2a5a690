//! Monel's fabric planner: RDMA fabrics (leaf-spine, k-ary fat-trees, rail-optimized) with
//! ECMP, servers of GPUs and NICs on them, and Monel's own collective schedules
//! (`monel-ccl`'s plain data, replayed, not re-implemented) running on them in a fluid model
//! that shares links max-min fairly; training steps and prices on top.
//!
//! ```text
//! units (400Gbps, 1us) --> LeafSpine | FatTree | RailOptimized --> Fabric --+ Server --> Cluster
//! monel_sched::plan::schedule(...) --> replay (event engine, async ranks, <= 4096 ranks)
//!                                --> lockstep (rank- or host-symmetric algorithms, 100,000 GPUs)
//! plan: collectives (NCCL-style channels on NIC rails), training steps, cost
//! ```
//! Everything is deterministic: the same inputs give the same answer, bit for bit.

pub mod cluster;
pub mod config;
pub mod flow;
pub mod lockstep;
pub mod packet;
pub mod plan;
mod radix;
pub mod replay;
pub mod topology;
pub mod units;

pub use cluster::{Cluster, Server};
pub use config::{
    ConfigError, Design, Report, SweepRow, Transport, evaluate, parse_design, svg_chart,
};
pub use flow::{drain, max_min_rates, max_min_rates_by};
pub use lockstep::{Lockstep, SymJob, Symmetry, lockstep, symmetric};
pub use packet::{
    Ecn, Flow, FlowControl, PacketError, PacketParams, PacketReport, Sample, simulate_flows,
    simulate_jobs,
};
pub use plan::{
    Background, CollectiveSpec, Cost, Engine, Outcome, PACKET_ENGINE_MAX_PACKETS, Placement,
    PlanError, Prices, Scenario, StepReport, Training, busbw_factor, cost, run_collective,
    run_scenario, training_step,
};
pub use replay::{Job, Replay, ReplayError, replay, sport};
pub use topology::{
    Fabric, FatTree, LeafSpine, LinkId, LinkKind, RailOptimized, Routing, TopologyError,
};
pub use units::{UnitError, parse_bandwidth, parse_bytes, parse_time};
