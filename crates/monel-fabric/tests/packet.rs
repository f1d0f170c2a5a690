//! The packet engine against closed forms, the fluid engine, and DCQCN's and PFC's known
//! behaviour: convergence to the fair share, pauses under incast that spread upstream,
//! lossless credits, adaptive routing around ECMP collisions.

use monel_fabric::*;
use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective, schedule};

mod common;
use common::one_switch;

fn flow(from: usize, to: usize, bytes: u64, start_s: f64) -> Flow {
    Flow {
        from,
        to,
        bytes,
        start_s,
        sport: sport(0, from, to),
        rail: None,
    }
}

/// No congestion control, no ECN: only flow control.
fn bare(mut p: PacketParams) -> PacketParams {
    p.ecn = None;
    p.dcqcn = None;
    p
}

fn ring_jobs(n: usize, count: usize) -> Vec<Job> {
    vec![Job {
        gpus: (0..n).collect(),
        schedules: (0..n)
            .map(|r| {
                schedule(
                    Collective::AllReduce(RedOp::Sum),
                    Algorithm::Ring,
                    n,
                    r,
                    count,
                    1 << 20,
                    false,
                )
                .unwrap()
            })
            .collect(),
        rail: None,
        elem_bytes: 4,
    }]
}

#[test]
fn one_flow_takes_its_packets_serialization_plus_latency() {
    let (bps, lat) = (100e9, 1e-6);
    let c = one_switch(2, bps, lat);
    let p = PacketParams::infiniband();
    let bytes = 1_000_000u64;
    let r = simulate_flows(&c, &[flow(0, 1, bytes, 0.0)], &p).unwrap();
    let mtu = u64::from(p.mtu);
    let packets = bytes.div_ceil(mtu);
    let wire = bytes + packets * u64::from(p.header_bytes);
    let first = mtu + u64::from(p.header_bytes);
    // Store and forward at equal speeds: the second link starts when the first packet has
    // crossed the first, then sends every packet back to back.
    let want = (first + wire) as f64 * 8.0 / bps + 2.0 * lat;
    assert!(
        (r.flow_done_s[0] - want).abs() < 1e-9,
        "{} s vs {want} s",
        r.flow_done_s[0]
    );
    assert_eq!(r.packets, packets);
    assert_eq!(r.bytes, bytes);
    assert_eq!((r.drops, r.pauses), (0, 0));
}

#[test]
fn ring_allreduce_agrees_with_the_fluid_engine_and_the_formula() {
    let (bps, lat, overhead) = (100e9, 1e-6, 2e-6);
    for n in [4usize, 8] {
        let c = one_switch(n, bps, lat);
        let count = n * 65_536;
        let s = (count * 4) as f64;
        let jobs = ring_jobs(n, count);
        let fluid = replay(&c, &jobs, overhead).unwrap().time_s;
        let alpha = 2.0 * lat + overhead;
        let formula =
            2.0 * (n - 1) as f64 * alpha + 2.0 * (n - 1) as f64 / n as f64 * s * 8.0 / bps;
        for p in [PacketParams::infiniband(), PacketParams::roce(bps)] {
            let got = simulate_jobs(&c, &jobs, &p, overhead).unwrap();
            let err = (got.time_s - fluid) / fluid;
            // Packets add headers (0.6-1.9%) and store-and-forward; nothing else.
            assert!(
                (0.0..0.04).contains(&err),
                "n={n} {:?}: packet {} s, fluid {fluid} s ({:+.2}%)",
                p.flow_control,
                got.time_s,
                err * 100.0
            );
            assert!((fluid - formula).abs() / formula < 1e-9);
            assert_eq!(got.messages, 2 * (n - 1) * n);
            assert_eq!((got.drops, got.pauses, got.ecn_marks), (0, 0, 0));
        }
    }
}

fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * q)
}

