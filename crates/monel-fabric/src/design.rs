//! A design: a cluster, the collective to predict on it, and what else a design file says
//! (training step, prices, engine, competing traffic).

use crate::cluster::Cluster;
use crate::scenario::{CollectiveSpec, Engine, Prices, Scenario, Training};
use crate::tuner::Choice;

/// Fabric transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// RoCEv2: ECMP by 5-tuple hash.
    Roce,
    /// InfiniBand: static D-mod-k fat-tree routing.
    Infiniband,
}

/// A design, parsed and built.
#[derive(Debug, Clone)]
pub struct Design {
    /// Its name (the `name` key, else the caller's).
    pub name: String,
    /// GPUs used.
    pub gpus: usize,
    /// Transport.
    pub transport: Transport,
    /// The cluster (it may hold more GPUs than used: the last leaf or unit partly filled).
    pub cluster: Cluster,
    /// The collective to predict.
    pub spec: CollectiveSpec,
    /// Why its algorithm was chosen, when NCCL's tuner chose it (`algorithm = "auto"`);
    /// `None` when the design forced one. Training buckets are chosen for by size too.
    pub choice: Option<Choice>,
    /// A training step, if given.
    pub training: Option<Training>,
    /// Prices, if given.
    pub prices: Option<Prices>,
    /// Per-message overhead, seconds.
    pub overhead_s: f64,
    /// Engine.
    pub engine: Engine,
    /// Packet-engine settings and competing jobs.
    pub scenario: Scenario,
}
