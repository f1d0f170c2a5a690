//! The planner's engines against each other and against closed forms, on servers with GPUs
//! and NICs: the lockstep engine equals the alpha-beta ring, agrees with the event engine where
//! ECMP collides, sees a 1:4 NIC ratio and oversubscription, and prices a fabric.

use monel_fabric::*;
use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective};

fn leaf_spine(leaves: usize, ports: usize, spines: usize, bps: f64, lat: f64) -> Fabric {
    LeafSpine {
        leaves,
        hosts_per_leaf: ports,
        spines,
        host_link_bps: bps,
        spine_link_bps: bps,
        link_latency_s: lat,
    }
    .build()
    .unwrap()
}

/// A server of `gpus` GPUs with a NIC each, NVLink at 3.6 Tb/s, PCIe at 512 Gb/s.
fn server(gpus: usize) -> Server {
    Server {
        gpus,
        nics: gpus,
        nvlink_bps: 3.6e12,
        pcie_bps: 512e9,
    }
}

fn allreduce(bytes: u64, channels: usize) -> CollectiveSpec {
    CollectiveSpec {
        coll: Collective::AllReduce(RedOp::Sum),
        algo: Algorithm::Ring,
        bytes,
        elem_bytes: 4,
        channels,
        ranks: 0,
    }
}

#[test]
fn lockstep_ring_matches_the_alpha_beta_formula() {
    let (bps, lat, overhead) = (400e9, 1e-6, 2e-6);
    for n in [2usize, 5, 16, 128] {
        let c = Cluster::plain(leaf_spine(1, n, 0, bps, lat));
        let bytes = (n * 65_536 * 4) as u64;
        let got = run_collective(&c, &allreduce(bytes, 1), Engine::Lockstep, overhead).unwrap();
        let want = 2.0 * (n - 1) as f64 * (2.0 * lat + overhead)
            + 2.0 * (n - 1) as f64 / n as f64 * bytes as f64 * 8.0 / bps;
        assert!(
            ((got.time_s - want) / want).abs() < 1e-9,
            "n={n}: {} vs {want}",
            got.time_s
        );
        let s = got.stats.unwrap();
        assert_eq!((s.steps, s.distinct_steps), (2 * (n - 1), 1));
        assert!(
            (got.busbw - bps / 8.0 * 0.0 - got.algbw * 2.0 * (n - 1) as f64 / n as f64).abs()
                < 1e-3
        );
    }
}

#[test]
fn lockstep_and_event_engines_agree_on_mid_size_fabrics() {
    // 64 GPUs, 8 per server, one NIC each, on a leaf-spine where ECMP collides; 8 channels.
    let server = server(8);
    for (spines, channels, algo) in [
        (4, 8, Algorithm::Ring),
        (2, 1, Algorithm::Ring),
        (4, 1, Algorithm::Halving),
        (4, 1, Algorithm::Hier),
        (16, 1, Algorithm::Hier),
    ] {
        let c = Cluster::new(leaf_spine(4, 16, spines, 400e9, 1e-6), server.clone()).unwrap();
        let spec = CollectiveSpec {
            algo,
            ..allreduce(64 << 20, channels)
        };
        let ev = run_collective(&c, &spec, Engine::Event, 2e-6).unwrap();
        let ls = run_collective(&c, &spec, Engine::Lockstep, 2e-6).unwrap();
        assert_eq!((ev.engine, ls.engine), (Engine::Event, Engine::Lockstep));
        let err = (ls.time_s - ev.time_s).abs() / ev.time_s;
        eprintln!(
            "{spines} spines, {channels} channels, {algo:?}: lockstep {:.4} ms, event {:.4} ms, {:+.1}%",
            ls.time_s * 1e3,
            ev.time_s * 1e3,
            100.0 * (ls.time_s / ev.time_s - 1.0)
        );
        // The hierarchy is rings in phases, which meet at the phase boundaries: lockstep
        // charges the phases as rings, and came out 0-14% above the event engine in every case
        // measured (48 to 1,024 GPUs).
        let ok = if algo == Algorithm::Hier {
            (-0.01..0.15).contains(&(ls.time_s / ev.time_s - 1.0))
        } else {
            err < 0.07
        };
        assert!(
            ok,
            "{spines} spines, {channels} channels, {algo:?}: lockstep {} s, event {} s",
            ls.time_s, ev.time_s
        );
    }
}

