//! `monel switch PORT...`: the impairing software switch between veth ends (see
//! `monel_switch`). Runs until SIGINT or SIGTERM, then prints its counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use monel_switch::{EcnConfig, LinkConfig};
use nix::sys::signal::{SigSet, Signal};

/// Arguments of `monel switch`.
#[derive(Debug, Args)]
pub(crate) struct SwitchArgs {
    /// Interfaces to switch between (one veth end per namespace), at least two.
    #[arg(required = true, num_args = 2..)]
    ports: Vec<String>,
    /// Egress rate of every port in Gb/s (0: unlimited).
    #[arg(long, default_value_t = 0.0)]
    rate_gbps: f64,
    /// Egress queue limit per port in KiB (drop-tail beyond).
    #[arg(long, default_value_t = 4096)]
    queue_kib: usize,
    /// One-way delay added by every port, in microseconds.
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Probability that a UDP frame is lost.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability that a UDP frame is held back so later ones pass it.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Largest hold-back of a reordered frame, in microseconds.
    #[arg(long, default_value_t = 200)]
    reorder_us: u64,
    /// Probability that a UDP frame is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Probability that one bit of a UDP frame is flipped.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// ECN marking starts at this queue depth in KiB (RED; with --ecn-kmax).
    #[arg(long)]
    ecn_kmin_kib: Option<usize>,
    /// ECN marking probability reaches --ecn-pmax at this depth in KiB; all marked beyond.
    #[arg(long)]
    ecn_kmax_kib: Option<usize>,
    /// ECN marking probability at --ecn-kmax-kib.
    #[arg(long, default_value_t = 0.2)]
    ecn_pmax: f64,
    /// Seed of the fault generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn probability(name: &str, p: f64) -> anyhow::Result<f64> {
    if !(0.0..=1.0).contains(&p) {
        bail!("--{name} {p}: a probability is between 0 and 1");
    }
    Ok(p)
}

pub(crate) fn link_config(a: &SwitchArgs) -> anyhow::Result<LinkConfig> {
    if a.rate_gbps < 0.0 || !a.rate_gbps.is_finite() {
        bail!(
            "--rate-gbps {}: must be 0 (unlimited) or positive",
            a.rate_gbps
        );
    }
    let ecn = match (a.ecn_kmin_kib, a.ecn_kmax_kib) {
        (None, None) => None,
        (Some(lo), Some(hi)) if lo <= hi => Some(EcnConfig {
            kmin: lo << 10,
            kmax: hi << 10,
            pmax: probability("ecn-pmax", a.ecn_pmax)?,
        }),
        _ => bail!("ECN marking needs --ecn-kmin-kib <= --ecn-kmax-kib, both given"),
    };
    Ok(LinkConfig {
        latency: Duration::from_micros(a.delay_us),
        bandwidth_bps: if a.rate_gbps == 0.0 {
            f64::INFINITY
        } else {
            a.rate_gbps * 1e9
        },
        queue_limit: a.queue_kib << 10,
        ecn,
        loss: probability("loss", a.loss)?,
        reorder: probability("reorder", a.reorder)?,
        reorder_delay: Duration::from_micros(a.reorder_us),
        duplicate: probability("duplicate", a.duplicate)?,
        corrupt: probability("corrupt", a.corrupt)?,
    })
}

pub(crate) fn run(a: &SwitchArgs) -> anyhow::Result<()> {
    let link = link_config(a)?;
    // Signals become a flag: blocked here (threads inherit the mask), awaited by one thread.
    let mut sigs = SigSet::empty();
    sigs.add(Signal::SIGINT);
    sigs.add(Signal::SIGTERM);
    sigs.thread_block().context("blocking SIGINT/SIGTERM")?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let _ = sigs.wait();
        flag.store(true, Ordering::Relaxed);
    });
    eprintln!(
        "monel switch: {} ports ({}), {link:?}",
        a.ports.len(),
        a.ports.join(", ")
    );
    let sw = monel_switch::run(&a.ports, link, a.seed, &stop)?;
    print!("{}", monel_switch::report(&sw, &a.ports));
    Ok(())
}
