//! The RC engine over the deterministic lossy network. Every failure message names its seed;
//! rerun one case with `MONEL_SEED=<seed> cargo test -p monel-netsim --release`.

use core::time::Duration;

use monel_netsim::sweep::{faulty_uplinks, format_table, run_one, sweep_link};
use monel_netsim::workload::{Workload, WorkloadConfig};
use monel_netsim::{ConnectConfig, EcnConfig, LinkConfig, Network};
use monel_rc::memory::AccessFlags;
use monel_rc::{
    CongestionConfig, DcqcnParams, Instant, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcStatus,
};
use monel_wire::pcap::PcapReader;
use monel_wire::{IpFrame, LKey, RKey};

fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("MONEL_SEED") {
        Ok(s) => vec![s.parse().expect("MONEL_SEED is a number")],
        Err(_) => default.to_vec(),
    }
}

#[test]
fn random_work_completes_exactly_once_in_order_under_loss_reorder_and_duplication() {
    let mut rows = Vec::new();
    let mut total = 0;
    for seed in seeds(&[1, 2]) {
        for loss in [0.0, 0.02, 0.05, 0.10, 0.20] {
            let link = LinkConfig {
                reorder: 0.05,
                duplicate: 0.02,
                ..sweep_link(loss)
            };
            let row = run_one(loss, link, 300, seed).unwrap_or_else(|e| panic!("loss {loss}: {e}"));
            assert_eq!(row.report.completed, 1200, "seed {seed} loss {loss}");
            if loss > 0.0 {
                assert!(
                    row.report.lost > 0,
                    "seed {seed}: the loss model lost nothing"
                );
                assert!(row.report.stats.retransmitted_packets > 0, "seed {seed}");
            }
            total += row.report.completed;
            rows.push(row);
        }
    }
    println!("{}", format_table(&rows));
    assert!(total >= 2400);
}

#[test]
fn corrupted_packets_are_dropped_by_icrc_and_recovered() {
    for seed in seeds(&[3]) {
        let link = LinkConfig {
            corrupt: 0.03,
            ..sweep_link(0.0)
        };
        let row = run_one(0.0, link, 300, seed).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            row.report.icrc_drops > 10,
            "seed {seed}: {} ICRC drops",
            row.report.icrc_drops
        );
        assert_eq!(row.report.completed, 1200);
    }
}

#[test]
fn a_capture_of_a_lossy_run_verifies_in_every_packet() {
    let path = std::env::temp_dir().join(format!("monel-netsim-{}.pcap", std::process::id()));
    let mut net = faulty_uplinks(
        LinkConfig {
            reorder: 0.1,
            ..sweep_link(0.05)
        },
        9,
    );
    net.capture(Box::new(std::fs::File::create(&path).unwrap()))
        .unwrap();
    let cfg = WorkloadConfig {
        ops_per_flow: 50,
        ..Default::default()
    };
    let w = Workload::new(
        &mut net,
        &[(0, 1), (2, 3)],
        &ConnectConfig::default(),
        cfg,
        9,
    );
    w.run(&mut net).unwrap();
    drop(net);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let reader = PcapReader::new(&bytes).unwrap();
    let mut n = 0;
    for rec in reader {
        let rec = rec.unwrap();
        let f = IpFrame::parse(rec.data).unwrap();
        f.check_icrc().unwrap();
        assert_eq!(f.udp().dst_port(), 4791);
        n += 1;
    }
    assert!(n > 500, "{n} packets captured");
}

