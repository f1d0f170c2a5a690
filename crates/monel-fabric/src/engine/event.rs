//! The event engine: replays `monel-ccl` schedules (every rank's list of steps of sends and
//! receives, the same data the library executes) on a cluster, in the fluid model: a rank
//! starts a step when the previous one finished, its sends become flows sharing links max-min
//! fairly (messages from one rank to another one after the other, as a queue pair sends
//! them), a message is delivered one path latency plus the per-message overhead after its
//! last bit left, and a step finishes when all of its receives were delivered. Ranks run
//! asynchronously, as they do for real; a flow that starts or ends re-shares the links of the
//! flows connected to it (through shared links), so the cost grows with messages times the
//! flows of the fabric's busiest part: up to a few thousand ranks. [`mod@crate::engine::lockstep`] covers
//! the rest.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use monel_sched::schedule::{Op, Schedule};

use crate::cluster::Cluster;
use crate::engine::flow::max_min_rates_by;

/// The outcome of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// When the last rank finished, seconds.
    pub time_s: f64,
    /// Messages sent.
    pub messages: usize,
    /// Bytes sent between hosts.
    pub bytes: u64,
    /// Flow-seconds spent crossing leaf-spine links at less than the host link speed,
    /// because another flow shared the link (ECMP collisions and oversubscription).
    pub fabric_contention_s: f64,
    /// Each job's completion time, seconds.
    pub job_time_s: Vec<f64>,
}

/// A replay that cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayError {
    /// Ranks and hosts do not match.
    Placement(String),
    /// No rank can progress, but some have not finished (the schedules do not match).
    Deadlock(String),
    /// The lockstep engine was given an algorithm whose ranks do not all do the same thing.
    NotSymmetric(String),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Placement(s) => write!(f, "placement: {s}"),
            Self::Deadlock(s) => write!(f, "schedules deadlock: {s}"),
            Self::NotSymmetric(s) => write!(f, "not rank-symmetric: {s}"),
        }
    }
}

impl std::error::Error for ReplayError {}

struct Active {
    src: usize,
    dst: usize,
    path: Vec<crate::LinkId>,
    bits: f64,
}

/// One collective placed on a cluster: rank r runs on GPU `gpus[r]` and follows
/// `schedules[r]`; elements are `elem_bytes` bytes; messages between servers use NIC `rail`
/// (`None`: the destination GPU's own). Several jobs replayed together share the fabric
/// (NCCL's channels, or competing jobs).
#[derive(Debug, Clone)]
pub struct Job {
    /// GPU of each rank.
    pub gpus: Vec<usize>,
    /// Schedule of each rank.
    pub schedules: Vec<Schedule>,
    /// NIC rail for messages between servers.
    pub rail: Option<usize>,
    /// Bytes per element.
    pub elem_bytes: usize,
}

/// The UDP source port of the QP from `a` to `b` in job `j` (one QP per rank pair, as Monel
/// and NCCL connect them): a hash in the dynamic range, which ECMP then hashes in turn.
pub fn sport(j: usize, a: usize, b: usize) -> u16 {
    (crate::topology::ecmp_hash(a, b, j as u16, usize::MAX) % 16384) as u16 | 0xC000
}

