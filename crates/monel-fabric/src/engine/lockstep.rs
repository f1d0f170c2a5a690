//! The lockstep engine, for 10^4 to 10^5 GPUs: rank-symmetric algorithms (ring, direct
//! all-to-all: every rank does what rank 0 does, shifted by its rank; recursive doubling and
//! halving: XORed with it) are described by one rank's schedule; the hierarchical AllReduce
//! by those of one server's ranks, each server doing what the first does (host symmetry).
//! Step k of every job starts
//! together: all ranks' flows of the step drain max-min fairly (re-shared as flows finish),
//! and the step lasts, for each job, until its last message arrived (path latency and the
//! per-message overhead included). Jobs (NCCL's channels) pace themselves: a job's time is
//! the sum of its own steps, the collective's the slowest job's. Steps that send the same
//! messages are computed once, so a ring of 2(n-1) steps costs one flow computation.
//!
//! Rings (one send per step, to a fixed neighbour) need one refinement, because their ranks
//! do not wait for each other's steps, only for their neighbour's data: the critical path of
//! 2(n-1) steps walks twice round the ring, so it pays the *mean* edge cost (transfer,
//! latency, overhead) per step, not the worst; and the slowest edge must still carry every
//! chunk. A ring step costs max(mean edge cost, slowest transfer). The hierarchy's phases
//! are rings too (inside servers, then between them), and are charged as rings. Other
//! algorithms pay the slowest message per step. The event engine agrees with rings and
//! halving within a few percent on mid-size cases, and lies 0-14% below the hierarchy
//! (tested).

use std::collections::HashMap;
use std::sync::Arc;

use monel_sched::schedule::{Op, Schedule};

use crate::cluster::Cluster;
use crate::engine::event::{ReplayError, sport};
use crate::engine::flow::{drain, max_min_rates_by};
use crate::topology::{LinkId, LinkKind};

/// How rank r's peers follow from rank 0's (or, on hosts, from its own host's first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symmetry {
    /// Peer p of rank 0 is peer (p + r) mod n of rank r.
    Shift,
    /// Peer p of rank 0 is peer p XOR r of rank r (n a power of two).
    Xor,
    /// Hosts of this many ranks each (hierarchical algorithms): rank h·P + l does what rank
    /// l does, and peer p of rank l is peer (p + h·P) mod n of rank h·P + l.
    Hosts(usize),
}

impl Symmetry {
    fn map(self, p: usize, r: usize, n: usize) -> usize {
        match self {
            Self::Shift => (p + r) % n,
            Self::Xor => p ^ r,
            Self::Hosts(per) => (p + r - r % per) % n,
        }
    }

    /// How many ranks' schedules describe all (the ranks of one host, or rank 0 alone).
    pub fn period(self) -> usize {
        match self {
            Self::Hosts(per) => per,
            _ => 1,
        }
    }
}

