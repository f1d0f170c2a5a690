//! The planner against a measured run: reads Monel's measured ring AllReduce times across
//! two network namespaces (lines `RANKS BYTES MEDIAN_US` on stdin, from
//! `scripts/fabric-vs-netns.sh`), fits the two numbers the model needs to the two-rank run
//! alone (per-message cost alpha and the path's bandwidth, least squares on relative error),
//! then predicts every size and rank count with the event engine on the same shape (one
//! switch per namespace, one link between them) and prints the error: the two-rank rows
//! are the fit's residuals, the four-rank rows predictions.
//!
//! `--cores N`: a second prediction where software NICs share the CPU: with more ranks than
//! cores, every link runs at `cores / ranks` of the calibrated rate (the fabric model knows
//! nothing of CPUs; this shows how much of the error they explain).

use std::collections::BTreeMap;
use std::io::Read;

use monel_fabric::*;
use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective};

fn predict(n: usize, bytes: u64, bps: f64, alpha: f64) -> f64 {
    // Half the ranks in each namespace: a leaf per namespace, the veth between them; ranks
    // 0..n/2 on the first leaf, the rest on the second, as the script runs them.
    let fabric = LeafSpine {
        leaves: 2,
        hosts_per_leaf: n.div_ceil(2),
        spines: 1,
        host_link_bps: bps,
        spine_link_bps: bps,
        link_latency_s: 0.0,
    }
    .build()
    .expect("a fabric");
    let spec = CollectiveSpec {
        coll: Collective::AllReduce(RedOp::Sum),
        algo: Algorithm::Ring,
        bytes: bytes.max(4 * n as u64),
        elem_bytes: 4,
        channels: 1,
        ranks: n,
    };
    run_collective(&Cluster::plain(fabric), &spec, Engine::Event, alpha)
        .expect("a prediction")
        .time_s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cores: Option<usize> = args
        .iter()
        .position(|a| a == "--cores")
        .map(|i| args[i + 1].parse().expect("--cores N"));
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .expect("measurements on stdin");
    let mut measured: BTreeMap<(usize, u64), f64> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() == 3, "want `RANKS BYTES MEDIAN_US`, got {line:?}");
        let (n, b, us) = (
            f[0].parse().expect("ranks"),
            f[1].parse().expect("bytes"),
            f[2].parse::<f64>().expect("microseconds"),
        );
        measured.insert((n, b), us * 1e-6);
    }
    let two: Vec<(u64, f64)> = measured
        .iter()
        .filter(|((n, _), _)| *n == 2)
        .map(|(&(_, b), &t)| (b, t))
        .collect();
    assert!(two.len() >= 2, "need two-rank times at two sizes at least");
    // Two-rank ring: 2 steps, each alpha plus half the buffer over the path, so
    // t = 2 alpha + S / B. Least squares on relative error, linear in (alpha, 1/B).
    let (mut a11, mut a12, mut a22, mut b1, mut b2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(bytes, t) in &two {
        let (x1, x2) = (2.0 / t, bytes as f64 * 8.0 / t);
        a11 += x1 * x1;
        a12 += x1 * x2;
        a22 += x2 * x2;
        b1 += x1;
        b2 += x2;
    }
    let det = a11 * a22 - a12 * a12;
    let alpha = (b1 * a22 - b2 * a12) / det;
    let inv_bps = (a11 * b2 - a12 * b1) / det;
    assert!(
        alpha > 0.0 && inv_bps > 0.0,
        "the two-rank times do not fit t = 2 alpha + S/B"
    );
    let bps = 1.0 / inv_bps;
    println!(
        "fit to the {} two-rank sizes: alpha {:.2} us per message, path {:.3} GB/s",
        two.len(),
        alpha * 1e6,
        bps / 8e9
    );
    let shared = cores.map_or(String::new(), |c| {
        format!(" predicted, NICs sharing {c} cores us | error |")
    });
    println!("| ranks | size | measured us | predicted us | error |{shared}");
    println!(
        "|---:|---:|---:|---:|---:|{}",
        if cores.is_some() { "---:|---:|" } else { "" }
    );
    let mut errors = Vec::new();
    for (&(n, bytes), &t) in &measured {
        let p = predict(n, bytes, bps, alpha);
        let err = (p - t) / t;
        errors.push((n, err));
        let extra = cores.map_or(String::new(), |c| {
            let q = predict(n, bytes, bps * (c as f64 / n as f64).min(1.0), alpha);
            format!(" {:.1} | {:+.0}% |", q * 1e6, (q - t) / t * 100.0)
        });
        println!(
            "| {n} | {bytes} B | {:.1} | {:.1} | {:+.0}% |{extra}",
            t * 1e6,
            p * 1e6,
            err * 100.0
        );
    }
    for n in [2usize, 4] {
        let mut e: Vec<f64> = errors
            .iter()
            .filter(|(k, _)| *k == n)
            .map(|(_, e)| e.abs())
            .collect();
        if e.is_empty() {
            continue;
        }
        e.sort_by(f64::total_cmp);
        println!(
            "{n} ranks: median |error| {:.0}%, worst {:.0}%",
            100.0 * e[e.len() / 2],
            100.0 * e[e.len() - 1]
        );
    }
}