/// The hierarchical AllReduce (rings inside servers over NVLink around one ring per local GPU
/// between servers, each over its GPU's own NIC), with the ranks of each server as a host.
/// The lockstep engine describes all ranks by the first server's (host symmetry): on one
/// switch it equals the event engine, which replays every rank's own schedule. At scale it
/// beats the flat ring where the ring's 2(n-1) steps dominate, and loses where bytes do (its
/// phases take turns on NVLink and the network, which the ring's channels use at once).
#[test]
fn the_hierarchy_replays_alike_on_both_engines_and_scales_past_the_flat_ring() {
    let server = server(8);
    let hier = |bytes, channels| CollectiveSpec {
        algo: Algorithm::Hier,
        ..allreduce(bytes, channels)
    };
    // One leaf, 8 servers: no ECMP.
    let c = Cluster::new(leaf_spine(1, 64, 0, 400e9, 1e-6), server.clone()).unwrap();
    let ev = run_collective(&c, &hier(64 << 20, 1), Engine::Event, 2e-6).unwrap();
    let auto = run_collective(&c, &hier(64 << 20, 1), Engine::Auto, 2e-6).unwrap();
    assert_eq!(
        auto.engine,
        Engine::Lockstep,
        "host symmetry runs in lockstep"
    );
    let err = (auto.time_s - ev.time_s).abs() / ev.time_s;
    assert!(
        err < 1e-9,
        "lockstep {} s, event {} s",
        auto.time_s,
        ev.time_s
    );
    let s = auto.stats.unwrap();
    assert!(s.distinct_steps < s.steps, "{s:?}");
    // 2,048 GPUs, rail-optimized: a 25 MiB bucket and 1 GiB, hierarchy against 8 rings.
    let rail = |gpus: usize| {
        let f = RailOptimized {
            units: gpus.div_ceil(8 * 32),
            servers_per_unit: 32,
            rails: 8,
            spines: 32,
            link_bps: 400e9,
            link_latency_s: 600e-9,
        }
        .build()
        .unwrap();
        Cluster::new(f, server.clone()).unwrap()
    };
    let c = rail(2048);
    let t = |spec: CollectiveSpec| {
        run_collective(
            &c,
            &CollectiveSpec {
                ranks: 2048,
                ..spec
            },
            Engine::Auto,
            2e-6,
        )
        .unwrap()
        .time_s
    };
    let (ring_small, hier_small) = (t(allreduce(25 << 20, 8)), t(hier(25 << 20, 1)));
    let (ring_big, hier_big) = (t(allreduce(1 << 30, 8)), t(hier(1 << 30, 1)));
    eprintln!(
        "2048 GPUs: 25 MiB ring {:.3} ms, hier {:.3} ms; 1 GiB ring {:.3} ms, hier {:.3} ms",
        ring_small * 1e3,
        hier_small * 1e3,
        ring_big * 1e3,
        hier_big * 1e3
    );
    assert!(
        hier_small < ring_small / 4.0,
        "{hier_small} vs {ring_small}"
    );
    // 64 GPUs, 1 GiB: the ring's channels keep NVLink and the NICs busy together.
    let c = Cluster::new(leaf_spine(1, 64, 0, 400e9, 1e-6), server.clone()).unwrap();
    let ring = run_collective(&c, &allreduce(1 << 30, 8), Engine::Auto, 2e-6).unwrap();
    let h = run_collective(&c, &hier(1 << 30, 1), Engine::Auto, 2e-6).unwrap();
    assert!(ring.time_s < h.time_s, "{} vs {}", ring.time_s, h.time_s);
    // One GPU per server has no hierarchy: it is the ring.
    let one = Server {
        gpus: 1,
        nics: 1,
        ..server
    };
    let c = Cluster::new(leaf_spine(1, 16, 0, 400e9, 1e-6), one).unwrap();
    let ring = run_collective(&c, &allreduce(16 << 20, 1), Engine::Auto, 2e-6).unwrap();
    let h = run_collective(&c, &hier(16 << 20, 1), Engine::Auto, 2e-6).unwrap();
    assert_eq!(ring.time_s, h.time_s);
}