/// Replays `jobs` together; `overhead_s` per message (software and NIC).
pub fn replay(cluster: &Cluster, jobs: &[Job], overhead_s: f64) -> Result<Replay, ReplayError> {
    let mut progress = Progress::new(cluster, jobs)?;
    let mut out = Replay {
        time_s: 0.0,
        messages: 0,
        bytes: 0,
        fabric_contention_s: 0.0,
        job_time_s: vec![0.0; jobs.len()],
    };
    let mut t = 0.0f64;
    // Deliveries by time (ties in insertion order, for determinism).
    let mut deliveries: BTreeMap<(u64, u64), (usize, usize)> = BTreeMap::new();
    let mut seq = 0u64;
    let mut posted = Vec::new();
    // The flows and their rates, which change only when flows start or end, and only for
    // the flows connected to those (through shared links, transitively).
    let mut sh = Sharing::new(cluster.capacity().len());
    // Messages from one rank to another leave in order, one after the other, as a queue
    // pair's do: a later one waits here while an earlier one is still flowing.
    let mut queued: HashMap<(usize, usize), VecDeque<Active>> = HashMap::new();

    loop {
        progress.run(&mut posted);
        for j in progress.jobs_done.drain(..) {
            out.job_time_s[j] = t;
        }
        for m in posted.drain(..) {
            out.messages += 1;
            let mut path = Vec::new();
            cluster.route(m.from, m.to, m.rail, m.sport, &mut path);
            if path.is_empty() || m.bytes == 0 {
                let at = t + cluster.latency(&path) + overhead_s;
                deliveries.insert((at.to_bits(), seq), (m.src, m.dst));
                seq += 1;
            } else {
                out.bytes += m.bytes;
                let f = Active {
                    src: m.src,
                    dst: m.dst,
                    path,
                    bits: m.bytes as f64 * 8.0,
                };
                match queued.get_mut(&(m.src, m.dst)) {
                    Some(q) => q.push_back(f),
                    None => {
                        queued.insert((m.src, m.dst), VecDeque::new());
                        sh.push(f);
                    }
                }
            }
        }
        if sh.flows.is_empty() && deliveries.is_empty() {
            if let Some(e) = progress.leftover() {
                return Err(e);
            }
            out.time_s = t;
            return Ok(out);
        }
        // The next event: a flow's last bit, or a delivery.
        sh.reshare(cluster.capacity());
        let mut dt = f64::INFINITY;
        for (f, &rate) in sh.flows.iter().zip(&sh.rates) {
            dt = dt.min(f.bits / rate);
        }
        let next_delivery = deliveries
            .keys()
            .next()
            .map(|&(bits, _)| f64::from_bits(bits));
        if dt.is_infinite() && next_delivery.is_none() {
            return Err(progress
                .leftover()
                .unwrap_or_else(|| ReplayError::Deadlock("flows without bandwidth".into())));
        }
        let flow_end = t + dt;
        if next_delivery.is_some_and(|d| d <= flow_end) {
            let (&key, &(src, dst)) = deliveries.iter().next().expect("a delivery");
            deliveries.remove(&key);
            let at = f64::from_bits(key.0);
            advance(&mut sh.flows, &sh.rates, at - t, cluster, &mut out);
            t = at;
            progress.deliver(src, dst);
            // Every other delivery at this very instant too, before the ranks they free run
            // and rates are shared anew: one at a time, each would re-share the rates only
            // to advance the flows by nothing (symmetric schedules deliver hundreds at once).
            while let Some((&k, &(src, dst))) = deliveries.iter().next() {
                if k.0 != key.0 {
                    break;
                }
                deliveries.remove(&k);
                progress.deliver(src, dst);
            }
        } else {
            advance(&mut sh.flows, &sh.rates, dt, cluster, &mut out);
            t = flow_end;
            // Every flow whose last bit left now.
            let mut k = 0;
            while k < sh.flows.len() {
                if sh.flows[k].bits <= 1e-6 {
                    let f = sh.swap_remove(k);
                    let at = t + cluster.latency(&f.path) + overhead_s;
                    deliveries.insert((at.to_bits(), seq), (f.src, f.dst));
                    seq += 1;
                    // The pair's next message starts now (it takes the last place, which
                    // the loop has not reached yet).
                    let pair = (f.src, f.dst);
                    match queued.get_mut(&pair).and_then(VecDeque::pop_front) {
                        Some(next) => sh.push(next),
                        None => {
                            queued.remove(&pair);
                        }
                    }
                } else {
                    k += 1;
                }
            }
        }
    }
}

/// A message a rank posts: from actor `src` to actor `dst` (actors number the ranks of all
/// jobs together), `bytes` long, between GPUs `from` and `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message {
    pub job: usize,
    pub src: usize,
    pub dst: usize,
    pub from: usize,
    pub to: usize,
    pub bytes: u64,
    pub sport: u16,
    pub rail: Option<usize>,
}

