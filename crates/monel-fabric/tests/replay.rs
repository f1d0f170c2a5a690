//! The fluid engine against closed forms: ring AllReduce on a non-blocking fabric takes
//! exactly 2(n-1)·alpha + 2(n-1)/n · S/B, and all-to-all on an oversubscribed leaf-spine
//! is as much slower as the oversubscription says.

use monel_fabric::*;
use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective, schedule};

mod common;
use common::one_switch;

fn schedules(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    count: usize,
) -> Vec<monel_sched::schedule::Schedule> {
    (0..n)
        .map(|r| schedule(coll, algo, n, r, count, 1 << 20, false).unwrap())
        .collect()
}

fn jobs(place: &[usize], scheds: Vec<monel_sched::schedule::Schedule>) -> Vec<Job> {
    vec![Job {
        gpus: place.to_vec(),
        schedules: scheds,
        rail: None,
        elem_bytes: 4,
    }]
}

#[test]
fn ring_allreduce_matches_the_alpha_beta_formula() {
    let (bps, lat, overhead) = (400e9, 1e-6, 2e-6);
    for n in [2usize, 3, 8, 16, 64] {
        let fabric = one_switch(n, bps, lat);
        let count = n * 262_144; // f32 elements, divisible by n
        let s = (count * 4) as f64;
        let scheds = schedules(Collective::AllReduce(RedOp::Sum), Algorithm::Ring, n, count);
        let place: Vec<usize> = (0..n).collect();
        let got = replay(&fabric, &jobs(&place, scheds), overhead).unwrap();
        let alpha = 2.0 * lat + overhead;
        let want = 2.0 * (n - 1) as f64 * alpha + 2.0 * (n - 1) as f64 / n as f64 * s * 8.0 / bps;
        assert!(
            ((got.time_s - want) / want).abs() < 1e-9,
            "n={n}: replay {} s, formula {want} s",
            got.time_s
        );
        assert_eq!(got.messages, 2 * (n - 1) * n);
        assert_eq!(got.fabric_contention_s, 0.0);
    }
}

#[test]
fn oversubscription_slows_all_to_all_by_its_factor() {
    let (bps, n) = (100e9, 16);
    let count = n * 65_536;
    let scheds = schedules(Collective::AllToAll, Algorithm::Direct, n, count / n);
    let place: Vec<usize> = (0..n).collect();
    let run = |spines: usize| {
        let f = LeafSpine {
            leaves: 2,
            hosts_per_leaf: n / 2,
            spines,
            host_link_bps: bps,
            spine_link_bps: bps,
            link_latency_s: 0.0,
        }
        .build()
        .map(Cluster::plain)
        .unwrap();
        replay(&f, &jobs(&place, scheds.clone()), 0.0).unwrap()
    };
    // 8 spines under 8 hosts per leaf: non-blocking in capacity, but ECMP hashing still puts
    // some pairs on the same spine. 1 spine: 8:1 oversubscribed.
    let wide = run(8);
    let narrow = run(1);
    // Each host sends n-1 messages of count/n elements; half of them cross the spine layer.
    let per_pair_bits = (count / n * 4 * 8) as f64;
    let host_bound = (n - 1) as f64 * per_pair_bits / bps;
    let crossing_bits = (n / 2 * n / 2) as f64 * per_pair_bits; // each direction
    let spine_bound = crossing_bits / bps;
    assert!(wide.time_s >= host_bound * (1.0 - 1e-9), "{wide:?}");
    assert!(narrow.time_s >= spine_bound * (1.0 - 1e-9), "{narrow:?}");
    assert!(
        narrow.time_s > 3.0 * wide.time_s,
        "narrow {narrow:?} wide {wide:?}"
    );
    assert!(narrow.fabric_contention_s > 0.0);
}

#[test]
fn ecmp_is_deterministic_and_spreads_over_spines() {
    let f = LeafSpine {
        leaves: 2,
        hosts_per_leaf: 4,
        spines: 4,
        host_link_bps: 1e9,
        spine_link_bps: 1e9,
        link_latency_s: 0.0,
    }
    .build()
    .unwrap();
    let mut used = [0usize; 4];
    for sport in 0xC000..0xC000 + 256u16 {
        let s = f.spine_of(0, 5, sport).unwrap();
        assert_eq!(f.spine_of(0, 5, sport), Some(s));
        used[s] += 1;
    }
    assert!(used.iter().all(|&u| u > 32), "{used:?}");
    assert_eq!(f.spine_of(0, 3, 0xC000), None, "same leaf");
    assert_eq!(f.path(2, 2, 0xC000), Vec::<usize>::new());
}

#[test]
fn impossible_topologies_and_placements_are_named() {
    let base = LeafSpine {
        leaves: 2,
        hosts_per_leaf: 4,
        spines: 1,
        host_link_bps: 1e9,
        spine_link_bps: 1e9,
        link_latency_s: 0.0,
    };
    let e = LeafSpine { spines: 0, ..base }.build().unwrap_err();
    assert_eq!(e.field, "spines");
    assert!(e.to_string().contains("topology.spines"), "{e}");
    let e = LeafSpine {
        hosts_per_leaf: 0,
        ..base
    }
    .build()
    .unwrap_err();
    assert_eq!(e.field, "hosts_per_leaf");
    let e = LeafSpine {
        host_link_bps: 0.0,
        ..base
    }
    .build()
    .unwrap_err();
    assert_eq!(e.field, "host_link");
    let f = Cluster::plain(base.build().unwrap());
    let scheds = schedules(Collective::AllReduce(RedOp::Sum), Algorithm::Ring, 2, 8);
    let e = replay(&f, &jobs(&[0, 99], scheds.clone()), 0.0).unwrap_err();
    assert!(matches!(e, ReplayError::Placement(_)), "{e}");
    // Mismatched schedules (a rank waits for a message never sent) are a deadlock, not a hang.
    let mut bad = scheds;
    bad[0].steps.clear();
    let e = replay(&f, &jobs(&[0, 1], bad), 0.0).unwrap_err();
    assert!(matches!(e, ReplayError::Deadlock(_)), "{e}");
}