/// One collective in lockstep form: the first [`Symmetry::period`] ranks' schedules stand
/// for all `gpus.len()` ranks.
#[derive(Debug, Clone)]
pub struct SymJob {
    /// GPU of each rank.
    pub gpus: Vec<usize>,
    /// Schedules of ranks 0 to period - 1.
    pub schedules: Arc<Vec<Schedule>>,
    /// How the other ranks' peers follow.
    pub symmetry: Symmetry,
    /// NIC rail for messages between servers (`None`: the destination GPU's own).
    pub rail: Option<usize>,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Whether its steps overlap in a pipeline (a tree's slices): a step's messages then
    /// keep the max-min rates they hold together, as in the pipeline's steady state, where
    /// the next step's messages take up what a finished one frees. Otherwise a step drains
    /// (rates re-shared as messages finish).
    pub pipelined: bool,
}

/// Checks that the schedules `sched(r)` of an `n`-rank collective are rank-symmetric, on a
/// sample of ranks, and returns the schedules that describe all ranks with their symmetry:
/// rank 0's shifted or XORed by the rank, or, with `per_host` ranks on each host (0: none),
/// those of the first host's ranks shifted host by host. Message sizes may differ by one
/// element between ranks (counts that do not divide); the first ranks' are used for all.
pub fn symmetric(
    n: usize,
    per_host: usize,
    sched: impl Fn(usize) -> Schedule,
) -> Result<(Vec<Schedule>, Symmetry), ReplayError> {
    let s0 = sched(0);
    let mut sample: Vec<usize> = [1, 2, n / 3, n / 2, n - 1]
        .into_iter()
        .filter(|&r| r > 0 && r < n)
        .collect();
    sample.dedup();
    let others: Vec<(usize, Schedule)> = sample.into_iter().map(|r| (r, sched(r))).collect();
    for sym in [Symmetry::Shift, Symmetry::Xor] {
        if sym == Symmetry::Xor && !n.is_power_of_two() {
            continue;
        }
        if others.iter().all(|(r, s)| same_up_to(&s0, s, *r, n, sym)) {
            return Ok((vec![s0], sym));
        }
    }
    if per_host > 1 && per_host < n && n % per_host == 0 {
        let sym = Symmetry::Hosts(per_host);
        let first: Vec<Schedule> = std::iter::once(s0)
            .chain((1..per_host).map(&sched))
            .collect();
        let hosts = n / per_host;
        let mut sample: Vec<usize> = [1, 2, hosts / 2, hosts - 1]
            .into_iter()
            .filter(|&h| h > 0 && h < hosts)
            .collect();
        sample.dedup();
        let fits = sample.iter().all(|&h| {
            [0, 1, per_host / 2, per_host - 1].iter().all(|&l| {
                let r = h * per_host + l;
                same_up_to(&first[l], &sched(r), r, n, sym)
            })
        });
        if fits {
            return Ok((first, sym));
        }
    }
    Err(ReplayError::NotSymmetric(
        "ranks do not follow rank 0's schedule shifted or XORed by their rank, nor their \
         host's first ranks' shifted by host (tree, chain and rooted algorithms): use the \
         event engine"
            .into(),
    ))
}

fn same_up_to(s0: &Schedule, s: &Schedule, r: usize, n: usize, sym: Symmetry) -> bool {
    s0.steps.len() == s.steps.len()
        && s0.steps.iter().zip(&s.steps).all(|(a, b)| {
            a.ops.len() == b.ops.len()
                && a.ops.iter().zip(&b.ops).all(|(x, y)| match (x, y) {
                    (Op::Send { peer: p, src: a }, Op::Send { peer: q, src: b }) => {
                        sym.map(*p, r, n) == *q && a.len.abs_diff(b.len) <= 1
                    }
                    (
                        Op::Recv {
                            peer: p, dst: a, ..
                        }
                        | Op::RecvReduce {
                            peer: p, dst: a, ..
                        },
                        Op::Recv {
                            peer: q, dst: b, ..
                        }
                        | Op::RecvReduce {
                            peer: q, dst: b, ..
                        },
                    ) => sym.map(*p, r, n) == *q && a.len.abs_diff(b.len) <= 1,
                    _ => std::mem::discriminant(x) == std::mem::discriminant(y),
                })
        })
}

/// What a lockstep run found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lockstep {
    /// Completion time, seconds.
    pub time_s: f64,
    /// Steps (of the longest job).
    pub steps: usize,
    /// Steps with distinct messages, each computed once.
    pub distinct_steps: usize,
    /// Messages sent, all ranks.
    pub messages: u64,
    /// Bytes sent between servers.
    pub bytes: u64,
    /// Busy fraction of switch-to-switch links over the run (bits carried over capacity
    /// times time), averaged over those links; `None` without such links.
    pub fabric_utilization: Option<f64>,
    /// Most flows sharing one switch-to-switch link in any step (ECMP collisions).
    pub max_flows_per_fabric_link: usize,
    /// Of the flows that crossed switch-to-switch links, the fraction that shared one with
    /// another flow of the same step.
    pub collided_fraction: f64,
    /// Time the slowest inter-server message of a step took over what its NIC alone allows,
    /// worst step (1.0: no contention anywhere).
    pub worst_slowdown: f64,
    /// Each job's completion time, seconds.
    pub job_time_s: Vec<f64>,
}

struct StepCost {
    /// Per job: the slowest message (transfer, latency, overhead).
    time_s: Vec<f64>,
    /// Per job: the mean message cost.
    mean_s: Vec<f64>,
    /// Per job: the slowest transfer alone.
    transfer_s: Vec<f64>,
    messages: u64,
    bytes: u64,
    fabric_bits: f64,
    max_share: usize,
    crossing: usize,
    collided: usize,
    slowdown: f64,
}

