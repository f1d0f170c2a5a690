//! How fast the packet engine runs: events per second on one core, for a ring AllReduce and
//! an incast-heavy all-to-all on a 1,024-endpoint RoCE leaf-spine with PFC, ECN and DCQCN.
//!
//! `cargo run --release -p monel-fabric --example packet_speed [-- ENDPOINTS]`

use std::time::Instant;

use monel_ccl::RedOp;
use monel_ccl::plan::{Algorithm, Collective, schedule};
use monel_fabric::*;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1024, |s| s.parse().expect("ENDPOINTS: a number"));
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
    let run = |name: &str, coll: Collective, algo: Algorithm, count: usize| {
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
        Collective::AllReduce(RedOp::Sum),
        Algorithm::Ring,
        16 << 20,
    );
    run(
        "all-to-all 64 MiB/rank",
        Collective::AllToAll,
        Algorithm::Direct,
        (16 << 20) / n,
    );
}
