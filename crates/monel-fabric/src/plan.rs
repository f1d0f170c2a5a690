//! What the planner answers: a collective's time and bus bandwidth on a cluster (NCCL-style
//! channels, each a ring over the GPUs leaving every server through its own NIC rail), a
//! data-parallel training step (gradient buckets all-reduced while backward runs), and the
//! network's price.

use std::collections::HashMap;
use std::fmt;

use monel_ccl::plan::{Algorithm, Collective, schedule};

use crate::cluster::Cluster;
use crate::lockstep::{Lockstep, SymJob, lockstep, symmetric};
use crate::replay::{Job, ReplayError, replay};

/// Which engine runs a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Lockstep where the algorithm is rank-symmetric, else the event engine.
    Auto,
    /// The event engine (asynchronous ranks; up to a few thousand).
    Event,
    /// The lockstep engine (rank-symmetric algorithms; any size).
    Lockstep,
}

/// Ranks above which the event engine refuses (it would take minutes).
pub const EVENT_ENGINE_MAX_RANKS: usize = 4096;

/// A collective to predict.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveSpec {
    /// Which.
    pub coll: Collective,
    /// How.
    pub algo: Algorithm,
    /// Size as nccl-tests gives it: the buffer (all-reduce, broadcast, reduce) or the whole
    /// gathered / scattered / exchanged buffer (all-gather, reduce-scatter, all-to-all).
    pub bytes: u64,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Channels (rings run side by side, each on its own NIC rail; ring algorithms only).
    pub channels: usize,
    /// Ranks (the first `ranks` GPUs; all when 0).
    pub ranks: usize,
}

/// A prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Completion time, seconds.
    pub time_s: f64,
    /// Size over time, bytes per second.
    pub algbw: f64,
    /// nccl-tests' bus bandwidth, bytes per second.
    pub busbw: f64,
    /// The engine that ran.
    pub engine: Engine,
    /// Ranks.
    pub ranks: usize,
    /// Lockstep statistics (link utilization, ECMP collisions), when that engine ran.
    pub stats: Option<Lockstep>,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanError {
    /// A bad request; names the field.
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        why: String,
    },
    /// The replay failed.
    Replay(ReplayError),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { field, why } => write!(f, "{field}: {why}"),
            Self::Replay(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PlanError {}

impl From<ReplayError> for PlanError {
    fn from(e: ReplayError) -> Self {
        Self::Replay(e)
    }
}

fn invalid(field: &'static str, why: impl Into<String>) -> PlanError {
    PlanError::Invalid {
        field,
        why: why.into(),
    }
}

/// nccl-tests' bus bandwidth factor.
pub fn busbw_factor(coll: Collective, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        Collective::AllReduce(_) => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter(_) | Collective::AllToAll => {
            (n - 1.0) / n
        }
        _ => 1.0,
    }
}

/// The GPUs of channel `c` of `channels`, in ring order: server by server, each server's GPUs
/// rotated so that channels enter servers on different GPUs.
pub fn channel_order(cluster: &Cluster, ranks: usize, c: usize, channels: usize) -> Vec<usize> {
    let g = cluster.server.gpus;
    let rot = c * g / channels.max(1);
    let servers_full = ranks / g * g;
    (0..ranks)
        .map(|i| {
            let (s, k) = (i / g, i % g);
            if i >= servers_full {
                i // a partly used last server: no rotation
            } else {
                s * g + (k + rot) % g
            }
        })
        .collect()
}