/// Two hosts, one QP, and raw access to post specific work.
fn pair_net(link: LinkConfig, conn: ConnectConfig) -> (Network, u64, u64, RKey) {
    let mut net = Network::star(2, link, 5);
    net.connect(0, 1, &conn);
    let a = net
        .host_mut(0)
        .mem
        .register(65536, LKey(1), RKey(0x100), AccessFlags::LOCAL_WRITE);
    let b = net.host_mut(1).mem.register(
        65536,
        LKey(2),
        RKey(0x200),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    (net, a, b, RKey(0x200))
}

fn post(net: &mut Network, op: SendOp, addr: u64, len: u32, wr_id: u64) {
    let wr = SendWr {
        wr_id,
        op,
        sg_list: vec![Sge {
            addr,
            length: len,
            lkey: LKey(1),
        }],
        flags: SendFlags {
            signaled: true,
            ..Default::default()
        },
    };
    net.host_mut(0).qps[0].post_send(wr).unwrap();
    net.kick(0);
}

fn statuses(net: &Network) -> Vec<(u64, WcStatus)> {
    net.host(0)
        .completions
        .iter()
        .map(|(_, w)| (w.wr_id, w.status))
        .collect()
}

#[test]
fn a_dead_link_exhausts_retries_and_flushes_the_rest() {
    let conn = ConnectConfig {
        retry_cnt: 3,
        timeout: 4,
        ..Default::default()
    };
    let (mut net, a, b, rkey) = pair_net(
        LinkConfig {
            loss: 1.0,
            ..LinkConfig::default()
        },
        conn,
    );
    for i in 0..3 {
        post(
            &mut net,
            SendOp::Write(RemoteAddr { addr: b, rkey }),
            a,
            9000,
            i,
        );
    }
    net.run_until(Instant::from_nanos(1_000_000_000), |n| {
        n.host(0).completions.len() == 3
    });
    assert_eq!(
        statuses(&net),
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(net.host(0).qps[0].stats().timeouts, 4);
}

#[test]
fn missing_receives_exhaust_rnr_retries() {
    let conn = ConnectConfig {
        rnr_retry: 2,
        ..Default::default()
    };
    let (mut net, a, _, _) = pair_net(LinkConfig::default(), conn);
    post(&mut net, SendOp::Send, a, 100, 0);
    post(&mut net, SendOp::Send, a, 100, 1);
    net.run_until(Instant::from_nanos(1_000_000_000), |n| {
        n.host(0).completions.len() == 2
    });
    assert_eq!(
        statuses(&net),
        vec![(0, WcStatus::RnrRetryExcErr), (1, WcStatus::WrFlushErr)]
    );
    assert_eq!(net.host(1).qps[0].stats().rnr_naks_sent, 3);
}

#[test]
fn bad_keys_bounds_and_rights_give_remote_access_errors_and_touch_nothing() {
    for case in 0..3 {
        let (mut net, a, b, rkey) = pair_net(LinkConfig::default(), ConnectConfig::default());
        let ro = net
            .host_mut(1)
            .mem
            .register(4096, LKey(3), RKey(0x300), AccessFlags::REMOTE_READ);
        net.host_mut(0).mem.bytes_mut(a, 4096).fill(0xee);
        let remote = match case {
            0 => RemoteAddr {
                addr: b,
                rkey: RKey(0x201),
            },
            1 => RemoteAddr {
                addr: b + 65536 - 100,
                rkey,
            },
            _ => RemoteAddr {
                addr: ro,
                rkey: RKey(0x300),
            },
        };
        post(&mut net, SendOp::Write(remote), a, 4096, 0);
        post(
            &mut net,
            SendOp::Write(RemoteAddr { addr: b, rkey }),
            a,
            16,
            1,
        );
        net.run_until(Instant::from_nanos(1_000_000_000), |n| {
            n.host(0).completions.len() == 2
        });
        assert_eq!(
            statuses(&net),
            vec![(0, WcStatus::RemAccessErr), (1, WcStatus::WrFlushErr)],
            "case {case}"
        );
        assert!(
            net.host(1).mem.bytes(b, 65536).iter().all(|&x| x == 0),
            "case {case}: target touched"
        );
        assert!(
            net.host(1).mem.bytes(ro, 4096).iter().all(|&x| x == 0),
            "case {case}: read-only touched"
        );
    }
}

/// Long-running WRITE streams from `senders` hosts to the last host.
fn incast(cc: CongestionConfig, senders: usize, ms: u64, seed: u64) -> (Vec<f64>, u64, usize, u64) {
    let rate = 25e9;
    let link = LinkConfig {
        latency: Duration::from_micros(1),
        bandwidth_bps: rate,
        queue_limit: 2_000_000,
        ecn: Some(EcnConfig::for_rate(rate)),
        ..LinkConfig::default()
    };
    let dst = senders;
    let mut net = Network::star(senders + 1, link, seed);
    let conn = ConnectConfig {
        cc,
        ..Default::default()
    };
    let msg = 65536u32;
    let mut bufs = Vec::new();
    for s in 0..senders {
        net.connect(s, dst, &conn);
        let a =
            net.host_mut(s)
                .mem
                .register(msg as usize, LKey(1), RKey(1), AccessFlags::LOCAL_WRITE);
        let b = net.host_mut(dst).mem.register(
            msg as usize,
            LKey(10 + s as u32),
            RKey(10 + s as u32),
            AccessFlags::REMOTE_WRITE,
        );
        bufs.push((a, b));
    }
    let post_write = |net: &mut Network, s: usize, id: u64| {
        let (a, b) = bufs[s];
        let wr = SendWr {
            wr_id: id,
            op: SendOp::Write(RemoteAddr {
                addr: b,
                rkey: RKey(10 + s as u32),
            }),
            sg_list: vec![Sge {
                addr: a,
                length: msg,
                lkey: LKey(1),
            }],
            flags: SendFlags {
                signaled: true,
                ..Default::default()
            },
        };
        net.host_mut(s).qps[0].post_send(wr).unwrap();
        net.kick(s);
    };
    for s in 0..senders {
        for i in 0..8 {
            post_write(&mut net, s, i);
        }
    }
    let warmup = Instant::from_nanos(ms * 500_000);
    let end = Instant::from_nanos(ms * 1_000_000);
    let mut done = vec![0u64; senders];
    let mut max_queue_after_warmup = 0;
    let mut t = Instant::ZERO;
    while t < end {
        t = Instant::from_nanos(t.as_nanos() + 10_000);
        net.run_until(t, |_| false);
        if t > warmup {
            max_queue_after_warmup = max_queue_after_warmup.max(net.downlink_queue(dst));
        }
        for (s, bytes) in done.iter_mut().enumerate() {
            let wcs: Vec<_> = net.host_mut(s).completions.drain(..).collect();
            for (_, wc) in wcs {
                assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
                if net.now() > warmup {
                    *bytes += u64::from(msg);
                }
                post_write(&mut net, s, wc.wr_id + 8);
            }
        }
    }
    let secs = (end.as_nanos() - warmup.as_nanos()) as f64 / 1e9;
    let gbps: Vec<f64> = done.iter().map(|b| *b as f64 * 8.0 / secs / 1e9).collect();
    let drops = net.link_stats(dst, false).overflow_drops;
    (
        gbps,
        drops,
        max_queue_after_warmup,
        net.link_stats(dst, false).ecn_marked,
    )
}

fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * q)
}

