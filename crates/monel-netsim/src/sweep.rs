//! The loss sweep: the RC engine moving verified random work across the simulated network at a
//! range of loss rates. `monel sim` prints it; the tests assert every run verifies.

use core::fmt::Write as _;
use core::time::Duration;

use crate::link::LinkConfig;
use crate::net::{ConnectConfig, Network};
use crate::workload::{Report, Workload, WorkloadConfig};

/// One row of the sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepRow {
    /// Loss probability on every link.
    pub loss: f64,
    /// What the run measured.
    pub report: Report,
    /// Host CPU time the simulation took.
    pub wall: Duration,
}

/// The links of the sweep: 25 Gb/s, 2 us. `loss` applies to host uplinks only, so it is the
/// loss rate of each direction end to end (a packet crosses one uplink and one downlink).
pub fn sweep_link(loss: f64) -> LinkConfig {
    LinkConfig {
        latency: Duration::from_micros(2),
        bandwidth_bps: 25e9,
        loss,
        ..LinkConfig::default()
    }
}

/// A 4-host star whose uplinks use `link` and whose downlinks use `link` without its faults.
pub fn faulty_uplinks(link: LinkConfig, seed: u64) -> Network {
    Network::star_with(
        4,
        |_, up| {
            if up {
                link
            } else {
                LinkConfig {
                    loss: 0.0,
                    reorder: 0.0,
                    duplicate: 0.0,
                    corrupt: 0.0,
                    ..link
                }
            }
        },
        seed,
    )
}

/// Runs the verified workload (4 flows between 4 hosts) at one loss rate.
pub fn run_one(
    loss: f64,
    link: LinkConfig,
    ops_per_flow: usize,
    seed: u64,
) -> Result<SweepRow, String> {
    let start = std::time::Instant::now();
    let mut net = faulty_uplinks(LinkConfig { loss, ..link }, seed);
    let conn = ConnectConfig::default();
    let cfg = WorkloadConfig {
        ops_per_flow,
        ..WorkloadConfig::default()
    };
    let w = Workload::new(
        &mut net,
        &[(0, 1), (1, 2), (2, 3), (3, 0)],
        &conn,
        cfg,
        seed,
    );
    let report = w.run(&mut net)?;
    Ok(SweepRow {
        loss,
        report,
        wall: start.elapsed(),
    })
}

/// Runs the sweep at each loss rate.
pub fn loss_sweep(losses: &[f64], ops_per_flow: usize, seed: u64) -> Result<Vec<SweepRow>, String> {
    losses
        .iter()
        .map(|&l| run_one(l, sweep_link(l), ops_per_flow, seed))
        .collect()
}

/// Formats the sweep as a table.
pub fn format_table(rows: &[SweepRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>6} {:>9} {:>10} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "loss%",
        "WRs ok",
        "payload MB",
        "goodput",
        "sent pkts",
        "retrans",
        "timeouts",
        "seq NAK",
        "lost",
        "wall ms"
    );
    for r in rows {
        let p = &r.report;
        let _ = writeln!(
            s,
            "{:>6.1} {:>9} {:>10.1} {:>5.2} Gb/s {:>9} {:>8} {:>8} {:>8} {:>8} {:>9.0}",
            r.loss * 100.0,
            p.completed,
            p.payload_bytes as f64 / 1e6,
            p.goodput_gbps(),
            p.stats.tx_packets,
            p.stats.retransmitted_packets,
            p.stats.timeouts,
            p.stats.seq_naks_sent,
            p.lost,
            r.wall.as_secs_f64() * 1e3
        );
    }
    s
}