/// Runs `jobs` together in lockstep (step k of every job at once); `overhead_s` per message.
pub fn lockstep(
    cluster: &Cluster,
    jobs: &[SymJob],
    overhead_s: f64,
) -> Result<Lockstep, ReplayError> {
    for (j, job) in jobs.iter().enumerate() {
        if let Some(&g) = job.gpus.iter().find(|&&g| g >= cluster.gpus()) {
            return Err(ReplayError::Placement(format!(
                "job {j}: GPU {g} does not exist (the cluster has {})",
                cluster.gpus()
            )));
        }
        if job.symmetry == Symmetry::Xor && !job.gpus.len().is_power_of_two() {
            return Err(ReplayError::NotSymmetric(format!(
                "job {j}: XOR symmetry needs a power-of-two rank count, not {}",
                job.gpus.len()
            )));
        }
    }
    for (j, job) in jobs.iter().enumerate() {
        let per = job.symmetry.period();
        if job.schedules.len() != per || job.gpus.len() % per != 0 {
            return Err(ReplayError::NotSymmetric(format!(
                "job {j}: {:?} needs the schedules of {per} ranks and a multiple of {per} \
                 ranks, not {} and {}",
                job.symmetry,
                job.schedules.len(),
                job.gpus.len()
            )));
        }
    }
    let steps = jobs
        .iter()
        .flat_map(|j| j.schedules.iter().map(|s| s.steps.len()))
        .max()
        .unwrap_or(0);
    let mut memo: HashMap<(u64, u64), usize> = HashMap::new();
    let mut costs: Vec<StepCost> = Vec::new();
    let mut out = Lockstep {
        steps,
        worst_slowdown: 1.0,
        ..Lockstep::default()
    };
    let mut fabric_bits = 0.0;
    let mut job_time = vec![0.0f64; jobs.len()];
    // Ring-like jobs: every step sends at most one message, always to the same neighbour;
    // or, on hosts, rings in phases (the hierarchy's rings inside and between hosts): every
    // rank sends at most one message per step, to its neighbour in the phase's ring.
    let one_send = |s: &monel_sched::schedule::Step| {
        s.ops
            .iter()
            .filter(|o| matches!(o, Op::Send { .. }))
            .count()
            <= 1
    };
    let ring: Vec<bool> = jobs
        .iter()
        .map(|j| {
            if matches!(j.symmetry, Symmetry::Hosts(_)) {
                return j.schedules.iter().all(|t| t.steps.iter().all(one_send));
            }
            let mut peer = None;
            j.symmetry == Symmetry::Shift
                && j.schedules[0].steps.iter().all(|s| {
                    let sends: Vec<usize> = s
                        .ops
                        .iter()
                        .filter_map(|o| match o {
                            Op::Send { peer, .. } => Some(*peer),
                            _ => None,
                        })
                        .collect();
                    match sends.as_slice() {
                        [] => true,
                        [p] => *peer.get_or_insert(*p) == *p,
                        _ => false,
                    }
                })
        })
        .collect();
    let (mut crossing, mut collided) = (0usize, 0usize);
    for k in 0..steps {
        // The step's sends, in a fixed order: (job, schedule, peer, elements).
        let sends = || {
            jobs.iter().enumerate().flat_map(move |(j, job)| {
                job.schedules
                    .iter()
                    .enumerate()
                    .flat_map(move |(l, sched)| {
                        sched.steps.get(k).into_iter().flat_map(move |s| {
                            s.ops.iter().filter_map(move |op| match op {
                                Op::Send { peer, src } => Some((j, l, *peer, src.len)),
                                _ => None,
                            })
                        })
                    })
            })
        };
        // Steps are told apart by a 128-bit fingerprint of their sends, so that a step
        // already costed is recognised without building its list (a tree over thousands
        // of servers sends hundreds of thousands of messages a step).
        let key = sends().fold((0u64, 0x9e37_79b9_7f4a_7c15u64), |(a, b), (j, l, p, n)| {
            [j, l, p, n].iter().fold((a, b), |(a, b), &x| {
                let x = x as u64;
                (
                    (a.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95),
                    (b.rotate_left(29) ^ x).wrapping_mul(0xff51_afd7_ed55_8ccd),
                )
            })
        });
        let i = match memo.get(&key) {
            Some(&i) => i,
            None => {
                let list: Vec<(usize, usize, usize, usize)> = sends().collect();
                costs.push(step_cost(cluster, jobs, &list, overhead_s));
                memo.insert(key, costs.len() - 1);
                costs.len() - 1
            }
        };
        let c = &costs[i];
        for (j, t) in job_time.iter_mut().enumerate() {
            *t += if ring[j] {
                c.mean_s[j].max(c.transfer_s[j])
            } else {
                c.time_s[j]
            };
        }
        out.messages += c.messages;
        out.bytes += c.bytes;
        fabric_bits += c.fabric_bits;
        crossing += c.crossing;
        collided += c.collided;
        out.max_flows_per_fabric_link = out.max_flows_per_fabric_link.max(c.max_share);
        out.worst_slowdown = out.worst_slowdown.max(c.slowdown);
    }
    out.distinct_steps = costs.len();
    out.time_s = job_time.iter().copied().fold(0.0, f64::max);
    out.job_time_s = job_time;
    let fabric_capacity: f64 = (0..cluster.fabric.links())
        .filter(|&l| cluster.fabric.kind[l] == LinkKind::Fabric)
        .map(|l| cluster.fabric.capacity[l])
        .sum();
    if fabric_capacity > 0.0 && out.time_s > 0.0 {
        out.fabric_utilization = Some(fabric_bits / (fabric_capacity * out.time_s));
    }
    if crossing > 0 {
        out.collided_fraction = collided as f64 / crossing as f64;
    }
    Ok(out)
}