#[test]
fn dcqcn_converges_to_the_fair_share() {
    // The DCQCN paper's experiment: a flow at line rate, a second one joining it on the same
    // receiver port; ECN marks, CNPs and rate cuts bring both to half the link.
    let bps = 100e9;
    let c = one_switch(3, bps, 1e-6);
    let mut p = PacketParams::roce(bps);
    p.sample_s = Some(250e-6);
    let bytes = 400_000_000u64;
    let flows = [flow(0, 2, bytes, 0.0), flow(1, 2, bytes, 2e-3)];
    let r = simulate_flows(&c, &flows, &p).unwrap();
    let both: Vec<&Sample> = r
        .samples
        .iter()
        .filter(|s| s.t_s > 4e-3 && s.t_s < r.flow_done_s[0].min(r.flow_done_s[1]) - 1e-3)
        .collect();
    assert!(both.len() > 100, "{} samples", both.len());
    let (mut a, mut b, mut worst) = (0.0, 0.0, 1.0f64);
    for s in &both {
        a += s.goodput_bps[0] / both.len() as f64;
        b += s.goodput_bps[1] / both.len() as f64;
        worst = worst.min(jain(&s.goodput_bps));
    }
    let line = bps * 4096.0 / (4096.0 + 78.0);
    assert!(
        (0.45..0.55).contains(&(a / line)) && (0.45..0.55).contains(&(b / line)),
        "mean goodputs {:.1} and {:.1} Gb/s of {:.1}",
        a / 1e9,
        b / 1e9,
        line / 1e9
    );
    assert!((a + b) / line > 0.95, "link used {:.3}", (a + b) / line);
    assert!(
        worst > 0.95,
        "Jain's index fell to {worst:.3} after 2 ms together"
    );
    assert!(
        r.ecn_marks > 100 && r.cnps > 100,
        "{} marks, {} CNPs",
        r.ecn_marks,
        r.cnps
    );
    let kmax = p.ecn.unwrap().kmax_bytes;
    assert!(
        r.max_queue_bytes < kmax,
        "queue {} B, Kmax {kmax} B",
        r.max_queue_bytes
    );
    assert_eq!(
        (r.pauses, r.drops),
        (0, 0),
        "DCQCN keeps the queue under PFC's threshold"
    );

    // Without DCQCN the same two flows fill the buffer until PFC pauses them.
    let r = simulate_flows(&c, &flows, &bare(PacketParams::roce(bps))).unwrap();
    assert!(
        r.pauses > 0 && r.drops == 0,
        "{} pauses, {} drops",
        r.pauses,
        r.drops
    );
    assert!(
        r.max_queue_bytes > 4 * kmax,
        "queue {} B",
        r.max_queue_bytes
    );
}

#[test]
fn pfc_pauses_under_incast_spread_upstream_and_slow_a_victim() {
    // Four leaves of four hosts, one spine, non-blocking (spine links 4x). Seven senders on
    // leaves 0 and 1 incast into host 8 on leaf 2; host 0 on leaf 0 sends to host 12 on leaf
    // 3, a receiver nobody else uses.
    let c = LeafSpine {
        leaves: 4,
        hosts_per_leaf: 4,
        spines: 1,
        host_link_bps: 100e9,
        spine_link_bps: 400e9,
        link_latency_s: 1e-6,
    }
    .build()
    .map(Cluster::plain)
    .unwrap();
    let mut p = bare(PacketParams::roce(100e9));
    p.switch_buffer_bytes = 4 << 20;
    let bytes = 20_000_000u64;
    let victim = flow(0, 12, bytes, 0.0);
    let alone = simulate_flows(&c, &[victim], &p).unwrap();
    let mut flows = vec![victim];
    for h in [1, 2, 3, 4, 5, 6, 7] {
        flows.push(flow(h, 8, bytes, 0.0));
    }
    let r = simulate_flows(&c, &flows, &p).unwrap();
    assert_eq!(r.drops, 0, "PFC is lossless");
    // The receiver's link is the bottleneck and stays busy.
    let wire = bytes as f64 * (4096.0 + 78.0) / 4096.0;
    let ideal = 7.0 * wire * 8.0 / 100e9;
    let last = r.flow_done_s[1..].iter().copied().fold(0.0, f64::max);
    assert!(
        (last - ideal).abs() / ideal < 0.03,
        "incast took {last} s, the receiver's link {ideal} s"
    );
    // Pauses reach the spine and the senders' leaves: the victim waits behind the incast.
    let f = &c.fabric;
    let spread = (0..f.links())
        .filter(|&l| f.kind[l] == LinkKind::Fabric && r.paused_s[l] > 0.0)
        .count();
    assert!(spread >= 2, "{spread} switch-to-switch links paused");
    assert!(
        r.paused_s[f.path(0, 12, victim.sport)[0]] > 0.0,
        "the victim's NIC was paused"
    );
    let slowed = r.flow_done_s[0] / alone.flow_done_s[0];
    assert!(slowed > 3.0, "victim slowed only {slowed:.2}x");

    // DCQCN cuts the incast's rates, so fewer pauses and a much less delayed victim.
    let mut q = PacketParams::roce(100e9);
    q.switch_buffer_bytes = 4 << 20;
    // ECN marks are random draws: three seeds.
    for seed in 1..4 {
        q.seed = seed;
        let d = simulate_flows(&c, &flows, &q).unwrap();
        assert!(
            d.pauses * 2 < r.pauses,
            "seed {seed}: {} vs {} pauses",
            d.pauses,
            r.pauses
        );
        assert!(
            d.flow_done_s[0] * 1.4 < r.flow_done_s[0],
            "seed {seed}: victim {} s with DCQCN, {} s without",
            d.flow_done_s[0],
            r.flow_done_s[0]
        );
    }
}

