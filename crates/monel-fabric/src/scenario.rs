//! What the planner answers: a collective's time and bus bandwidth on a cluster (NCCL-style
//! channels, each a ring over the GPUs leaving every server through its own NIC rail), a
//! data-parallel training step (gradient buckets all-reduced while backward runs), and the
//! network's price.

use std::collections::HashMap;
use std::sync::Arc;

use monel_sched::plan::{Algorithm, Collective, ScheduleRequest};
use monel_sched::schedule::Schedule;

use crate::cluster::Cluster;
use crate::engine::event::{Job, replay};
use crate::engine::lockstep::{Lockstep, SymJob, Symmetry, lockstep, symmetric};
use crate::engine::packet::{PacketParams, PacketReport, simulate_jobs};
use crate::error::{PlanError, invalid};
use crate::tuner::{Choice, nccl_choice};

/// Which engine runs a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Lockstep where the algorithm is rank-symmetric, else the event engine.
    Auto,
    /// The event engine (asynchronous ranks; up to a few thousand).
    Event,
    /// The lockstep engine (rank-symmetric algorithms; any size).
    Lockstep,
    /// The packet engine (PFC, ECN, DCQCN, credits, adaptive routing; up to about a
    /// thousand endpoints).
    Packet,
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

impl CollectiveSpec {
    /// Takes the algorithm NCCL's tuner would run for this collective, size and rank count
    /// on `cluster` (see [`crate::tuner`]), and says why; `None` (the algorithm kept) for
    /// collectives NCCL does not tune.
    pub fn tune(&mut self, cluster: &Cluster) -> Option<Choice> {
        let ranks = if self.ranks == 0 {
            cluster.gpus()
        } else {
            self.ranks
        };
        let choice = nccl_choice(cluster, self.coll, ranks, self.bytes, self.channels)?;
        self.algo = choice.algo;
        Some(choice)
    }
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
    /// What the packet engine saw (pauses, marks, queues), when it ran.
    pub packet: Option<PacketReport>,
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

/// A competing job: its own collective (`ranks` must be set) on its own servers, started
/// together with the one predicted, sharing the fabric with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Background {
    /// Its collective.
    pub spec: CollectiveSpec,
}

/// How the planned job and the competing ones take servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// The planned job on the first servers, each competing job on the next ones (jobs
    /// meet only where a switch serves both).
    #[default]
    Packed,
    /// Servers dealt round-robin to the jobs (a fragmented scheduler): jobs share leaves.
    Interleaved,
}

/// What else shapes a prediction: the packet engine's settings and competing jobs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scenario {
    /// Settings of the packet engine (`None`: [`PacketParams::for_fabric`]).
    pub packet: Option<PacketParams>,
    /// Competing jobs.
    pub background: Vec<Background>,
    /// Where the jobs run.
    pub placement: Placement,
}

