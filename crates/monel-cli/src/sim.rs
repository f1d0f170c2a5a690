//! `monel sim`: the loss sweep.

use anyhow::{Context, bail};
use clap::Args;
use monel_netsim::sweep::{SweepRow, format_table, run_one, sweep_link};

#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// Loss rates in percent, per direction.
    #[arg(long, value_delimiter = ',', default_value = "0,0.1,1,2,5,10,20")]
    loss: Vec<f64>,
    /// Work requests per flow (4 flows, every operation kind, verified).
    #[arg(long, default_value_t = 1000)]
    ops: usize,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub(crate) fn run(a: &SimArgs) -> anyhow::Result<()> {
    println!(
        "Monel RC engine over the simulated network: 4 hosts on one switch, 25 Gb/s links, 2 us \
         each way, path MTU 4096, timeout 4.096 us x 2^8.\n4 flows x {} random verified work \
         requests (SEND, SEND+imm, WRITE, WRITE+imm, READ, CAS, FETCH_ADD; 0-16 KiB), seed {}.\n",
        a.ops, a.seed
    );
    let mut rows: Vec<SweepRow> = Vec::new();
    for &pct in &a.loss {
        if !(0.0..100.0).contains(&pct) {
            bail!("--loss {pct}: loss rates are percentages in [0, 100)");
        }
        let l = pct / 100.0;
        let row = run_one(l, sweep_link(l), a.ops, a.seed)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("loss {pct}%"))?;
        rows.push(row);
    }
    print!("{}", format_table(&rows));
    println!(
        "\nEvery work request completed exactly once, in order, with the right data (checked \
         against an independent model)."
    );
    Ok(())
}