#[test]
fn a_nic_per_four_gpus_slows_the_inter_server_ring() {
    let run = |nics: usize| {
        let f = leaf_spine(1, 8 * nics, 0, 400e9, 1e-6);
        let c = Cluster::new(
            f,
            Server {
                gpus: 8,
                nics,
                nvlink_bps: 7.2e12,
                pcie_bps: 512e9,
            },
        )
        .unwrap();
        run_collective(&c, &allreduce(1 << 30, 8), Engine::Auto, 2e-6).unwrap()
    };
    let (one, four) = (run(8), run(2));
    // 8 channels on 8 NICs vs 4 channels on each of 2 NICs: the NIC is the bottleneck.
    let ratio = four.time_s / one.time_s;
    assert!((3.5..=4.1).contains(&ratio), "1:4 / 1:1 = {ratio}");
}

#[test]
fn oversubscribed_leaves_slow_all_to_all_not_rings_in_locality_order() {
    let run = |spines: usize, coll: Collective, algo: Algorithm| {
        let c = Cluster::plain(leaf_spine(4, 16, spines, 100e9, 1e-6));
        let spec = CollectiveSpec {
            coll,
            algo,
            ..allreduce(64 << 20, 1)
        };
        run_collective(&c, &spec, Engine::Auto, 1e-6).unwrap()
    };
    let a2a = |s| run(s, Collective::AllToAll, Algorithm::Direct).time_s;
    let ring = |s| run(s, Collective::AllReduce(RedOp::Sum), Algorithm::Ring).time_s;
    // 4:1 (4 spines under 16 ports) against 1:1 (16 spines).
    assert!(a2a(4) > 2.0 * a2a(16), "{} vs {}", a2a(4), a2a(16));
    assert!(ring(4) < 1.05 * ring(16), "{} vs {}", ring(4), ring(16));
}

#[test]
fn ecmp_collisions_are_counted() {
    let c = Cluster::plain(leaf_spine(2, 32, 32, 100e9, 0.0));
    let spec = CollectiveSpec {
        coll: Collective::AllToAll,
        algo: Algorithm::Direct,
        ..allreduce(64 << 20, 1)
    };
    let s = run_collective(&c, &spec, Engine::Lockstep, 0.0)
        .unwrap()
        .stats
        .unwrap();
    assert!(s.max_flows_per_fabric_link > 1, "{s:?}");
    assert!(
        s.collided_fraction > 0.0 && s.collided_fraction <= 1.0,
        "{s:?}"
    );
    let u = s.fabric_utilization.unwrap();
    assert!(u > 0.0 && u <= 1.0, "{s:?}");
}

/// How far the lockstep engine (`engine`, which must pick it) lies above the event engine
/// on `spec`, as a fraction, printed with `what`.
fn lockstep_over_event(c: &Cluster, spec: &CollectiveSpec, engine: Engine, what: &str) -> f64 {
    let ls = run_collective(c, spec, engine, 2e-6).unwrap();
    assert_eq!(ls.engine, Engine::Lockstep, "{what}");
    let ev = run_collective(c, spec, Engine::Event, 2e-6).unwrap();
    let above = ls.time_s / ev.time_s - 1.0;
    eprintln!(
        "{what}: lockstep {:.1} us, event {:.1} us ({:+.1} %)",
        ls.time_s * 1e6,
        ev.time_s * 1e6,
        100.0 * above
    );
    above
}