#[test]
fn infiniband_credits_are_lossless_under_incast() {
    let c = one_switch(9, 400e9, 1e-6);
    let mut p = PacketParams::infiniband();
    p.switch_buffer_bytes = 1 << 20;
    let bytes = 8_000_000u64;
    let flows: Vec<Flow> = (1..9).map(|h| flow(h, 0, bytes, 0.0)).collect();
    let r = simulate_flows(&c, &flows, &p).unwrap();
    assert_eq!((r.drops, r.pauses), (0, 0));
    assert_eq!(r.bytes, 8 * bytes);
    let wire = bytes as f64 * (4096.0 + 26.0) / 4096.0;
    let ideal = 8.0 * wire * 8.0 / 400e9;
    let last = r.flow_done_s.iter().copied().fold(0.0, f64::max);
    assert!((last - ideal) / ideal < 0.02, "{last} s vs {ideal} s");
    // Credits bound what waits at the switch to what the senders' links hold: a round trip
    // of data each, not the incast.
    let credits = (4.0 * 1e-6 * 400e9 / 8.0) as u64 + 4 * (4096 + 26);
    assert!(
        r.max_queue_bytes <= 8 * credits,
        "queue {} B",
        r.max_queue_bytes
    );
    assert!(r.max_queue_bytes > credits, "queue {} B", r.max_queue_bytes);
    // The same incast without flow control overflows a small buffer, loses packets, and
    // still completes by resending them.
    let mut lossy = bare(PacketParams::roce(400e9));
    lossy.flow_control = FlowControl::Lossy;
    lossy.switch_buffer_bytes = 1 << 20;
    let l = simulate_flows(&c, &flows, &lossy).unwrap();
    assert!(l.drops > 0);
    assert_eq!(l.bytes, 8 * bytes, "every byte delivered once");
}

