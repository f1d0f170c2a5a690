//! What the planner says about a design: the report printed for one design, and the rows
//! of a sweep over sizes.

use std::fmt;

use crate::design::{Design, Transport};
use crate::error::ConfigError;
use crate::scenario::{
    CollectiveSpec, Cost, Engine, Outcome, StepReport, cost, run_scenario, training_step,
};
use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective};

/// What the planner says about a design.
#[derive(Debug, Clone)]
pub struct Report {
    /// The design.
    pub design: Design,
    /// The collective.
    pub outcome: Outcome,
    /// The training step, if asked.
    pub step: Option<StepReport>,
    /// The price, if prices were given.
    pub cost: Option<Cost>,
}

/// Runs a design.
pub fn evaluate(design: Design) -> Result<Report, ConfigError> {
    let d = &design;
    let outcome = run_scenario(&d.cluster, &d.spec, d.engine, d.overhead_s, &d.scenario)?;
    let step = match &d.training {
        Some(t) => Some(training_step(
            &d.cluster,
            t,
            &CollectiveSpec {
                coll: Collective::AllReduce(RedOp::Sum),
                ..d.spec.clone()
            },
            d.choice.is_some(),
            d.engine,
            d.overhead_s,
            &d.scenario,
        )?),
        None => None,
    };
    let cost = d.prices.as_ref().map(|p| cost(&d.cluster, p, d.gpus));
    Ok(Report {
        design,
        outcome,
        step,
        cost,
    })
}

/// Whether the design's fabric is lossless (PFC or credits), so that collisions are
/// settled by pauses.
fn lossless(d: &Design) -> bool {
    use crate::engine::packet::FlowControl;
    let fc = (d.scenario.packet.as_ref()).map_or(FlowControl::Pfc, |p| p.flow_control);
    fc != FlowControl::Lossy
}

fn si(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.design;
        let c = &d.cluster;
        let o = &self.outcome;
        writeln!(f, "design: {}", d.name)?;
        writeln!(
            f,
            "  fabric: {} ({}), {} switches; {} servers x {} GPUs, {} NICs each (1:{})",
            c.fabric.name,
            match d.transport {
                Transport::Roce => "RoCEv2, ECMP",
                Transport::Infiniband => "InfiniBand, D-mod-k routing",
            },
            c.fabric.switches(),
            d.gpus.div_ceil(c.server.gpus),
            c.server.gpus,
            c.server.nics,
            c.server.gpus / c.server.nics
        )?;
        let chans = if matches!(d.spec.algo, Algorithm::Ring | Algorithm::Tree) {
            format!(", {} channels", d.spec.channels)
        } else {
            String::new()
        };
        writeln!(
            f,
            "  {} {} {} B x {} GPUs{chans}: {:.3} ms, algbw {:.1} GB/s, busbw {:.1} GB/s ({} engine)",
            d.spec.coll.name(),
            d.spec.algo.name(),
            d.spec.bytes,
            o.ranks,
            o.time_s * 1e3,
            o.algbw / 1e9,
            o.busbw / 1e9,
            match o.engine {
                Engine::Event => "event",
                Engine::Packet => "packet",
                _ => "lockstep",
            }
        )?;
        match &d.choice {
            Some(ch) => writeln!(f, "  algorithm: {ch}")?,
            None if d.spec.coll.algorithms().len() == 1 => writeln!(
                f,
                "  algorithm: {} (the only one {} has)",
                d.spec.algo.name(),
                d.spec.coll.name()
            )?,
            None => writeln!(
                f,
                "  algorithm: {} (forced by the design)",
                d.spec.algo.name()
            )?,
        }
        let utilization = |u: Option<f64>| {
            u.map(|u| format!("{:.1}%", 100.0 * u))
                .unwrap_or_else(|| "n/a (one switch)".into())
        };
        if let Some(s) = &o.stats {
            let util = utilization(s.fabric_utilization);
            writeln!(
                f,
                "  links: switch-to-switch utilization {util}; ECMP: at most {} flows on one \
                 link, {:.1}% of crossing flows collided; slowest message {:.2}x its NIC time",
                s.max_flows_per_fabric_link,
                100.0 * s.collided_fraction,
                s.worst_slowdown
            )?;
            if s.max_flows_per_fabric_link > 1 && lossless(d) {
                writeln!(
                    f,
                    "  warning: flows collide on switch-to-switch links (up to {} on one): {}",
                    s.max_flows_per_fabric_link,
                    crate::flows::shared_link_risk(
                        "[sim] engine = \"packet\" (up to about a thousand endpoints)"
                    )
                )?;
            }
        }
        for b in &d.scenario.background {
            writeln!(
                f,
                "  competing job: {} {} {} B on {} GPUs ({:?} placement)",
                b.spec.coll.name(),
                b.spec.algo.name(),
                b.spec.bytes,
                b.spec.ranks,
                d.scenario.placement
            )?;
        }
        match &o.packet {
            Some(p) => {
                let fab = &c.fabric;
                let switch_links = (0..fab.links())
                    .filter(|&l| fab.kind[l] != crate::topology::LinkKind::Host)
                    .count();
                let longest = p.paused_s.iter().copied().fold(0.0, f64::max);
                let util = utilization(p.fabric_utilization);
                writeln!(
                    f,
                    "  links: switch-to-switch utilization {util}; ECMP: at most {} QPs on one \
                     link",
                    p.max_qps_per_fabric_link
                )?;
                writeln!(
                    f,
                    "  PFC: {} pause frames, {} of {switch_links} links paused (longest {:.3} ms \
                     in all); ECN: {} marks, {} CNPs; {} drops; deepest queue {:.0} KB, fullest \
                     switch buffer {:.0} KB ({} events, {} packets)",
                    p.pauses,
                    p.paused_links(),
                    longest * 1e3,
                    p.ecn_marks,
                    p.cnps,
                    p.drops,
                    p.max_queue_bytes as f64 / 1e3,
                    p.max_buffer_bytes as f64 / 1e3,
                    p.events,
                    p.packets
                )?;
            }
            None => writeln!(
                f,
                "  PFC pauses: not modelled by the flow-level engines (lossless fair sharing); \
                 [sim] engine = \"packet\" simulates them"
            )?,
        }
        if let Some(s) = &self.step {
            let algos: Vec<String> = s
                .algorithms
                .iter()
                .map(|(b, a)| format!("{} B by {}", b, a.name()))
                .collect();
            writeln!(
                f,
                "  training step: {:.2} ms (compute {:.2} ms, exposed communication {:.2} ms; \
                 {} buckets, all-reduce {:.2} ms in all; {})",
                s.step_s * 1e3,
                s.compute_s * 1e3,
                s.exposed_s * 1e3,
                s.buckets,
                s.allreduce_s * 1e3,
                algos.join(", ")
            )?;
        }
        if let Some(k) = &self.cost {
            writeln!(
                f,
                "  cost: {} switches ({} ports used), {} NICs, {} cables, {} optics: {} total, {} per \
                 GPU, {:.1} per GB/s of busbw per GPU",
                k.switches,
                k.switch_ports,
                k.nics,
                k.cables,
                k.optics,
                si(k.total),
                si(k.per_gpu),
                k.per_gpu / (o.busbw / 1e9)
            )?;
        }
        Ok(())
    }
}

