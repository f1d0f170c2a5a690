//! Replays `monel-ccl` schedules (every rank's list of steps of sends and receives, the same
//! data the library executes) on a fabric, in the fluid model: a rank starts a step when the
//! previous one finished, its sends become flows sharing links max-min fairly, a message is
//! delivered one path latency plus the per-message overhead after its last bit left, and a
//! step finishes when all of its receives were delivered.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use monel_ccl::schedule::{Op, Schedule};

use crate::flow::max_min_rates;
use crate::topology::Fabric;

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
}

/// A replay that cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayError {
    /// Ranks and hosts do not match.
    Placement(String),
    /// No rank can progress, but some have not finished (the schedules do not match).
    Deadlock(String),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Placement(s) => write!(f, "placement: {s}"),
            Self::Deadlock(s) => write!(f, "schedules deadlock: {s}"),
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

/// Replays `schedules` (rank r's at index r) with rank r on host `host_of[r]`; messages of
/// `elem_bytes`-byte elements; `overhead_s` per message (software and NIC). Each rank pair's
/// traffic uses its own UDP source port (one QP per pair), so ECMP may place pairs on
/// different spines.
pub fn replay(
    fabric: &Fabric,
    host_of: &[usize],
    schedules: &[Schedule],
    elem_bytes: usize,
    overhead_s: f64,
) -> Result<Replay, ReplayError> {
    let n = schedules.len();
    if host_of.len() != n {
        return Err(ReplayError::Placement(format!(
            "{} ranks placed, {n} schedules",
            host_of.len()
        )));
    }
    if let Some(&h) = host_of.iter().find(|&&h| h >= fabric.hosts()) {
        return Err(ReplayError::Placement(format!(
            "host {h} does not exist (the fabric has {})",
            fabric.hosts()
        )));
    }
    let sport = |a: usize, b: usize| {
        (crate::topology::ecmp_hash(a, b, 0, usize::MAX) % 16384) as u16 | 0xC000
    };
    let mut out = Replay {
        time_s: 0.0,
        messages: 0,
        bytes: 0,
        fabric_contention_s: 0.0,
    };
    let mut t = 0.0f64;
    let mut pc = vec![0usize; n];
    let mut need: Vec<HashMap<usize, usize>> = vec![HashMap::new(); n];
    let mut arrived: HashMap<(usize, usize), usize> = HashMap::new();
    let mut flows: Vec<Active> = Vec::new();
    // Deliveries by time (ties in insertion order, for determinism).
    let mut deliveries: BTreeMap<(u64, u64), (usize, usize)> = BTreeMap::new();
    let mut seq = 0u64;
    let mut done = 0usize;
    let mut finished = vec![false; n];
    let mut ready: Vec<usize> = (0..n).collect();

    loop {
        // Start steps of ranks that are ready, as long as they can complete at once.
        while let Some(r) = ready.pop() {
            loop {
                let Some(step) = schedules[r].steps.get(pc[r]) else {
                    if !finished[r] {
                        finished[r] = true;
                        done += 1;
                    }
                    break;
                };
                if need[r].is_empty() {
                    for op in &step.ops {
                        match *op {
                            Op::Send { peer, src } => {
                                let bytes = (src.len * elem_bytes) as u64;
                                out.messages += 1;
                                let (hs, hd) = (host_of[r], host_of[peer]);
                                let path = fabric.path(hs, hd, sport(r, peer));
                                if path.is_empty() || bytes == 0 {
                                    let at = t + fabric.path_latency(&path) + overhead_s;
                                    deliveries.insert((at.to_bits(), seq), (r, peer));
                                    seq += 1;
                                } else {
                                    out.bytes += bytes;
                                    flows.push(Active {
                                        src: r,
                                        dst: peer,
                                        path,
                                        bits: bytes as f64 * 8.0,
                                    });
                                }
                            }
                            Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                                *need[r].entry(peer).or_default() += 1;
                            }
                            _ => {}
                        }
                    }
                }
                // Take what already arrived.
                need[r].retain(|&peer, k| {
                    let a = arrived.entry((peer, r)).or_default();
                    let take = (*a).min(*k);
                    *a -= take;
                    *k -= take;
                    *k > 0
                });
                if !need[r].is_empty() {
                    break;
                }
                pc[r] += 1;
            }
        }
        if done == n && flows.is_empty() && deliveries.is_empty() {
            if let Some((&(src, dst), _)) = arrived.iter().find(|&(_, &k)| k > 0) {
                return Err(ReplayError::Deadlock(format!(
                    "rank {src} sent rank {dst} a message it never receives"
                )));
            }
            out.time_s = t;
            return Ok(out);
        }
        // The next event: a flow's last bit, or a delivery.
        let paths: Vec<&[crate::LinkId]> = flows.iter().map(|f| f.path.as_slice()).collect();
        let rates = max_min_rates(&fabric.capacity, &paths);
        let mut dt = f64::INFINITY;
        for (f, &rate) in flows.iter().zip(&rates) {
            dt = dt.min(f.bits / rate);
        }
        let next_delivery = deliveries
            .keys()
            .next()
            .map(|&(bits, _)| f64::from_bits(bits));
        if dt.is_infinite() && next_delivery.is_none() {
            let stuck: Vec<String> = (0..n)
                .filter(|&r| pc[r] < schedules[r].steps.len())
                .take(4)
                .map(|r| format!("rank {r} at step {} waits for {:?}", pc[r], need[r]))
                .collect();
            return Err(ReplayError::Deadlock(stuck.join("; ")));
        }
        let flow_end = t + dt;
        if next_delivery.is_some_and(|d| d <= flow_end) {
            let (&key, &(src, dst)) = deliveries.iter().next().expect("a delivery");
            deliveries.remove(&key);
            let at = f64::from_bits(key.0);
            advance(&mut flows, &rates, at - t, fabric, &mut out);
            t = at;
            *arrived.entry((src, dst)).or_default() += 1;
            ready.push(dst);
        } else {
            advance(&mut flows, &rates, dt, fabric, &mut out);
            t = flow_end;
            // Every flow whose last bit left now.
            let mut k = 0;
            while k < flows.len() {
                if flows[k].bits <= 1e-6 {
                    let f = flows.swap_remove(k);
                    let at = t + fabric.path_latency(&f.path) + overhead_s;
                    deliveries.insert((at.to_bits(), seq), (f.src, f.dst));
                    seq += 1;
                } else {
                    k += 1;
                }
            }
        }
    }
}

fn advance(flows: &mut [Active], rates: &[f64], dt: f64, fabric: &Fabric, out: &mut Replay) {
    let full = fabric.shape().host_link_bps;
    for (f, &rate) in flows.iter_mut().zip(rates) {
        f.bits -= rate * dt;
        if rate < full * (1.0 - 1e-9) && f.path.iter().any(|&l| fabric.is_fabric_link(l)) {
            out.fabric_contention_s += dt;
        }
    }
}