#[test]
fn dcqcn_flows_share_a_bottleneck_fairly_without_overflow() {
    for seed in seeds(&[11]) {
        let cc = CongestionConfig::Dcqcn(DcqcnParams::for_line_rate(25e9));
        let (gbps, drops, maxq, marks) = incast(cc, 4, 20, seed);
        let total: f64 = gbps.iter().sum();
        let j = jain(&gbps);
        println!(
            "DCQCN 4->1 at 25 Gb/s, seed {seed}: per-flow {:.2?} Gb/s, total {total:.2}, Jain {j:.3}, max queue {} KB, ECN marks {marks}, overflow drops {drops}",
            gbps,
            maxq / 1000
        );
        assert_eq!(drops, 0, "seed {seed}: the bottleneck queue overflowed");
        assert!(marks > 0, "seed {seed}: no congestion was signalled");
        assert!(j > 0.9, "seed {seed}: Jain fairness {j:.3}");
        assert!(
            total > 0.8 * 25.0,
            "seed {seed}: bottleneck underused: {total:.2} Gb/s"
        );

        // The same incast without congestion control overflows the switch queue.
        let (g, drops_none, maxq_none, _) = incast(CongestionConfig::None, 4, 20, seed);
        println!(
            "no CC, seed {seed}: per-flow {:.2?} Gb/s, max queue {} KB, overflow drops {drops_none}",
            g,
            maxq_none / 1000
        );
        assert!(
            drops_none > 0 || maxq_none > maxq,
            "seed {seed}: DCQCN made no difference"
        );
    }
}