impl Scenario {
    /// The servers of each job (planned first), for jobs of `ranks` GPUs on `cluster`.
    fn servers(&self, cluster: &Cluster, ranks: &[usize]) -> Result<Vec<Vec<usize>>, PlanError> {
        let per = cluster.server.gpus;
        let mut need: Vec<usize> = ranks.iter().map(|r| r.div_ceil(per)).collect();
        let total: usize = need.iter().sum();
        if total > cluster.servers() {
            return Err(invalid(
                "background",
                format!(
                    "the jobs need {total} servers of {per} GPUs; the cluster has {}",
                    cluster.servers()
                ),
            ));
        }
        let mut out = vec![Vec::new(); ranks.len()];
        let mut next = 0;
        match self.placement {
            Placement::Packed => {
                for (j, k) in need.iter().enumerate() {
                    out[j] = (next..next + k).collect();
                    next += k;
                }
            }
            Placement::Interleaved => {
                while next < total {
                    for (j, k) in need.iter_mut().enumerate() {
                        if *k > 0 {
                            out[j].push(next);
                            next += 1;
                            *k -= 1;
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Packets above which the packet engine refuses a collective (about a minute of work).
pub const PACKET_ENGINE_MAX_PACKETS: u64 = 100_000_000;

/// Elements per slice of pipelined schedules (the tree's, the chains').
const TREE_SLICE: usize = 1 << 17;

/// The schedules that describe every rank, and how (see [`symmetric`]).
type Symmetric = (Vec<Schedule>, Symmetry);

/// A collective cut into channels and placed: what every engine replays.
struct Placed<'a> {
    spec: &'a CollectiveSpec,
    /// Ranks the schedules run on: the job's, or its servers' for NCCL's tree.
    n: usize,
    /// GPUs of each server in the chain of NCCL's tree (0: no chain).
    chain: usize,
    /// Ranks per server, for the hierarchical AllReduce (ranks sit server by server).
    per_host: usize,
    /// Rank order of the schedules: the ranks' own (placement is in `gpus`).
    order: Vec<usize>,
    counts: Vec<usize>,
    gpus: Vec<Vec<usize>>,
    rails: Vec<Option<usize>>,
}

impl Placed<'_> {
    fn sched(&self, count: usize, r: usize) -> Result<Schedule, PlanError> {
        ScheduleRequest {
            coll: self.spec.coll,
            algo: self.spec.algo,
            ranks: self.n,
            rank: r,
            count,
            slice: TREE_SLICE,
            in_place: false,
            order: &self.order,
            per_host: self.per_host,
        }
        .build()
        .map_err(|e| invalid("algorithm", e.to_string()))
    }

    /// Every rank's schedule for `count` elements.
    fn schedules(&self, count: usize) -> Result<Vec<Schedule>, PlanError> {
        (0..self.n).map(|r| self.sched(count, r)).collect()
    }

    fn symmetric(&self, made: &mut HashMap<usize, Symmetric>) -> Result<(), PlanError> {
        for &count in &self.counts {
            if let std::collections::hash_map::Entry::Vacant(e) = made.entry(count) {
                e.insert(symmetric(self.n, self.per_host, |r| {
                    self.sched(count, r).expect("checked")
                })?);
            }
        }
        Ok(())
    }

    /// The lockstep engine's jobs: described by their symmetry, or (NCCL's tree, whose
    /// slices move in steps but whose ranks differ) by every rank's own schedule.
    fn lockstep_jobs(
        &self,
        made: &mut HashMap<usize, Symmetric>,
    ) -> Result<Vec<SymJob>, PlanError> {
        if self.chain > 0 {
            // Channels of one count run the same schedules: built once, shared.
            let mut built: HashMap<usize, Arc<Vec<Schedule>>> = HashMap::new();
            let mut jobs = Vec::new();
            for (c, &count) in self.counts.iter().enumerate() {
                let schedules = match built.get(&count) {
                    Some(s) => s.clone(),
                    None => {
                        let s = Arc::new(self.schedules(count)?);
                        built.insert(count, s.clone());
                        s
                    }
                };
                jobs.push(SymJob {
                    symmetry: Symmetry::Hosts(self.n),
                    gpus: self.gpus[c].clone(),
                    schedules,
                    rail: self.rails[c],
                    elem_bytes: self.spec.elem_bytes,
                    pipelined: true,
                });
            }
            return Ok(jobs);
        }
        self.symmetric(made)?;
        Ok(self.sym_jobs(made))
    }

    /// Whether the lockstep engine can run it.
    fn steps_in_lockstep(&self, made: &mut HashMap<usize, Symmetric>) -> bool {
        self.chain > 0 || self.symmetric(made).is_ok()
    }

    /// NCCL's tree inside servers: every channel's slices climb and descend a chain through
    /// the server's GPUs over NVLink, around the tree between servers that `net_s` timed.
    /// The chain adds its pipeline fill (a slice and an overhead per hop, up and down), and
    /// NVLink's own time where it, not the network, is the slower.
    fn with_chain(&self, cluster: &Cluster, overhead_s: f64, net_s: f64) -> f64 {
        if self.chain <= 1 {
            return net_s;
        }
        let nv = cluster.server.nvlink_bps;
        let count = self.counts.iter().copied().max().unwrap_or(0);
        let slice = (TREE_SLICE.min(count.div_ceil(2)) * self.spec.elem_bytes) as f64 * 8.0;
        let fill = 2.0 * (self.chain - 1) as f64 * (overhead_s + slice / nv);
        net_s.max(self.spec.bytes as f64 * 8.0 / nv) + fill
    }

    fn sym_jobs(&self, made: &HashMap<usize, Symmetric>) -> Vec<SymJob> {
        self.counts
            .iter()
            .enumerate()
            .map(|(c, count)| {
                let (first, sym) = made[count].clone();
                SymJob {
                    gpus: self.gpus[c].clone(),
                    schedules: Arc::new(first),
                    symmetry: sym,
                    rail: self.rails[c],
                    elem_bytes: self.spec.elem_bytes,
                    pipelined: false,
                }
            })
            .collect()
    }

    fn jobs(&self) -> Result<Vec<Job>, PlanError> {
        self.counts
            .iter()
            .enumerate()
            .map(|(c, &count)| {
                Ok(Job {
                    gpus: self.gpus[c].clone(),
                    schedules: self.schedules(count)?,
                    rail: self.rails[c],
                    elem_bytes: self.spec.elem_bytes,
                })
            })
            .collect()
    }
}

fn ranks_of(cluster: &Cluster, spec: &CollectiveSpec) -> Result<usize, PlanError> {
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
    Ok(n)
}

/// Places `spec` on `servers` (the job's rank `i` on GPU `i % per` of its `i / per`-th).
/// Rings run one per channel, each on its NIC rail; NCCL's tree (the tree AllReduce on more
/// than one server) runs per channel between one GPU of each server, the one beside the
/// channel's rail, and chains through the others (see [`Placed::with_chain`]).
fn place<'a>(
    cluster: &Cluster,
    spec: &'a CollectiveSpec,
    servers: &[usize],
) -> Result<Placed<'a>, PlanError> {
    let n = ranks_of(cluster, spec)?;
    let per = cluster.server.gpus;
    let nics = cluster.server.nics;
    let global = |g: usize| servers[g / per] * per + g % per;
    if spec.elem_bytes == 0 {
        return Err(invalid("elem_bytes", "want at least 1"));
    }
    let ring = spec.algo == Algorithm::Ring;
    let nodes = n.div_ceil(per);
    let tree = spec.algo == Algorithm::Tree && nodes > 1;
    let channels = if ring || tree {
        spec.channels.max(1)
    } else {
        1
    };
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
    let counts: Vec<usize> = (0..channels)
        .map(|c| per_rank / channels + usize::from(c < per_rank % channels))
        .collect();
    let last = n - (nodes - 1) * per;
    let gpus = (0..channels)
        .map(|c| {
            let order: Vec<usize> = if tree {
                let local = (c % nics) * per / nics;
                (0..nodes)
                    .map(|s| {
                        let here = if s + 1 == nodes { last } else { per };
                        s * per + local.min(here - 1)
                    })
                    .collect()
            } else if ring {
                channel_order(cluster, n, c, channels)
            } else {
                (0..n).collect()
            };
            order.into_iter().map(global).collect()
        })
        .collect();
    let tn = if tree { nodes } else { n };
    let placed = Placed {
        spec,
        n: tn,
        chain: if tree { per } else { 0 },
        per_host: per,
        order: (0..tn).collect(),
        gpus,
        rails: (0..channels)
            .map(|c| (ring || tree).then_some(c % nics))
            .collect(),
        counts,
    };
    // Checks the algorithm exists for the collective before anything else.
    placed.sched(placed.counts[0], 0)?;
    Ok(placed)
}

/// Predicts `spec` on `cluster`; `overhead_s` per message.
pub fn run_collective(
    cluster: &Cluster,
    spec: &CollectiveSpec,
    engine: Engine,
    overhead_s: f64,
) -> Result<Outcome, PlanError> {
    run_scenario(cluster, spec, engine, overhead_s, &Scenario::default())
}

/// Predicts `spec` on `cluster` in `scenario` (packet settings, competing jobs); the time is
/// the planned collective's alone.
pub fn run_scenario(
    cluster: &Cluster,
    spec: &CollectiveSpec,
    engine: Engine,
    overhead_s: f64,
    scenario: &Scenario,
) -> Result<Outcome, PlanError> {
    let mut ranks = vec![ranks_of(cluster, spec)?];
    for b in &scenario.background {
        if b.spec.ranks == 0 {
            return Err(invalid("background", "a competing job needs its ranks"));
        }
        ranks.push(ranks_of(cluster, &b.spec)?);
    }
    let servers = scenario.servers(cluster, &ranks)?;
    let main = place(cluster, spec, &servers[0])?;
    let n = ranks[0];
    let mut all = vec![main];
    for (b, s) in scenario.background.iter().zip(&servers[1..]) {
        all.push(place(cluster, &b.spec, s)?);
    }
    let main_jobs = all[0].counts.len();
    // Rank 0's schedule and its symmetry, per placed collective and count.
    let mut made: Vec<HashMap<usize, Symmetric>> = vec![HashMap::new(); all.len()];
    let engine = match engine {
        Engine::Auto => {
            let ok = all
                .iter()
                .zip(&mut made)
                .all(|(p, m)| p.steps_in_lockstep(m));
            if ok { Engine::Lockstep } else { Engine::Event }
        }
        e => e,
    };
    let ranks: usize = all.iter().map(|p| p.n).sum();
    let mut stats = None;
    let mut packet = None;
    let job_times: Vec<f64> = match engine {
        Engine::Lockstep | Engine::Auto => {
            let mut jobs = Vec::new();
            for (p, m) in all.iter().zip(&mut made) {
                jobs.extend(p.lockstep_jobs(m)?);
            }
            let l = lockstep(cluster, &jobs, overhead_s)?;
            let t = l.job_time_s.clone();
            stats = Some(l);
            t
        }
        Engine::Event => {
            if ranks > EVENT_ENGINE_MAX_RANKS {
                return Err(invalid(
                    "engine",
                    format!(
                        "the event engine takes at most {EVENT_ENGINE_MAX_RANKS} ranks, not \
                         {ranks}; {} is not rank-symmetric, so the lockstep engine cannot run \
                         it: pick ring",
                        spec.algo.name()
                    ),
                ));
            }
            let mut jobs = Vec::new();
            for p in &all {
                jobs.extend(p.jobs()?);
            }
            replay(cluster, &jobs, overhead_s)?.job_time_s
        }
        Engine::Packet => {
            let params = scenario
                .packet
                .clone()
                .unwrap_or_else(|| PacketParams::for_fabric(&cluster.fabric));
            let mut jobs = Vec::new();
            for p in &all {
                jobs.extend(p.jobs()?);
            }
            // What every rank sends, from the schedules' own counts.
            let bytes: u64 = jobs
                .iter()
                .flat_map(|j| {
                    j.schedules
                        .iter()
                        .map(|s| (s.sent_elems() * j.elem_bytes) as u64)
                })
                .sum();
            let packets = bytes / u64::from(params.mtu.max(1));
            if packets > PACKET_ENGINE_MAX_PACKETS {
                return Err(invalid(
                    "engine",
                    format!(
                        "the packet engine would simulate about {packets} packets (at most \
                         {PACKET_ENGINE_MAX_PACKETS}, about a minute): use a smaller size or \
                         fewer GPUs, or the flow-level engines (auto)"
                    ),
                ));
            }
            let r = simulate_jobs(cluster, &jobs, &params, overhead_s)?;
            let t = r.job_time_s.clone();
            packet = Some(r);
            t
        }
    };
    let mut job_times = job_times.into_iter();
    let job_times: Vec<f64> = all
        .iter()
        .flat_map(|p| {
            (&mut job_times)
                .take(p.counts.len())
                .map(|t| p.with_chain(cluster, overhead_s, t))
                .collect::<Vec<_>>()
        })
        .collect();
    let time_s = job_times[..main_jobs].iter().copied().fold(0.0, f64::max);
    let algbw = if time_s > 0.0 {
        spec.bytes as f64 / time_s
    } else {
        f64::INFINITY
    };
    Ok(Outcome {
        time_s,
        algbw,
        busbw: algbw * busbw_factor(spec.coll, n),
        engine,
        ranks: n,
        stats,
        packet,
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
    /// The algorithm each bucket size ran (NCCL's choice, or the one forced).
    pub algorithms: Vec<(u64, Algorithm)>,
}

/// Predicts a training step whose buckets are all-reduced with `spec` (its size is ignored)
/// in `scenario`; with `tune`, each bucket size takes the algorithm NCCL's tuner would
/// (see [`crate::tuner`]) instead of `spec`'s.
pub fn training_step(
    cluster: &Cluster,
    t: &Training,
    spec: &CollectiveSpec,
    tune: bool,
    engine: Engine,
    overhead_s: f64,
    scenario: &Scenario,
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
    let mut algorithms = Vec::new();
    let (mut done, mut ready_bytes, mut total) = (0.0f64, 0u64, 0.0);
    for &b in &sizes {
        let dt = match memo.get(&b) {
            Some(&x) => x,
            None => {
                let mut s = CollectiveSpec {
                    bytes: b,
                    ..spec.clone()
                };
                if tune {
                    s.tune(cluster);
                }
                let x = run_scenario(cluster, &s, engine, overhead_s, scenario)?.time_s;
                memo.insert(b, x);
                algorithms.push((b, s.algo));
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
        algorithms,
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