/// One row of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    /// Design name.
    pub design: String,
    /// GPUs.
    pub gpus: usize,
    /// Collective time, seconds.
    pub time_s: f64,
    /// Bus bandwidth, bytes per second.
    pub busbw: f64,
    /// Training step, seconds.
    pub step_s: Option<f64>,
    /// Exposed communication, seconds.
    pub exposed_s: Option<f64>,
    /// Network price per GPU.
    pub cost_per_gpu: Option<f64>,
    /// Switch-to-switch link utilization.
    pub utilization: Option<f64>,
    /// Most flows on one switch-to-switch link.
    pub max_flows_per_link: Option<usize>,
    /// PFC pause frames (packet engine).
    pub pfc_pauses: Option<u64>,
    /// The collective's algorithm (NCCL's choice, or the one forced).
    pub algorithm: &'static str,
}

impl SweepRow {
    /// CSV header.
    pub const HEADER: &'static str = "design,gpus,time_ms,busbw_GBps,step_ms,exposed_ms,cost_per_gpu,fabric_utilization,max_flows_per_link,pfc_pauses,algorithm";
    /// This row in CSV.
    pub fn csv(&self) -> String {
        let o = |x: Option<f64>, k: f64| x.map(|v| format!("{:.4}", v * k)).unwrap_or_default();
        format!(
            "{},{},{:.4},{:.3},{},{},{},{},{},{},{}",
            self.design.replace(',', ";"),
            self.gpus,
            self.time_s * 1e3,
            self.busbw / 1e9,
            o(self.step_s, 1e3),
            o(self.exposed_s, 1e3),
            o(self.cost_per_gpu, 1.0),
            o(self.utilization, 1.0),
            self.max_flows_per_link
                .map(|m| m.to_string())
                .unwrap_or_default(),
            self.pfc_pauses.map(|m| m.to_string()).unwrap_or_default(),
            self.algorithm
        )
    }
}

impl From<&Report> for SweepRow {
    fn from(r: &Report) -> Self {
        Self {
            design: r.design.name.clone(),
            gpus: r.design.gpus,
            time_s: r.outcome.time_s,
            busbw: r.outcome.busbw,
            step_s: r.step.as_ref().map(|s| s.step_s),
            exposed_s: r.step.as_ref().map(|s| s.exposed_s),
            cost_per_gpu: r.cost.as_ref().map(|c| c.per_gpu),
            utilization: r
                .outcome
                .stats
                .as_ref()
                .and_then(|s| s.fabric_utilization)
                .or_else(|| r.outcome.packet.as_ref().and_then(|p| p.fabric_utilization)),
            max_flows_per_link: r
                .outcome
                .stats
                .as_ref()
                .map(|s| s.max_flows_per_fabric_link),
            pfc_pauses: r.outcome.packet.as_ref().map(|p| p.pauses),
            algorithm: r.design.spec.algo.name(),
        }
    }
}
