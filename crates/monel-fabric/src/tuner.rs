//! The algorithm NCCL would run: NCCL's own tuning model (`latency + bytes / bandwidth` per
//! algorithm and protocol, with its published constants for H100-class GPUs on x86 hosts),
//! fed with the planned cluster's shape and speeds instead of a probed topology. The planner
//! then simulates the chosen algorithm on the fabric; the model only chooses.
//!
//! What NCCL weighs and this model keeps: ring, tree (AllReduce) and PAT (AllGather and
//! ReduceScatter with one GPU per server), each with the LL, LL128 and Simple protocols;
//! its per-step hardware latencies (NVLink inside a server, the network between), the ring's
//! network overhead per step, its per-channel bandwidth caps and the tree's size correction.
//! What it leaves out: CollNet and NVLS (they need SHARP or NVLink multicast switches), and
//! NCCL's topology search (the bandwidth per channel is the servers' NIC bandwidth split over
//! the design's channels).

use std::fmt;

use monel_sched::plan::{Algorithm, Collective};

use crate::cluster::Cluster;

/// NCCL's algorithms the model weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclAlgo {
    /// Rings (one per channel).
    Ring,
    /// Chains inside servers under a double binary tree between them (AllReduce).
    Tree,
    /// Parallel aggregated trees (AllGather, ReduceScatter; one GPU per server).
    Pat,
}

/// NCCL's protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// 8-byte stores with a flag: lowest latency, half the bandwidth.
    Ll,
    /// 128-byte lines with a flag.
    Ll128,
    /// Plain copies with a fence per step: full bandwidth, highest latency.
    Simple,
}

impl NcclAlgo {
    /// NCCL's name (`NCCL_ALGO`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Tree => "tree",
            Self::Pat => "pat",
        }
    }
    /// Its row in NCCL's tables (tree, ring, PAT).
    fn index(self) -> usize {
        match self {
            Self::Tree => 0,
            Self::Ring => 1,
            Self::Pat => 2,
        }
    }
    /// Monel's schedule for it, where the planner has one.
    pub const fn schedule(self) -> Option<Algorithm> {
        match self {
            Self::Ring => Some(Algorithm::Ring),
            Self::Tree => Some(Algorithm::Tree),
            Self::Pat => None,
        }
    }
}

impl Protocol {
    /// NCCL's name (`NCCL_PROTO`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ll => "LL",
            Self::Ll128 => "LL128",
            Self::Simple => "Simple",
        }
    }
    const ALL: [Self; 3] = [Self::Ll, Self::Ll128, Self::Simple];
    fn index(self) -> usize {
        self as usize
    }
}

/// One (algorithm, protocol) the model priced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Algorithm.
    pub algo: NcclAlgo,
    /// Protocol.
    pub proto: Protocol,
    /// Predicted time, seconds.
    pub time_s: f64,
}

/// What the model chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// Monel's schedule the planner runs.
    pub algo: Algorithm,
    /// NCCL's fastest candidate (it may have no Monel schedule: PAT).
    pub best: Candidate,
    /// The fastest candidate per algorithm, fastest first.
    pub candidates: Vec<Candidate>,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |t: f64| {
            if t >= 1e-3 {
                format!("{:.2} ms", t * 1e3)
            } else {
                format!("{:.1} us", t * 1e6)
            }
        };
        let rest: Vec<String> = self.candidates[1..]
            .iter()
            .map(|c| format!("{}/{} {}", c.algo.name(), c.proto.name(), us(c.time_s)))
            .collect();
        write!(
            f,
            "{}/{} by NCCL's tuning model ({}",
            self.best.algo.name(),
            self.best.proto.name(),
            us(self.best.time_s)
        )?;
        if !rest.is_empty() {
            write!(f, " against {}", rest.join(", "))?;
        }
        write!(f, ")")?;
        if self.best.algo.schedule() != Some(self.algo) {
            write!(
                f,
                "; {} is not modelled here, so the plan runs {}, NCCL's next choice",
                self.best.algo.name(),
                self.algo.name()
            )?;
        }
        Ok(())
    }
}

