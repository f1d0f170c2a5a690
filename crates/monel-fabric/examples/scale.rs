//! How long the lockstep engine takes for ring AllReduce at scale:
//! `cargo run --release -p monel-fabric --example scale -- 16384 100000`.
use std::time::Instant;

use monel_fabric::*;
use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective};

fn main() {
    for arg in std::env::args().skip(1) {
        let gpus: usize = arg.parse().expect("a GPU count");
        let t0 = Instant::now();
        let servers = gpus.div_ceil(8);
        // Rail-optimized, 32 servers per unit, radix-64 leaves.
        let units = servers.div_ceil(32);
        let f = RailOptimized {
            units,
            servers_per_unit: 32,
            rails: 8,
            spines: 32,
            link_bps: 400e9,
            link_latency_s: 600e-9,
        }
        .build()
        .unwrap();
        let c = Cluster::new(
            f,
            Server {
                gpus: 8,
                nics: 8,
                nvlink_bps: 3.6e12,
                pcie_bps: 512e9,
            },
        )
        .unwrap();
        let built = t0.elapsed();
        let spec = CollectiveSpec {
            coll: Collective::AllReduce(RedOp::Sum),
            algo: Algorithm::Ring,
            bytes: 1 << 30,
            elem_bytes: 4,
            channels: 8,
            ranks: gpus,
        };
        let o = run_collective(&c, &spec, Engine::Lockstep, 2e-6).unwrap();
        println!(
            "{gpus} GPUs: build {:.2} s, total {:.2} s; ring 1 GiB {:.3} ms, busbw {:.1} GB/s, {:?}",
            built.as_secs_f64(),
            t0.elapsed().as_secs_f64(),
            o.time_s * 1e3,
            o.busbw / 1e9,
            o.stats
                .map(|s| (s.steps, s.distinct_steps, s.max_flows_per_fabric_link))
        );
    }
}