#[test]
fn adaptive_routing_avoids_ecmp_collisions() {
    // Two leaves of eight hosts, eight spines: non-blocking, but a permutation from leaf 0
    // to leaf 1 hashes several flows onto one spine.
    let c = LeafSpine {
        leaves: 2,
        hosts_per_leaf: 8,
        spines: 8,
        host_link_bps: 400e9,
        spine_link_bps: 400e9,
        link_latency_s: 1e-6,
    }
    .build()
    .map(Cluster::plain)
    .unwrap();
    let bytes = 16_000_000u64;
    let flows: Vec<Flow> = (0..8).map(|h| flow(h, 8 + h, bytes, 0.0)).collect();
    let spines: std::collections::HashSet<_> = flows
        .iter()
        .map(|f| c.fabric.spine_of(f.from, f.to, f.sport))
        .collect();
    assert!(spines.len() < 8, "this permutation collides under ECMP");
    let mut p = bare(PacketParams::roce(400e9));
    let ecmp = simulate_flows(&c, &flows, &p).unwrap();
    p.adaptive_routing = true;
    let ar = simulate_flows(&c, &flows, &p).unwrap();
    let wire = bytes as f64 * (4096.0 + 78.0) / 4096.0;
    let ideal = wire * 8.0 / 400e9;
    let worst = |r: &PacketReport| r.flow_done_s.iter().copied().fold(0.0, f64::max);
    assert!(worst(&ecmp) > 1.5 * ideal, "ECMP {} s", worst(&ecmp));
    assert!(
        worst(&ar) < 1.1 * ideal,
        "AR {} s, ideal {ideal} s",
        worst(&ar)
    );
    assert_eq!(ar.bytes, 8 * bytes);
    // The report sees the collision and the idle spines it leaves.
    assert!(
        ecmp.max_qps_per_fabric_link >= 2,
        "{}",
        ecmp.max_qps_per_fabric_link
    );
    let (u_ecmp, u_ar) = (
        ecmp.fabric_utilization.unwrap(),
        ar.fabric_utilization.unwrap(),
    );
    assert!(
        u_ar > u_ecmp && u_ar <= 1.0,
        "utilization {u_ecmp} with ECMP, {u_ar} with AR"
    );
}

#[test]
fn bad_settings_name_the_field() {
    let c = one_switch(2, 100e9, 1e-6);
    let f = [flow(0, 1, 1000, 0.0)];
    let mut p = PacketParams::infiniband();
    p.mtu = 0;
    let e = simulate_flows(&c, &f, &p).unwrap_err().to_string();
    assert!(e.contains("packet.mtu") && e.contains("256"), "{e}");
    let mut p = PacketParams::roce(100e9);
    p.ecn = Some(Ecn {
        kmin_bytes: 10,
        kmax_bytes: 5,
        pmax: 0.2,
    });
    let e = simulate_flows(&c, &f, &p).unwrap_err().to_string();
    assert!(e.contains("packet.ecn"), "{e}");
    let e = simulate_flows(&c, &[flow(0, 7, 1, 0.0)], &PacketParams::infiniband())
        .unwrap_err()
        .to_string();
    assert!(e.contains("GPU 0 -> 7 outside"), "{e}");
}

#[test]
fn acks_ride_back_and_slow_opposite_data_by_their_share() {
    let (bps, lat) = (100e9, 1e-6);
    let c = one_switch(2, bps, lat);
    let mut p = bare(PacketParams::roce(bps));
    let bytes = 4u64 << 20;
    let packets = bytes.div_ceil(u64::from(p.mtu));
    // One flow: its ACKs use the idle reverse links, so it is no slower, and every data
    // packet is acknowledged once.
    let one = [flow(0, 1, bytes, 0.0)];
    let off = simulate_flows(&c, &one, &p).unwrap();
    assert_eq!(off.acks, 0);
    p.acks = true;
    let on = simulate_flows(&c, &one, &p).unwrap();
    assert_eq!((on.packets, on.acks), (packets, packets));
    assert!((on.flow_done_s[0] - off.flow_done_s[0]).abs() < 1e-9);
    // Two flows the opposite ways: each one's links also carry the other's ACKs, one
    // header's worth per packet; they finish later by about that share, never less.
    let two = [flow(0, 1, bytes, 0.0), flow(1, 0, bytes, 0.0)];
    p.acks = false;
    let off = simulate_flows(&c, &two, &p).unwrap();
    p.acks = true;
    let on = simulate_flows(&c, &two, &p).unwrap();
    let share = f64::from(p.header_bytes) / f64::from(p.mtu + p.header_bytes);
    for f in 0..2 {
        let slower = on.flow_done_s[f] / off.flow_done_s[f] - 1.0;
        assert!(
            slower > 0.5 * share && slower < 1.5 * share,
            "flow {f}: {:+.3} % against an ACK share of {:.3} %",
            100.0 * slower,
            100.0 * share
        );
    }
    assert_eq!(on.drops, 0);
}
