//! `monel fabric plan|sweep`: the fabric planner on cluster designs in TOML.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use monel_fabric::{Report, SweepRow, evaluate, parse_design};

use crate::chart;
use monel_sched::Algorithm;

#[derive(Debug, Args)]
pub(crate) struct FabricArgs {
    #[command(subcommand)]
    cmd: FabricCmd,
}

#[derive(Debug, Subcommand)]
enum FabricCmd {
    /// Predict one design: collective time and bus bandwidth, link utilization, ECMP
    /// collisions, training step and cost.
    Plan {
        /// The design (TOML).
        config: PathBuf,
        /// Override the design's GPU count.
        #[arg(long)]
        gpus: Option<usize>,
        /// Override the collective's algorithm (`ring`, `hier`, `tree`, ...).
        #[arg(long)]
        algorithm: Option<String>,
    },
    /// Compare designs at several GPU counts; write CSV and charts (SVG or PNG).
    Sweep {
        /// Designs (TOML), one line each in the plots.
        #[arg(required = true)]
        configs: Vec<PathBuf>,
        /// GPU counts.
        #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
        gpus: Vec<usize>,
        /// CSV output.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Chart of bus bandwidth against GPUs, SVG or PNG by the extension; with training
        /// steps, a `-step` chart beside it.
        #[arg(long = "chart", alias = "svg", value_name = "FILE")]
        svg: Option<PathBuf>,
        /// Run every design with this algorithm too (`hier`, ...): one more line each, named
        /// with it.
        #[arg(long)]
        algorithm: Option<String>,
    },
}

fn design(path: &Path, gpus: Option<usize>, algo: Option<&str>) -> anyhow::Result<Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("design");
    let mut d = parse_design(&text, stem, gpus).with_context(|| path.display().to_string())?;
    if let Some(name) = algo {
        let have: Vec<&str> = d.spec.coll.algorithms().iter().map(|a| a.name()).collect();
        let a = Algorithm::parse(name)
            .filter(|a| d.spec.coll.algorithms().contains(a))
            .with_context(|| {
                format!(
                    "--algorithm {name}: {} has {}",
                    d.spec.coll.name(),
                    have.join(", ")
                )
            })?;
        d.spec.algo = a;
        d.name = format!("{} ({})", d.name, a.name());
    }
    evaluate(d).with_context(|| path.display().to_string())
}

pub(crate) fn run(a: &FabricArgs) -> anyhow::Result<()> {
    match &a.cmd {
        FabricCmd::Plan {
            config,
            gpus,
            algorithm,
        } => {
            let t = std::time::Instant::now();
            print!("{}", design(config, *gpus, algorithm.as_deref())?);
            println!("  (planned in {:.2} s)", t.elapsed().as_secs_f64());
        }
        FabricCmd::Sweep {
            configs,
            gpus,
            csv,
            svg,
            algorithm,
        } => {
            if gpus.is_empty() || gpus.contains(&0) {
                bail!("--gpus: want GPU counts above 0");
            }
            let mut rows = Vec::new();
            println!("{}", SweepRow::HEADER);
            let algos: Vec<Option<&str>> = std::iter::once(None)
                .chain(algorithm.as_deref().map(Some))
                .collect();
            for c in configs {
                for &a in &algos {
                    for &g in gpus {
                        let r = design(c, Some(g), a)?;
                        let row = SweepRow::from(&r);
                        println!("{}", row.csv());
                        rows.push(row);
                    }
                }
            }
            if let Some(p) = csv {
                let mut s = String::from(SweepRow::HEADER);
                s.push('\n');
                for r in &rows {
                    s += &r.csv();
                    s.push('\n');
                }
                std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))?;
            }
            if let Some(p) = svg {
                let series = |f: &dyn Fn(&SweepRow) -> Option<f64>| {
                    let mut names: Vec<String> = rows.iter().map(|r| r.design.clone()).collect();
                    names.dedup();
                    names
                        .into_iter()
                        .map(|n| {
                            let pts = rows
                                .iter()
                                .filter(|r| r.design == n)
                                .filter_map(|r| f(r).map(|y| (r.gpus as f64, y)))
                                .collect();
                            (n, pts)
                        })
                        .collect::<Vec<_>>()
                };
                chart::draw(
                    p,
                    "Bus bandwidth",
                    "GPUs",
                    "busbw (GB/s)",
                    &series(&|r| Some(r.busbw / 1e9)),
                )?;
                if rows.iter().any(|r| r.step_s.is_some()) {
                    let ext = p.extension().and_then(|s| s.to_str()).unwrap_or("svg");
                    let q = p.with_file_name(format!(
                        "{}-step.{ext}",
                        p.file_stem().and_then(|s| s.to_str()).unwrap_or("sweep")
                    ));
                    chart::draw(
                        &q,
                        "Training step time",
                        "GPUs",
                        "step (ms)",
                        &series(&|r| r.step_s.map(|s| s * 1e3)),
                    )?;
                }
            }
        }
    }
    Ok(())
}