/// Predicts `spec` on `cluster`; `overhead_s` per message.
pub fn run_collective(
    cluster: &Cluster,
    spec: &CollectiveSpec,
    engine: Engine,
    overhead_s: f64,
) -> Result<Outcome, PlanError> {
    let n = if spec.ranks == 0 {
        cluster.gpus()
    } else {
        spec.ranks
    };
    if n == 0 || n > cluster.gpus() {
        return Err(invalid(
            "ranks",
            format!("{n}: want 1 to {} (the cluster's GPUs)", cluster.gpus()),
        ));
    }
    if spec.elem_bytes == 0 {
        return Err(invalid("elem_bytes", "want at least 1"));
    }
    let ring = spec.algo == Algorithm::Ring;
    let channels = if ring { spec.channels.max(1) } else { 1 };
    let elems = spec.bytes / spec.elem_bytes as u64;
    let per_rank = match spec.coll {
        Collective::AllGather | Collective::ReduceScatter(_) | Collective::AllToAll => {
            elems / n as u64
        }
        _ => elems,
    } as usize;
    if per_rank < channels {
        return Err(invalid(
            "size",
            format!(
                "{} B is less than one element per rank and channel",
                spec.bytes
            ),
        ));
    }
    let slice = 1usize << 17;
    let sched = |count: usize, r: usize| {
        schedule(spec.coll, spec.algo, n, r, count, slice, false)
            .map_err(|e| invalid("algorithm", e.to_string()))
    };
    // Checks the algorithm exists for the collective before anything else.
    sched(per_rank / channels, 0)?;
    let counts: Vec<usize> = (0..channels)
        .map(|c| per_rank / channels + usize::from(c < per_rank % channels))
        .collect();
    let rail = |c: usize| ring.then_some(c % cluster.server.nics);
    let gpus = |c: usize| {
        if ring {
            channel_order(cluster, n, c, channels)
        } else {
            (0..n).collect()
        }
    };
    // Rank 0's schedule and its symmetry, per count (each computed once).
    let mut made: HashMap<usize, (monel_ccl::schedule::Schedule, crate::Symmetry)> = HashMap::new();
    let use_lockstep = match engine {
        Engine::Lockstep => true,
        Engine::Event => false,
        Engine::Auto => match symmetric(n, |r| sched(counts[0], r).expect("checked")) {
            Ok(x) => {
                made.insert(counts[0], x);
                true
            }
            Err(_) => false,
        },
    };
    let mut stats = None;
    let time_s = if use_lockstep {
        let mut jobs = Vec::with_capacity(channels);
        for (c, &count) in counts.iter().enumerate() {
            let (s0, sym) = match made.get(&count) {
                Some(x) => x.clone(),
                None => {
                    let x = symmetric(n, |r| sched(count, r).expect("checked"))?;
                    made.insert(count, x.clone());
                    x
                }
            };
            jobs.push(SymJob {
                gpus: gpus(c),
                schedule: s0,
                symmetry: sym,
                rail: rail(c),
                elem_bytes: spec.elem_bytes,
            });
        }
        let l = lockstep(cluster, &jobs, overhead_s)?;
        let t = l.time_s;
        stats = Some(l);
        t
    } else {
        if n > EVENT_ENGINE_MAX_RANKS {
            return Err(invalid(
                "engine",
                format!(
                    "the event engine takes at most {EVENT_ENGINE_MAX_RANKS} ranks, not {n}; \
                     {} is not rank-symmetric, so the lockstep engine cannot run it: pick ring",
                    spec.algo.name()
                ),
            ));
        }
        let mut jobs = Vec::with_capacity(channels);
        for (c, &count) in counts.iter().enumerate() {
            let schedules = (0..n)
                .map(|r| sched(count, r))
                .collect::<Result<Vec<_>, _>>()?;
            jobs.push(Job {
                gpus: gpus(c),
                schedules,
                rail: rail(c),
                elem_bytes: spec.elem_bytes,
            });
        }
        replay(cluster, &jobs, overhead_s)?.time_s
    };
    let algbw = if time_s > 0.0 {
        spec.bytes as f64 / time_s
    } else {
        f64::INFINITY
    };
    Ok(Outcome {
        time_s,
        algbw,
        busbw: algbw * busbw_factor(spec.coll, n),
        engine: if use_lockstep {
            Engine::Lockstep
        } else {
            Engine::Event
        },
        ranks: n,
        stats,
    })
}

/// A data-parallel training step: forward, then backward producing gradients in buckets
/// (last layer first, evenly over backward), each all-reduced as soon as it is ready and the
/// previous one is done (DDP's overlap), then the optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct Training {
    /// Forward time, seconds.
    pub forward_s: f64,
    /// Backward time, seconds.
    pub backward_s: f64,
    /// Optimizer time, seconds.
    pub optimizer_s: f64,
    /// Gradient bytes per step.
    pub gradient_bytes: u64,
    /// Bucket size, bytes (DDP's bucket_cap_mb).
    pub bucket_bytes: u64,
}

