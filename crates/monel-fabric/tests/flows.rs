//! Flow lists: dependencies and pinned spines in the packet engine and the fluid model, and
//! the fluid model's timed draining against hand-worked answers.

use std::path::PathBuf;

use monel_fabric::{
    Design, FlowEngine, TrafficFlow, drain_timed, parse_design, run_traffic, sport_for_spine,
};

fn design() -> Design {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/htsim/leafspine32.toml");
    parse_design(&std::fs::read_to_string(p).unwrap(), "t", None).unwrap()
}

fn flow(from: usize, to: usize, bytes: u64, after: Vec<usize>) -> TrafficFlow {
    TrafficFlow {
        from,
        to,
        bytes,
        start_s: 0.0,
        after,
        spine: None,
    }
}

#[test]
fn fluid_draining_reshares_at_every_start_and_finish() {
    // One link of capacity 1: A (10 bits) from 0, B (4 bits) from 5, C (2 bits) after A.
    // A alone to 5 (5 left); shared at 0.5 each: B ends at 13, A has 1 left, ends at 14;
    // C starts at 14 and ends at 16.
    let path = [0usize];
    let (began, arrived) = drain_timed(
        &[1.0],
        &[10.0, 4.0, 2.0],
        &[0.0, 5.0, 0.0],
        &[vec![], vec![], vec![0]],
        |_| &path,
        |_| 0.0,
    );
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(
        close(arrived[0], 14.0) && close(arrived[1], 13.0) && close(arrived[2], 16.0),
        "{arrived:?}"
    );
    assert!(close(began[2], 14.0), "{began:?}");
    // Latency delays the arrival, and what waits for it.
    let (_, arrived) = drain_timed(
        &[1.0],
        &[4.0, 4.0],
        &[0.0, 0.0],
        &[vec![], vec![0]],
        |_| &path,
        |_| 1.0,
    );
    assert!(
        close(arrived[0], 5.0) && close(arrived[1], 10.0),
        "{arrived:?}"
    );
}

#[test]
fn dependent_flows_start_when_what_they_wait_for_arrives() {
    let d = design();
    let p = d.scenario.packet.clone().unwrap();
    // A chain across leaves: 0 -> 5 -> 10 -> 15, 1 MiB each.
    let chain = vec![
        flow(0, 5, 1 << 20, vec![]),
        flow(5, 10, 1 << 20, vec![0]),
        flow(10, 15, 1 << 20, vec![1]),
    ];
    let wire = (1u64 << 20) as f64 * 8.0 / 100e9; // one flow's serialization, seconds
    for engine in [FlowEngine::Packet, FlowEngine::Fluid] {
        let r = run_traffic(&d.cluster, &chain, engine, &p).unwrap();
        for i in 1..3 {
            assert!(r.start_s[i] >= r.done_s[i - 1] - 1e-12, "{engine:?}: {r:?}");
            assert!(r.done_s[i] - r.done_s[i - 1] >= wire, "{engine:?}: {r:?}");
        }
        // Without the dependencies all three overlap and end in about one flow's time.
        let free: Vec<TrafficFlow> = chain
            .iter()
            .map(|f| TrafficFlow {
                after: vec![],
                ..f.clone()
            })
            .collect();
        let q = run_traffic(&d.cluster, &free, engine, &p).unwrap();
        assert!(
            q.makespan_s() < r.makespan_s() / 2.0,
            "{engine:?}: {q:?} vs {r:?}"
        );
    }
}

