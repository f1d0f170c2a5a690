//! How fast the packet engine runs: events per second on one core, for a ring AllReduce on a
//! 1,024-endpoint RoCE leaf-spine with PFC, ECN and DCQCN, and an all-to-all (a QP per rank
//! pair: congestion everywhere) on 128 of them.
//!
//! `cargo run --release -p monel-fabric --example packet_speed [-- RING_ENDPOINTS [A2A_ENDPOINTS]]`

use std::time::Instant;

use monel_fabric::*;
use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective, schedule};

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .map_or(d, |s| s.parse().expect("ENDPOINTS: a number"))
    };
    let (ring_n, a2a_n) = (arg(1, 1024), arg(2, 128));
    let n = ring_n.max(a2a_n);
    let per_leaf = 32;
    let cluster = LeafSpine {
        leaves: n.div_ceil(per_leaf),
        hosts_per_leaf: per_leaf,
        spines: per_leaf / 2,
        host_link_bps: 400e9,
        spine_link_bps: 400e9,
        link_latency_s: 1e-6,
    }
    .build()
    .map(Cluster::plain)
    .expect("a fabric");
    let p = PacketParams::roce(400e9);
    let run = |name: &str, n: usize, coll: Collective, algo: Algorithm, count: usize| {
        let jobs = vec![Job {
            gpus: (0..n).collect(),
            schedules: (0..n)
                .map(|r| schedule(coll, algo, n, r, count, 1 << 20, false).expect("a schedule"))
                .collect(),
            rail: None,
            elem_bytes: 4,
        }];
        let t0 = Instant::now();
        let r = simulate_jobs(&cluster, &jobs, &p, 1e-6).expect("runs");
        let wall = t0.elapsed().as_secs_f64();
        println!(
            "{name:>22} {n} endpoints: {:>11} events, {:>9} packets in {wall:6.2} s = {:5.1} M events/s; \
             simulated {:.3} ms, {} pauses, {} ECN marks",
            r.events,
            r.packets,
            r.events as f64 / wall / 1e6,
            r.time_s * 1e3,
            r.pauses,
            r.ecn_marks
        );
    };
    run(
        "ring allreduce 64 MiB",
        ring_n,
        Collective::AllReduce(RedOp::Sum),
        Algorithm::Ring,
        16 << 20,
    );
    run(
        "all-to-all 64 MiB/rank",
        a2a_n,
        Collective::AllToAll,
        Algorithm::Direct,
        (16 << 20) / a2a_n,
    );
}