#[test]
fn nccl_tree_runs_in_lockstep_and_agrees_with_the_event_engine() {
    // Servers of 1 GPU (the tree between servers is the whole tree), of 4 and of 8 GPUs
    // (chains inside servers), two leaves under two spines, sizes from latency- to
    // bandwidth-bound.
    for (per, servers, channels) in [(1usize, 16usize, 1usize), (4, 8, 4), (8, 8, 2)] {
        let c = Cluster::new(
            leaf_spine(2, servers * per / 2, 2, 100e9, 1e-6),
            server(per),
        )
        .unwrap();
        for bytes in [1u64 << 20, 16 << 20, 64 << 20] {
            let spec = CollectiveSpec {
                algo: Algorithm::Tree,
                ..allreduce(bytes, channels)
            };
            let what = format!("{servers} servers x {per}, {bytes} B, tree");
            let err = lockstep_over_event(&c, &spec, Engine::Auto, &what);
            assert!(err.abs() < 0.16, "{err}");
        }
    }
}

#[test]
fn training_overlaps_buckets_with_backward() {
    let c = Cluster::plain(leaf_spine(1, 8, 0, 100e9, 1e-6));
    let t = Training {
        forward_s: 0.010,
        backward_s: 0.020,
        optimizer_s: 0.002,
        gradient_bytes: 100 << 20,
        bucket_bytes: 25 << 20,
    };
    let r = training_step(
        &c,
        &t,
        &allreduce(0, 1),
        false,
        Engine::Auto,
        1e-6,
        &Scenario::default(),
    )
    .unwrap();
    assert_eq!(r.buckets, 4);
    // Each 25 MiB all-reduce takes ~3.7 ms at 100 Gb/s; three hide behind backward, the last
    // one is exposed.
    let one = run_collective(&c, &allreduce(25 << 20, 1), Engine::Auto, 1e-6)
        .unwrap()
        .time_s;
    assert!((r.allreduce_s - 4.0 * one).abs() < 1e-12);
    assert!((r.exposed_s - one).abs() < 1e-9, "{r:?} one={one}");
    assert!((r.step_s - (0.032 + one)).abs() < 1e-9);
    let e = training_step(
        &c,
        &Training {
            bucket_bytes: 0,
            ..t
        },
        &allreduce(0, 1),
        false,
        Engine::Auto,
        0.0,
        &Scenario::default(),
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("gradients"), "{e}");
}

#[test]
fn cost_counts_the_parts() {
    let f = FatTree {
        k: 8,
        tiers: 3,
        link_bps: 400e9,
        link_latency_s: 1e-6,
        pods: 0,
    }
    .build()
    .unwrap();
    let c = Cluster::plain(f);
    let p = Prices {
        switch_port: 10.0,
        nic: 1.0,
        cable: 0.5,
        optic: 0.25,
    };
    let k = cost(&c, &p, 128);
    assert_eq!(
        (k.switches, k.nics, k.cables, k.optics),
        (80, 128, 384, 512)
    );
    // Every switch port of a full k=8 fat-tree is used: 80 switches x 8 ports.
    assert_eq!(k.switch_ports, 640);
    assert_eq!(k.total, 6400.0 + 128.0 + 192.0 + 128.0);
    assert_eq!(k.per_gpu, k.total / 128.0);
}

fn servers(fabric: Fabric) -> Cluster {
    Cluster::new(fabric, server(8)).unwrap()
}

#[test]
fn packet_and_fluid_engines_agree_on_a_mid_size_ring() {
    // 64 GPUs on eight servers, 8 channels on 8 rails, a 64 MiB ring all-reduce: InfiniBand
    // (D-mod-k, credits) and RoCE (ECMP collisions, PFC, no DCQCN). The packet engine adds
    // headers and store-and-forward; queues and pauses replace fair sharing.
    let mut ib = leaf_spine(8, 8, 8, 400e9, 600e-9);
    ib.routing = Routing::DestMod;
    let roce = leaf_spine(8, 8, 8, 400e9, 600e-9);
    let mut bare = PacketParams::roce(400e9);
    bare.dcqcn = None;
    for (name, fabric, params) in [
        ("infiniband", ib, PacketParams::infiniband()),
        ("roce, PFC, no DCQCN", roce, bare),
    ] {
        let c = servers(fabric);
        let spec = allreduce(64 << 20, 8);
        let event = run_collective(&c, &spec, Engine::Event, 2e-6).unwrap();
        let scenario = Scenario {
            packet: Some(params),
            ..Scenario::default()
        };
        let packet = run_scenario(&c, &spec, Engine::Packet, 2e-6, &scenario).unwrap();
        let err = (packet.time_s - event.time_s) / event.time_s;
        assert!(
            err.abs() < 0.06,
            "{name}: packet {} s, event {} s ({:+.1}%)",
            packet.time_s,
            event.time_s,
            err * 100.0
        );
        let pk = packet.packet.as_ref().unwrap();
        assert_eq!(pk.drops, 0, "{name}: lossless");
        assert_eq!(pk.messages, 8 * 2 * 63 * 64, "{name}");
    }
}