// NCCL's constants (src/graph/tuning.cc), in microseconds and GB/s: rows tree, ring, PAT;
// columns LL, LL128, Simple.
const BASE_LAT: [[f64; 3]; 3] = [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4], [8.0, 8.0, 8.0]];
const NVLINK_LAT: [[f64; 3]; 3] = [[0.6, 1.25, 4.0], [0.6, 1.9, 3.4], [0.0, 0.0, 4.0]];
const NET_LAT: [[f64; 3]; 3] = [[5.0, 8.5, 14.0], [2.7, 4.0, 14.0], [0.0, 0.0, 14.0]];
/// Hopper, by servers (1, 2, more).
const LL_MAX_BW: [f64; 3] = [141.0, 39.0, 20.4];
const RING_LL128_MAX_BW: f64 = 36.7;
const TREE_LL128_MAX_BW: [f64; 3] = [36.7, 36.7, 29.0];
const TREE_MAX_BW: [f64; 3] = [38.7, 41.4, 36.0];
/// Host-side cost of posting a network operation (x86 Intel), us.
const NET_OVERHEAD: f64 = 1.0;
/// The tree's bandwidth by log2(bytes / 64), per protocol.
const TREE_CORRECTION: [[f64; 23]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9,
        0.9, 0.9, 0.9, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8,
        0.7, 0.7, 0.8, 0.9, 0.9,
    ],
];

/// The cluster as NCCL's model sees it for `ranks` ranks on `channels` channels.
struct Shape {
    ranks: usize,
    nodes: usize,
    ppn: f64,
    channels: f64,
    /// Bandwidth per channel, GB/s.
    bw: f64,
}

impl Shape {
    fn new(cluster: &Cluster, ranks: usize, channels: usize) -> Self {
        let s = &cluster.server;
        let per = s.gpus.min(ranks).max(1);
        let nodes = ranks.div_ceil(s.gpus).max(1);
        let channels = channels.max(1) as f64;
        let gbs = |bps: f64| bps / 8e9;
        let total = if nodes == 1 {
            // Inside one server: every GPU's NVLink.
            gbs(s.nvlink_bps).min(1e6)
        } else {
            // Between servers: the NICs a server's ranks use, behind their PCIe links.
            let nics = (s.nics * per).div_ceil(s.gpus).max(1) as f64;
            nics * gbs(cluster.fabric.edge_bps.min(s.pcie_bps))
        };
        Self {
            ranks,
            nodes,
            ppn: ranks as f64 / nodes as f64,
            channels,
            bw: total / channels,
        }
    }

    fn index2(&self) -> usize {
        self.nodes.min(3) - 1
    }

    /// NCCL's (latency us, algorithm bandwidth GB/s) of `algo` with `proto`, or `None`
    /// where NCCL would not run it.
    fn model(&self, coll: Collective, algo: NcclAlgo, proto: Protocol) -> Option<(f64, f64)> {
        let (a, p) = (algo.index(), proto.index());
        let n = self.ranks as f64;
        let all_reduce = matches!(coll, Collective::AllReduce(_));
        let gather = matches!(coll, Collective::AllGather | Collective::ReduceScatter(_));
        match algo {
            NcclAlgo::Tree if !all_reduce => return None,
            NcclAlgo::Pat if !gather || proto != Protocol::Simple || self.nodes != self.ranks => {
                return None;
            }
            _ => {}
        }
        let nsteps = if all_reduce {
            2.0 * (n - 1.0)
        } else if gather {
            n - 1.0
        } else {
            n
        };
        let mut bus = self.channels * self.bw;
        let i2 = self.index2();
        match (algo, proto) {
            (NcclAlgo::Ring, Protocol::Ll) => bus = LL_MAX_BW[i2].min(bus * 0.5),
            (NcclAlgo::Ring, Protocol::Ll128) => {
                bus = (bus * 0.92).min(self.channels * RING_LL128_MAX_BW);
            }
            (NcclAlgo::Tree, _) => {
                bus = (bus * 0.92).min(self.channels * TREE_MAX_BW[i2]);
                if proto == Protocol::Ll {
                    bus = (bus / 3.8).min(LL_MAX_BW[i2]);
                }
                if proto == Protocol::Ll128 {
                    let f = if self.nodes == 1 {
                        7.0 / 9.0
                    } else {
                        120.0 / 128.0
                    };
                    bus = (bus * f).min(self.channels * TREE_LL128_MAX_BW[i2]);
                }
            }
            (NcclAlgo::Pat, _) => bus *= 0.75,
            _ => {}
        }
        // Bus bandwidth to algorithm bandwidth.
        let algbw = match algo {
            NcclAlgo::Ring => bus * n / nsteps,
            NcclAlgo::Tree => bus * 0.5,
            NcclAlgo::Pat => bus,
        };
        let intra = NVLINK_LAT[a][p];
        let net = if self.ppn == 1.0 {
            NET_LAT[NcclAlgo::Tree.index()][p]
        } else {
            NET_LAT[a][p]
        };
        let mut lat = BASE_LAT[a][p];
        match algo {
            NcclAlgo::Ring if matches!(coll, Collective::Broadcast(_) | Collective::Reduce(..)) => {
                lat += if self.nodes == 1 { intra } else { net };
            }
            NcclAlgo::Ring => {
                let overhead = if self.nodes > 1 {
                    NET_OVERHEAD * if proto == Protocol::Simple { 3.0 } else { 1.0 }
                } else {
                    0.0
                };
                let intra = intra.max(overhead);
                let nodes = self.nodes as f64;
                let inter_steps = if self.nodes == 1 {
                    0.0
                } else if all_reduce {
                    2.0 * (nodes - 1.0)
                } else {
                    nodes - 1.0
                };
                let net = if self.nodes == 1 { intra } else { net };
                lat += (nsteps - inter_steps) * intra + inter_steps * net;
            }
            NcclAlgo::Tree => {
                let log = (self.nodes as f64).log2().floor();
                lat += 2.0 * ((self.ppn - 1.0) * intra + log * net);
            }
            NcclAlgo::Pat => {
                let log = (self.nodes as f64).log2().floor();
                lat += log * net / 3.5 + n * 2.8;
            }
        }
        Some((lat, algbw))
    }