/// Ranks stepping through their schedules, shared by every engine: a rank starts a step when
/// the previous one finished, posts the step's sends, and finishes the step when all of its
/// receives were delivered. Engines carry the messages and call [`Progress::deliver`].
pub(crate) struct Progress<'a> {
    jobs: &'a [Job],
    base: Vec<usize>,
    pc: Vec<usize>,
    need: Vec<HashMap<usize, usize>>,
    /// Messages each rank still waits for in its current step.
    waiting: Vec<usize>,
    /// Whether each rank posted its current step.
    started: Vec<bool>,
    arrived: HashMap<(usize, usize), usize>,
    finished: Vec<bool>,
    done: usize,
    ready: Vec<usize>,
    ranks_left: Vec<usize>,
    /// Jobs whose ranks all finished since the engine last looked.
    pub jobs_done: Vec<usize>,
}

impl<'a> Progress<'a> {
    /// Checks the placement of `jobs` on `cluster`.
    pub(crate) fn new(cluster: &Cluster, jobs: &'a [Job]) -> Result<Self, ReplayError> {
        let mut base = Vec::with_capacity(jobs.len());
        let mut n = 0usize;
        for (j, job) in jobs.iter().enumerate() {
            if job.gpus.len() != job.schedules.len() {
                return Err(ReplayError::Placement(format!(
                    "job {j}: {} ranks placed, {} schedules",
                    job.gpus.len(),
                    job.schedules.len()
                )));
            }
            if let Some(&g) = job.gpus.iter().find(|&&g| g >= cluster.gpus()) {
                return Err(ReplayError::Placement(format!(
                    "job {j}: GPU {g} does not exist (the cluster has {})",
                    cluster.gpus()
                )));
            }
            base.push(n);
            n += job.gpus.len();
        }
        Ok(Self {
            jobs,
            base,
            pc: vec![0; n],
            need: vec![HashMap::new(); n],
            waiting: vec![0; n],
            started: vec![false; n],
            arrived: HashMap::new(),
            finished: vec![false; n],
            done: 0,
            ready: (0..n).collect(),
            ranks_left: jobs.iter().map(|j| j.gpus.len()).collect(),
            jobs_done: jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| j.gpus.is_empty())
                .map(|(i, _)| i)
                .collect(),
        })
    }

    fn actor(&self, a: usize) -> (usize, usize) {
        let j = self.base.partition_point(|&b| b <= a) - 1;
        (j, a - self.base[j])
    }

    /// Runs every ready rank as far as it can go; appends the messages posted.
    pub(crate) fn run(&mut self, out: &mut Vec<Message>) {
        while let Some(r) = self.ready.pop() {
            loop {
                let (j, rr) = self.actor(r);
                let job = &self.jobs[j];
                let Some(step) = job.schedules[rr].steps.get(self.pc[r]) else {
                    if !self.finished[r] {
                        self.finished[r] = true;
                        self.done += 1;
                        self.ranks_left[j] -= 1;
                        if self.ranks_left[j] == 0 {
                            self.jobs_done.push(j);
                        }
                    }
                    break;
                };
                if !self.started[r] {
                    self.started[r] = true;
                    for op in &step.ops {
                        match *op {
                            Op::Send { peer, src } => out.push(Message {
                                job: j,
                                src: r,
                                dst: self.base[j] + peer,
                                from: job.gpus[rr],
                                to: job.gpus[peer],
                                bytes: (src.len * job.elem_bytes) as u64,
                                sport: sport(j, rr, peer),
                                rail: job.rail,
                            }),
                            Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                                let from = self.base[j] + peer;
                                // Take what already arrived.
                                match self.arrived.get_mut(&(from, r)) {
                                    Some(a) if *a > 0 => *a -= 1,
                                    _ => {
                                        *self.need[r].entry(from).or_default() += 1;
                                        self.waiting[r] += 1;
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                if self.waiting[r] > 0 {
                    break;
                }
                self.pc[r] += 1;
                self.started[r] = false;
            }
        }
    }

    /// A message from `src` reached `dst`.
    pub(crate) fn deliver(&mut self, src: usize, dst: usize) {
        match self.need[dst].get_mut(&src) {
            Some(k) => {
                *k -= 1;
                if *k == 0 {
                    self.need[dst].remove(&src);
                }
                self.waiting[dst] -= 1;
                if self.waiting[dst] == 0 {
                    self.ready.push(dst);
                }
            }
            // Early: it belongs to a later step.
            None => *self.arrived.entry((src, dst)).or_default() += 1,
        }
    }

    /// Every rank finished.
    pub(crate) fn finished(&self) -> bool {
        self.done == self.pc.len()
    }

    /// Why the replay cannot end: a message nobody receives, or ranks waiting forever.
    pub(crate) fn leftover(&self) -> Option<ReplayError> {
        if let Some((&(src, dst), _)) = self.arrived.iter().find(|&(_, &k)| k > 0) {
            return Some(ReplayError::Deadlock(format!(
                "rank {src} sent rank {dst} a message it never receives"
            )));
        }
        if self.finished() {
            return None;
        }
        let stuck: Vec<String> = (0..self.pc.len())
            .filter(|&r| !self.finished[r])
            .take(4)
            .map(|r| {
                format!(
                    "rank {r} at step {} waits for {:?}",
                    self.pc[r], self.need[r]
                )
            })
            .collect();
        Some(ReplayError::Deadlock(stuck.join("; ")))
    }
}

/// The flows in flight and their rates, re-shared where flows started or ended. Max-min
/// fair rates split over the connected parts of the graph of flows and the links they
/// cross: a flow that shares no link, even through others, with one that started or ended
/// keeps its rate. So only the flows reached from the changed links are shared anew, with
/// the links' whole capacity (no other flow crosses them). A flow that ends inside one server
/// re-shares that server's links, not the fabric's.
struct Sharing {
    flows: Vec<Active>,
    /// Each flow's rate (0 for one that started since the last re-share).
    rates: Vec<f64>,
    /// The flows crossing each link (indices into `flows`), kept as flows come and go.
    by_link: Vec<Vec<u32>>,
    /// Links of the flows that started or ended since the last re-share.
    changed: Vec<crate::LinkId>,
    link_seen: Vec<bool>,
    flow_seen: Vec<bool>,
    /// The flows re-shared, the queue of links to visit, the links visited.
    part: Vec<usize>,
    todo: Vec<crate::LinkId>,
    visited: Vec<crate::LinkId>,
}

impl Sharing {
    fn new(links: usize) -> Self {
        Self {
            flows: Vec::new(),
            rates: Vec::new(),
            by_link: vec![Vec::new(); links],
            changed: Vec::new(),
            link_seen: vec![false; links],
            flow_seen: Vec::new(),
            part: Vec::new(),
            todo: Vec::new(),
            visited: Vec::new(),
        }
    }

    /// A flow starts (its rate comes with the next [`Self::reshare`]).
    fn push(&mut self, f: Active) {
        let k = self.flows.len() as u32;
        for &l in &f.path {
            self.by_link[l].push(k);
        }
        self.changed.extend_from_slice(&f.path);
        self.flows.push(f);
        self.rates.push(0.0);
    }

    /// Flow `k` ends; the last flow takes its place.
    fn swap_remove(&mut self, k: usize) -> Active {
        let last = self.flows.len() - 1;
        let f = self.flows.swap_remove(k);
        self.rates.swap_remove(k);
        for &l in &f.path {
            self.by_link[l].retain(|&x| x as usize != k);
        }
        if k != last {
            for &l in &self.flows[k].path {
                for x in self.by_link[l].iter_mut().filter(|x| **x as usize == last) {
                    *x = k as u32;
                }
            }
        }
        self.changed.extend_from_slice(&f.path);
        f
    }

    /// New rates for the flows connected to the changed links.
    fn reshare(&mut self, capacity: &[f64]) {
        if self.changed.is_empty() {
            return;
        }
        self.flow_seen.clear();
        self.flow_seen.resize(self.flows.len(), false);
        self.part.clear();
        self.todo.clear();
        self.visited.clear();
        for &l in &self.changed {
            if !self.link_seen[l] {
                self.link_seen[l] = true;
                self.todo.push(l);
                self.visited.push(l);
            }
        }
        self.changed.clear();
        while let Some(l) = self.todo.pop() {
            for &k in &self.by_link[l] {
                let k = k as usize;
                if self.flow_seen[k] {
                    continue;
                }
                self.flow_seen[k] = true;
                self.part.push(k);
                for &m in &self.flows[k].path {
                    if !self.link_seen[m] {
                        self.link_seen[m] = true;
                        self.todo.push(m);
                        self.visited.push(m);
                    }
                }
            }
        }
        let (flows, part) = (&self.flows, &self.part);
        let shared = max_min_rates_by(capacity, part.len(), |i| flows[part[i]].path.as_slice());
        for (&k, r) in part.iter().zip(shared) {
            self.rates[k] = r;
        }
        for &l in &self.visited {
            self.link_seen[l] = false;
        }
    }
}

fn advance(flows: &mut [Active], rates: &[f64], dt: f64, cluster: &Cluster, out: &mut Replay) {
    let full = cluster.fabric.edge_bps;
    for (f, &rate) in flows.iter_mut().zip(rates) {
        f.bits -= rate * dt;
        if rate < full * (1.0 - 1e-9) && f.path.iter().any(|&l| cluster.fabric.is_fabric_link(l)) {
            out.fabric_contention_s += dt;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::flow::max_min_rates;

    /// Flows start and end at random on random links; after each change, re-sharing only
    /// the part connected to the changed links gives every flow the rate a full re-share
    /// gives it.
    #[test]
    fn resharing_the_changed_part_matches_sharing_everything() {
        let seed0 = 0x0fab_u64;
        let mut rnd = crate::engine::flow::uniform(seed0);
        for case in 0..50 {
            let links = 2 + rnd(30);
            let cap: Vec<f64> = (0..links).map(|_| 1.0 + rnd(9) as f64).collect();
            let mut sh = Sharing::new(links);
            for event in 0..60 {
                if sh.flows.is_empty() || rnd(3) > 0 {
                    // Paths stay within a few neighbouring links, so the graph has parts.
                    let at = rnd(links);
                    let mut path: Vec<usize> =
                        (0..1 + rnd(3)).map(|_| (at + rnd(3)) % links).collect();
                    path.sort_unstable();
                    path.dedup();
                    sh.push(Active {
                        src: 0,
                        dst: 0,
                        path,
                        bits: 1.0,
                    });
                } else {
                    let k = rnd(sh.flows.len());
                    sh.swap_remove(k);
                }
                // The index of flows by link follows every start and end.
                for (l, users) in sh.by_link.iter().enumerate() {
                    let mut got = users.clone();
                    got.sort_unstable();
                    let want: Vec<u32> = (0..sh.flows.len() as u32)
                        .filter(|&k| sh.flows[k as usize].path.contains(&l))
                        .collect();
                    assert_eq!(
                        got, want,
                        "seed {seed0:#x}, case {case}, event {event}: link {l}"
                    );
                }
                // Sometimes two changes before one re-share, as the engine makes them.
                if rnd(4) == 0 {
                    continue;
                }
                sh.reshare(&cap);
                let paths: Vec<&[usize]> = sh.flows.iter().map(|f| f.path.as_slice()).collect();
                let full = max_min_rates(&cap, &paths);
                for (k, (a, b)) in sh.rates.iter().zip(&full).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                        "seed {seed0:#x}, case {case}, event {event}: flow {k} has {a}, \
                         sharing everything gives {b}"
                    );
                }
            }
        }
    }
}