/// A training step's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Step time, seconds.
    pub step_s: f64,
    /// Forward, backward and optimizer, seconds.
    pub compute_s: f64,
    /// Communication not hidden behind backward, seconds.
    pub exposed_s: f64,
    /// All-reduce time of all buckets back to back, seconds.
    pub allreduce_s: f64,
    /// Buckets.
    pub buckets: usize,
}

/// Predicts a training step whose buckets are all-reduced with `spec` (its size is ignored).
pub fn training_step(
    cluster: &Cluster,
    t: &Training,
    spec: &CollectiveSpec,
    engine: Engine,
    overhead_s: f64,
) -> Result<StepReport, PlanError> {
    for (field, v) in [
        ("forward", t.forward_s),
        ("backward", t.backward_s),
        ("optimizer", t.optimizer_s),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(invalid(field, format!("{v} s: want a non-negative time")));
        }
    }
    if t.gradient_bytes == 0 || t.bucket_bytes == 0 {
        return Err(invalid(
            "gradients",
            "want gradient and bucket sizes above 0",
        ));
    }
    let full = (t.gradient_bytes / t.bucket_bytes) as usize;
    let mut sizes = vec![t.bucket_bytes; full];
    if t.gradient_bytes % t.bucket_bytes > 0 {
        sizes.push(t.gradient_bytes % t.bucket_bytes);
    }
    let mut memo: HashMap<u64, f64> = HashMap::new();
    let (mut done, mut ready_bytes, mut total) = (0.0f64, 0u64, 0.0);
    for &b in &sizes {
        let dt = match memo.get(&b) {
            Some(&x) => x,
            None => {
                let s = CollectiveSpec {
                    bytes: b,
                    ..spec.clone()
                };
                let x = run_collective(cluster, &s, engine, overhead_s)?.time_s;
                memo.insert(b, x);
                x
            }
        };
        ready_bytes += b;
        let ready = t.forward_s + t.backward_s * ready_bytes as f64 / t.gradient_bytes as f64;
        done = done.max(ready) + dt;
        total += dt;
    }
    let compute = t.forward_s + t.backward_s + t.optimizer_s;
    let step = done.max(t.forward_s + t.backward_s) + t.optimizer_s;
    Ok(StepReport {
        step_s: step,
        compute_s: compute,
        exposed_s: step - compute,
        allreduce_s: total,
        buckets: sizes.len(),
    })
}

/// Prices of the parts, in any one currency.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prices {
    /// Per switch port in use (so chassis and fixed switches compare).
    pub switch_port: f64,
    /// Per NIC.
    pub nic: f64,
    /// Per cable (one per link pair).
    pub cable: f64,
    /// Per optical transceiver (two per switch-to-switch cable; endpoint cables are copper).
    pub optic: f64,
}

/// The network's bill of materials and price.
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    /// Switches.
    pub switches: usize,
    /// Switch ports in use.
    pub switch_ports: usize,
    /// NICs.
    pub nics: usize,
    /// Cables (endpoint-to-switch and switch-to-switch).
    pub cables: usize,
    /// Optics.
    pub optics: usize,
    /// Total price.
    pub total: f64,
    /// Price per GPU.
    pub per_gpu: f64,
}

/// What the network of `cluster` costs at `prices` for `gpus` GPUs (the servers they fill;
/// every switch built is paid for, partly filled or not).
pub fn cost(cluster: &Cluster, prices: &Prices, gpus: usize) -> Cost {
    use crate::topology::LinkKind;
    let f = &cluster.fabric;
    let count = |k: LinkKind| (0..f.links()).filter(|&l| f.kind[l] == k).count() / 2;
    let fabric = count(LinkKind::Fabric);
    let switches = f.billed_switches;
    let nics = gpus.div_ceil(cluster.server.gpus) * cluster.server.nics;
    let edge = nics;
    let optics = 2 * fabric;
    let switch_ports = edge + 2 * fabric;
    let total = switch_ports as f64 * prices.switch_port
        + nics as f64 * prices.nic
        + (edge + fabric) as f64 * prices.cable
        + optics as f64 * prices.optic;
    Cost {
        switches,
        switch_ports,
        nics,
        cables: edge + fabric,
        optics,
        total,
        per_gpu: total / gpus.max(1) as f64,
    }
}