    /// NCCL's time for `bytes`, seconds.
    fn time(&self, coll: Collective, algo: NcclAlgo, proto: Protocol, bytes: u64) -> Option<f64> {
        let (mut lat, mut bw) = self.model(coll, algo, proto)?;
        let log = (bytes >> 6).max(1).ilog2() as usize;
        if algo == NcclAlgo::Tree && (bytes >> 6) > 0 && log < 23 {
            bw *= TREE_CORRECTION[proto.index()][log];
        }
        if algo == NcclAlgo::Ring
            && proto == Protocol::Simple
            && self.nodes > 1
            && matches!(coll, Collective::AllReduce(_))
            && bytes as f64 / (self.channels * self.ranks as f64) >= 64.0
        {
            lat *= 1.4; // the ring's plateau, Ampere and later
        }
        Some((lat + bytes as f64 / (1000.0 * bw)) * 1e-6)
    }
}

/// What NCCL's tuner would run for `coll` of `bytes` (nccl-tests' size) on the first `ranks`
/// GPUs of `cluster` with `channels` channels; `None` for collectives NCCL does not tune
/// (all-to-all and the rooted gathers are point-to-point sends).
pub fn nccl_choice(
    cluster: &Cluster,
    coll: Collective,
    ranks: usize,
    bytes: u64,
    channels: usize,
) -> Option<Choice> {
    if !matches!(
        coll,
        Collective::AllReduce(_)
            | Collective::AllGather
            | Collective::ReduceScatter(_)
            | Collective::Broadcast(_)
            | Collective::Reduce(..)
    ) || ranks < 2
    {
        return None;
    }
    let shape = Shape::new(cluster, ranks, channels);
    let mut candidates: Vec<Candidate> = Vec::new();
    for algo in [NcclAlgo::Ring, NcclAlgo::Tree, NcclAlgo::Pat] {
        let best = Protocol::ALL
            .iter()
            .filter_map(|&proto| {
                shape
                    .time(coll, algo, proto, bytes)
                    .map(|time_s| Candidate {
                        algo,
                        proto,
                        time_s,
                    })
            })
            .min_by(|a, b| a.time_s.total_cmp(&b.time_s));
        candidates.extend(best);
    }
    candidates.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
    let best = *candidates.first()?;
    let algo = candidates.iter().find_map(|c| c.algo.schedule())?;
    Some(Choice {
        algo,
        best,
        candidates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Server;
    use crate::topology::LeafSpine;
    use monel_sched::RedOp;

    fn cluster(servers: usize, gpus: usize) -> Cluster {
        let nics = gpus;
        let fabric = LeafSpine {
            leaves: servers.div_ceil(4),
            hosts_per_leaf: 4 * nics,
            spines: 4,
            host_link_bps: 400e9,
            spine_link_bps: 400e9 * nics as f64,
            link_latency_s: 600e-9,
        }
        .build()
        .unwrap();
        let server = Server {
            gpus,
            nics,
            nvlink_bps: 3.6e12,
            pcie_bps: 512e9,
        };
        Cluster::new(fabric, server).unwrap()
    }

    const AR: Collective = Collective::AllReduce(RedOp::Sum);

    #[test]
    fn nccl_picks_trees_at_scale_and_rings_for_large_buffers_on_few_servers() {
        // 512 servers of 8 GPUs: a 25 MiB bucket goes by tree (the ring's 2(n-1) steps cost
        // tens of milliseconds).
        let big = cluster(512, 8);
        let c = nccl_choice(&big, AR, 4096, 25 << 20, 8).unwrap();
        assert_eq!(c.algo, Algorithm::Tree, "{c}");
        let ring = c
            .candidates
            .iter()
            .find(|x| x.algo == NcclAlgo::Ring)
            .unwrap();
        assert!(ring.time_s > 20.0 * c.best.time_s, "{c}");
        // 4 servers, 1 GiB: the ring's bandwidth wins.
        let small = cluster(4, 8);
        let c = nccl_choice(&small, AR, 32, 1 << 30, 8).unwrap();
        assert_eq!(c.algo, Algorithm::Ring, "{c}");
        assert_eq!(c.best.proto, Protocol::Simple);
        // Small messages go by a low-latency protocol.
        let c = nccl_choice(&small, AR, 32, 4096, 8).unwrap();
        assert_ne!(c.best.proto, Protocol::Simple, "{c}");
    }

    #[test]
    fn the_choice_crosses_over_with_size_as_the_model_says() {
        // The tree's time at 64 servers minus the ring's changes sign once, from tree to
        // ring, as the size grows.
        let cl = cluster(64, 8);
        let picks: Vec<Algorithm> = (10..32)
            .map(|k| nccl_choice(&cl, AR, 512, 1 << k, 8).unwrap().algo)
            .collect();
        let switches = picks.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(switches <= 1, "{picks:?}");
        assert_eq!(picks[0], Algorithm::Tree, "{picks:?}");
    }

    #[test]
    fn gathers_use_pat_only_with_one_gpu_per_server_and_fall_back_to_the_ring() {
        let one = cluster(64, 1);
        let c = nccl_choice(&one, Collective::AllGather, 64, 1 << 20, 1).unwrap();
        assert!(c.candidates.iter().any(|x| x.algo == NcclAlgo::Pat), "{c}");
        assert_eq!(c.algo, Algorithm::Ring, "the planner has no PAT: {c}");
        if c.best.algo == NcclAlgo::Pat {
            assert!(c.to_string().contains("not modelled"), "{c}");
        }
        let eight = cluster(8, 8);
        let c = nccl_choice(&eight, Collective::AllGather, 64, 1 << 20, 8).unwrap();
        assert!(c.candidates.iter().all(|x| x.algo == NcclAlgo::Ring), "{c}");
        // No tree for broadcast; nothing tuned for all-to-all.
        let c = nccl_choice(&eight, Collective::Broadcast(0), 64, 1 << 20, 8).unwrap();
        assert_eq!(c.candidates.len(), 1);
        assert!(nccl_choice(&eight, Collective::AllToAll, 64, 1 << 20, 8).is_none());
    }

    #[test]
    fn the_ring_model_is_nccls_formula() {
        // 2 servers x 8 GPUs, Simple ring AllReduce of 1 GiB, worked by hand from NCCL's
        // constants: busbw = 8 NICs x 50 GB/s = 400; algbw = 400 * 16 / 30; latency
        // 8.4 + (30 - 2) * max(3.4, 3.0) + 2 * 14 = 131.6 us, times 1.4 (plateau).
        let cl = cluster(2, 8);
        let s = Shape::new(&cl, 16, 8);
        let t = s
            .time(AR, NcclAlgo::Ring, Protocol::Simple, 1 << 30)
            .unwrap();
        let want = (131.6 * 1.4 + (1u64 << 30) as f64 / (1000.0 * 400.0 * 16.0 / 30.0)) * 1e-6;
        assert!((t - want).abs() < 1e-9, "{t} vs {want}");
    }
}