fn step_cost(
    cluster: &Cluster,
    jobs: &[SymJob],
    sends: &[(usize, usize, usize, usize)],
    overhead_s: f64,
) -> StepCost {
    let mut path: Vec<LinkId> = Vec::new();
    let mut start: Vec<usize> = vec![0];
    let mut bits: Vec<f64> = Vec::new();
    let mut job_of: Vec<usize> = Vec::new();
    let mut cost = StepCost {
        time_s: vec![0.0; jobs.len()],
        mean_s: vec![0.0; jobs.len()],
        transfer_s: vec![0.0; jobs.len()],
        messages: 0,
        bytes: 0,
        fabric_bits: 0.0,
        max_share: 0,
        crossing: 0,
        collided: 0,
        slowdown: 1.0,
    };
    for &(j, l, p0, len) in sends {
        let job = &jobs[j];
        let n = job.gpus.len();
        let per = job.symmetry.period();
        let b = (len * job.elem_bytes) as f64 * 8.0;
        // Every rank that follows schedule l: one per host (or every rank, period 1).
        for r in (l..n).step_by(per) {
            let peer = job.symmetry.map(p0, r, n);
            cluster.route(
                job.gpus[r],
                job.gpus[peer],
                job.rail,
                sport(j, r, peer),
                &mut path,
            );
            start.push(path.len());
            bits.push(b);
            job_of.push(j);
            cost.messages += 1;
        }
    }
    if bits.is_empty() {
        return cost;
    }
    let at = |f: usize| &path[start[f]..start[f + 1]];
    let done = if jobs.iter().all(|j| j.pipelined) {
        let rates = max_min_rates_by(cluster.capacity(), bits.len(), at);
        bits.iter().zip(&rates).map(|(b, r)| b / r).collect()
    } else {
        drain(cluster.capacity(), &bits, at)
    };
    let kind = &cluster.fabric.kind;
    let mut share: HashMap<LinkId, usize> = HashMap::new();
    for f in 0..bits.len() {
        let p = at(f);
        let (j, c) = (job_of[f], done[f] + cluster.latency(p) + overhead_s);
        cost.time_s[j] = cost.time_s[j].max(c);
        cost.transfer_s[j] = cost.transfer_s[j].max(done[f]);
        cost.mean_s[j] += c / jobs[j].gpus.len() as f64;
        let crosses = p.iter().any(|&l| kind[l] == LinkKind::Fabric);
        if p.iter().any(|&l| kind[l] != LinkKind::Host) {
            cost.bytes += (bits[f] / 8.0) as u64;
            if bits[f] > 0.0 {
                cost.slowdown = cost
                    .slowdown
                    .max(done[f] * cluster.fabric.edge_bps / bits[f]);
            }
        }
        if crosses {
            cost.crossing += 1;
            for &l in p.iter().filter(|&&l| kind[l] == LinkKind::Fabric) {
                cost.fabric_bits += bits[f];
                *share.entry(l).or_default() += 1;
            }
        }
    }
    for f in 0..bits.len() {
        let p = at(f);
        if p.iter()
            .any(|&l| kind[l] == LinkKind::Fabric && share[&l] > 1)
        {
            cost.collided += 1;
        }
    }
    cost.max_share = share.values().copied().max().unwrap_or(0);
    cost
}
