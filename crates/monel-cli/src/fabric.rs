//! `monel fabric plan|sweep|flows`: the fabric planner on cluster designs in TOML, and flow
//! lists (Monel's CSV or htsim's connection matrices) on them.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use monel_fabric::{
    FlowEngine, PacketParams, Report, SweepRow, TrafficFlow, evaluate, parse_cm, parse_csv,
    parse_design, parse_pins, run_traffic,
};

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
        /// Override the collective's algorithm (`auto`: NCCL's choice; `ring`, `hier`, `tree`, ...).
        #[arg(long)]
        algorithm: Option<String>,
    },
    /// Run a flow list on a design's fabric: every flow's completion time and their
    /// distribution (Monel's CSV, or htsim's connection matrix when the file ends in `.cm`).
    Flows {
        /// The design (TOML): its fabric, servers and packet-engine settings.
        config: PathBuf,
        /// The flows: `from,to,bytes,start_us,after,spine` CSV, or an htsim `.cm` file.
        traffic: PathBuf,
        /// `packet` (PFC, ECN, DCQCN, packet by packet) or `fluid` (max-min fair shares).
        #[arg(long, default_value = "packet", value_parser = ["packet", "fluid"])]
        engine: String,
        /// htsim's per-flow spine log (`SOURCE DESTINATION SPINE` lines): pins those flows.
        #[arg(long)]
        pins: Option<PathBuf>,
        /// Per-flow CSV output.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// JSON output (summary and every flow).
        #[arg(long)]
        json: Option<PathBuf>,
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
    if let Some("auto") = algo {
        d.choice = d.spec.tune(&d.cluster);
        d.name = format!("{} (auto)", d.name);
    } else if let Some(name) = algo {
        let have: Vec<&str> = d.spec.coll.algorithms().iter().map(|a| a.name()).collect();
        let a = Algorithm::parse(name)
            .filter(|a| d.spec.coll.algorithms().contains(a))
            .with_context(|| {
                format!(
                    "--algorithm {name}: {} has auto, {}",
                    d.spec.coll.name(),
                    have.join(", ")
                )
            })?;
        d.spec.algo = a;
        d.choice = None;
        d.name = format!("{} ({})", d.name, a.name());
    }
    evaluate(d).with_context(|| path.display().to_string())
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// `monel fabric flows`.
fn flows(
    config: &Path,
    traffic: &Path,
    engine: &str,
    pins: Option<&Path>,
    csv: Option<&Path>,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    let d = parse_design(&read(config)?, "design", None)
        .with_context(|| config.display().to_string())?;
    let text = read(traffic)?;
    let mut list: Vec<TrafficFlow> = if traffic.extension().is_some_and(|e| e == "cm") {
        parse_cm(&text)
            .with_context(|| traffic.display().to_string())?
            .0
    } else {
        parse_csv(&text).with_context(|| traffic.display().to_string())?
    };
    if let Some(p) = pins {
        let pins = parse_pins(&read(p)?).with_context(|| p.display().to_string())?;
        for f in &mut list {
            if let Some(&s) = pins.get(&(f.from, f.to)) {
                f.spine = Some(s);
            }
        }
    }
    let engine = if engine == "fluid" {
        FlowEngine::Fluid
    } else {
        FlowEngine::Packet
    };
    let params =
        (d.scenario.packet.clone()).unwrap_or_else(|| PacketParams::for_fabric(&d.cluster.fabric));
    let t = std::time::Instant::now();
    let r = run_traffic(&d.cluster, &list, engine, &params)
        .with_context(|| traffic.display().to_string())?;
    let [mean, p50, p99, max] = r.fct_summary().map(|s| s * 1e6);
    let fct = r.fct_s();
    println!(
        "{} flows on {} ({} engine, {:.2} s): makespan {:.1} us; completion mean {mean:.1} us, \
         p50 {p50:.1}, p99 {p99:.1}, max {max:.1}",
        list.len(),
        d.name,
        engine.name(),
        t.elapsed().as_secs_f64(),
        r.makespan_s() * 1e6
    );
    if engine == FlowEngine::Packet {
        println!(
            "  PFC pauses {}, ECN marks {}, CNPs {}, drops {}",
            r.pauses, r.ecn_marks, r.cnps, r.drops
        );
    }
    println!(
        "  links shared by flows at once: {} (most on one: {})",
        r.shared_links, r.most_on_a_link
    );
    if let Some(risk) = r.fluid_risk() {
        println!("  warning: {risk}");
    }
    if let Some(p) = csv {
        let mut s = String::from("flow,from,to,bytes,spine,start_us,done_us,fct_us\n");
        for (i, f) in list.iter().enumerate() {
            let spine = f.spine.map(|s| s.to_string()).unwrap_or_default();
            s += &format!(
                "{i},{},{},{},{spine},{:.3},{:.3},{:.3}\n",
                f.from,
                f.to,
                f.bytes,
                r.start_s[i] * 1e6,
                r.done_s[i] * 1e6,
                fct[i] * 1e6
            );
        }
        std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = json {
        let flows: Vec<serde_json::Value> = list
            .iter()
            .enumerate()
            .map(|(i, f)| {
                serde_json::json!({"from": f.from, "to": f.to, "bytes": f.bytes,
                    "spine": f.spine, "start_us": r.start_s[i] * 1e6,
                    "done_us": r.done_s[i] * 1e6, "fct_us": fct[i] * 1e6})
            })
            .collect();
        let v = serde_json::json!({
            "design": d.name, "engine": engine.name(), "makespan_us": r.makespan_s() * 1e6,
            "fct_us": {"mean": mean, "p50": p50, "p99": p99, "max": max},
            "pfc_pauses": r.pauses, "ecn_marks": r.ecn_marks, "cnps": r.cnps, "drops": r.drops,
            "shared_links": r.shared_links, "most_on_a_link": r.most_on_a_link,
            "warning": r.fluid_risk(),
            "flows": flows,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

pub(crate) fn run(a: &FabricArgs) -> anyhow::Result<()> {
    match &a.cmd {
        FabricCmd::Flows {
            config,
            traffic,
            engine,
            pins,
            csv,
            json,
        } => flows(
            config,
            traffic,
            engine,
            pins.as_deref(),
            csv.as_deref(),
            json.as_deref(),
        )?,
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