#[test]
fn pinned_flows_cross_their_spine_and_impossible_pins_are_errors() {
    let d = design();
    for spine in 0..4 {
        let s = sport_for_spine(&d.cluster, 0, 31, spine).expect("every spine reaches leaf 7");
        assert_eq!(d.cluster.spine_of(0, 31, None, s), Some(spine));
    }
    assert_eq!(sport_for_spine(&d.cluster, 0, 31, 4), None);
    // Two flows from one leaf to another, forced onto one spine, share its links: each takes
    // about twice as long as on two spines.
    let p = d.scenario.packet.clone().unwrap();
    let pin = |s0, s1| {
        vec![
            TrafficFlow {
                spine: Some(s0),
                ..flow(0, 28, 4 << 20, vec![])
            },
            TrafficFlow {
                spine: Some(s1),
                ..flow(1, 29, 4 << 20, vec![])
            },
        ]
    };
    for engine in [FlowEngine::Packet, FlowEngine::Fluid] {
        let apart = run_traffic(&d.cluster, &pin(0, 1), engine, &p)
            .unwrap()
            .makespan_s();
        let shared = run_traffic(&d.cluster, &pin(2, 2), engine, &p)
            .unwrap()
            .makespan_s();
        assert!(shared > 1.8 * apart, "{engine:?}: {shared} vs {apart}");
    }
    // Within one leaf no spine is crossed.
    let same_leaf = vec![TrafficFlow {
        spine: Some(0),
        ..flow(0, 1, 8, vec![])
    }];
    let e = run_traffic(&d.cluster, &same_leaf, FlowEngine::Packet, &p).unwrap_err();
    assert!(e.to_string().contains("spine 0"), "{e}");
    // Dependencies in a cycle, or on a flow that is not there, are errors in both engines.
    for engine in [FlowEngine::Packet, FlowEngine::Fluid] {
        let cycle = vec![flow(0, 5, 8, vec![1]), flow(5, 0, 8, vec![0])];
        let e = run_traffic(&d.cluster, &cycle, engine, &p).unwrap_err();
        assert!(e.to_string().contains("cycle"), "{e}");
        let e = run_traffic(&d.cluster, &[flow(0, 5, 8, vec![3])], engine, &p).unwrap_err();
        assert!(e.to_string().contains("waits for flow 3"), "{e}");
    }
    // Flows outside the design are errors too.
    let e = run_traffic(&d.cluster, &[flow(0, 99, 8, vec![])], FlowEngine::Fluid, &p).unwrap_err();
    assert!(e.to_string().contains("outside"), "{e}");
}

#[test]
fn the_fluid_model_names_its_risk_where_flows_share_a_link() {
    let d = design();
    let p = d.scenario.packet.clone().unwrap();
    // 0 -> 4 and 8 -> 12 cross disjoint leaves' links; 0 -> 28 and 4 -> 28 share the receiver's.
    let apart = vec![flow(0, 4, 1 << 20, vec![]), flow(8, 12, 1 << 20, vec![])];
    let r = run_traffic(&d.cluster, &apart, FlowEngine::Fluid, &p).unwrap();
    assert_eq!((r.most_on_a_link, r.shared_links), (1, 0));
    assert_eq!(r.fluid_risk(), None);
    let incast = vec![flow(0, 28, 1 << 20, vec![]), flow(4, 28, 1 << 20, vec![])];
    let r = run_traffic(&d.cluster, &incast, FlowEngine::Fluid, &p).unwrap();
    assert!(r.most_on_a_link == 2 && r.shared_links >= 1, "{r:?}");
    let risk = r.fluid_risk().expect("a shared link is a risk");
    assert!(
        risk.contains("--engine packet") && risk.contains("PFC"),
        "{risk}"
    );
    // One after the other, they never share: no risk.
    let chained = vec![flow(0, 28, 1 << 20, vec![]), flow(4, 28, 1 << 20, vec![0])];
    let r = run_traffic(&d.cluster, &chained, FlowEngine::Fluid, &p).unwrap();
    assert_eq!(r.fluid_risk(), None, "{r:?}");
    // The packet engine models the pauses itself.
    let r = run_traffic(&d.cluster, &incast, FlowEngine::Packet, &p).unwrap();
    assert_eq!(r.fluid_risk(), None);
}