#[test]
fn a_competing_job_slows_the_planned_one() {
    // 32 planned GPUs and 32 competing ones on a 4:1 oversubscribed leaf-spine of two
    // servers per leaf. Packed, each job has leaves of its own and they never meet; dealt
    // server by server, every leaf holds both and the competitor's all-to-all takes uplink
    // capacity from the ring.
    let c = servers(leaf_spine(4, 16, 4, 400e9, 600e-9));
    let spec = CollectiveSpec {
        ranks: 32,
        ..allreduce(32 << 20, 8)
    };
    let rival = |placement| Scenario {
        packet: None,
        background: vec![Background {
            spec: CollectiveSpec {
                coll: Collective::AllToAll,
                algo: Algorithm::Direct,
                bytes: 32 << 20,
                elem_bytes: 4,
                channels: 1,
                ranks: 32,
            },
        }],
        placement,
    };
    for engine in [Engine::Event, Engine::Packet, Engine::Lockstep] {
        let alone = run_scenario(&c, &spec, engine, 2e-6, &Scenario::default()).unwrap();
        let packed = run_scenario(&c, &spec, engine, 2e-6, &rival(Placement::Packed)).unwrap();
        let mixed = run_scenario(&c, &spec, engine, 2e-6, &rival(Placement::Interleaved)).unwrap();
        // Packed, only the spines are common: their shared buffers (PFC thresholds) are all
        // the packet engine can see of the other job.
        let same = (packed.time_s - alone.time_s).abs() / alone.time_s;
        let tolerance = if engine == Engine::Packet { 0.1 } else { 0.02 };
        assert!(
            same < tolerance,
            "{engine:?}: packed {} vs alone {}",
            packed.time_s,
            alone.time_s
        );
        assert!(
            mixed.time_s > 1.2 * alone.time_s,
            "{engine:?}: {} s alone, {} s sharing leaves with an all-to-all",
            alone.time_s,
            mixed.time_s
        );
    }
    let too_big = Scenario {
        background: vec![Background {
            spec: CollectiveSpec {
                ranks: 64,
                ..rival(Placement::Packed).background[0].spec.clone()
            },
        }],
        ..Scenario::default()
    };
    let e = run_scenario(&c, &spec, Engine::Auto, 2e-6, &too_big).unwrap_err();
    assert!(e.to_string().contains("need 12 servers"), "{e}");
}

/// At scale the engines still agree on the hierarchy: 1,024 GPUs (128 servers of 8, a NIC
/// each) on a 1:1 leaf-spine of 32 leaves with ECMP, 1 GiB (the event engine takes seconds
/// here, not minutes: a flow that starts or ends re-shares only the flows connected to it);
/// lockstep lands 0-15% above it, as on 64 GPUs (+9.0% when written).
#[test]
fn the_engines_agree_on_the_hierarchy_over_a_thousand_gpus() {
    let server = server(8);
    let c = Cluster::new(leaf_spine(32, 32, 32, 400e9, 600e-9), server).unwrap();
    let spec = CollectiveSpec {
        algo: Algorithm::Hier,
        ranks: 1024,
        ..allreduce(1 << 30, 1)
    };
    let above = lockstep_over_event(&c, &spec, Engine::Lockstep, "1,024 GPUs, hier");
    assert!((-0.01..0.15).contains(&above), "{above}");
}
