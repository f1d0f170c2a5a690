//! Runs a traffic list ([`crate::traffic`]) on a cluster with the packet engine (PFC, ECN,
//! DCQCN, packet by packet) or the fluid model (max-min fair shares re-solved at every start
//! and finish): every flow's start, arrival and completion time, and their distribution.

use crate::cluster::Cluster;
use crate::engine::flow::drain_timed;
use crate::engine::packet::{Flow, PacketParams, simulate_dependent_flows};
use crate::error::{PlanError, invalid};
use crate::traffic::{TrafficFlow, check_order, sport_for_spine};

/// Which model runs the flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowEngine {
    /// Packet by packet, with the design's flow control and congestion control.
    Packet,
    /// Max-min fair fluid shares, plus each path's latency.
    Fluid,
}

impl FlowEngine {
    /// Its name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Packet => "packet",
            Self::Fluid => "fluid",
        }
    }
}

/// What a traffic run found.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficReport {
    /// The engine.
    pub engine: FlowEngine,
    /// Each flow's start (its own start time, or the last arrival it waited for), seconds.
    pub start_s: Vec<f64>,
    /// Each flow's arrival (its last byte delivered), seconds.
    pub done_s: Vec<f64>,
    /// Each flow's UDP source port (chosen to cross its pinned spine, else from its index).
    pub sport: Vec<u16>,
    /// PFC pauses, ECN marks, CNPs and drops (packet engine; zero for the fluid model).
    pub pauses: u64,
    /// ECN marks.
    pub ecn_marks: u64,
    /// CNPs.
    pub cnps: u64,
    /// Drops.
    pub drops: u64,
    /// Most flows crossing one network link (edge or switch-to-switch) at the same time.
    pub most_on_a_link: usize,
    /// Network links that carried two flows or more at the same time.
    pub shared_links: usize,
}

impl TrafficReport {
    /// Each flow's completion time (arrival minus start), seconds.
    pub fn fct_s(&self) -> Vec<f64> {
        self.done_s
            .iter()
            .zip(&self.start_s)
            .map(|(d, s)| d - s)
            .collect()
    }

    /// When the last flow arrived, seconds.
    pub fn makespan_s(&self) -> f64 {
        self.done_s.iter().copied().fold(0.0, f64::max)
    }

    /// Mean, median, 99th percentile and largest completion time, seconds.
    pub fn fct_summary(&self) -> [f64; 4] {
        let mut v = self.fct_s();
        if v.is_empty() {
            return [0.0; 4];
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        [
            v.iter().sum::<f64>() / v.len() as f64,
            at(0.5),
            at(0.99),
            v[v.len() - 1],
        ]
    }

    /// Where the fluid model's fair shares are a guess: flows that shared a link at the same
    /// time, whose order under PFC (or credits) is decided by pauses, not by fair shares.
    /// `None` when no link was shared or the packet engine ran.
    pub fn fluid_risk(&self) -> Option<String> {
        (self.engine == FlowEngine::Fluid && self.most_on_a_link > 1).then(|| {
            format!(
                "{} links carried several flows at once (up to {} on one): {}",
                self.shared_links,
                self.most_on_a_link,
                shared_link_risk("--engine packet")
            )
        })
    }
}

/// Why fair shares are a guess on a link several flows share under PFC, with the fluid
/// model's measured error, and `how` to run the packet engine instead.
pub(crate) fn shared_link_risk(how: &str) -> String {
    format!(
        "on a lossless fabric, back-pressure (PFC pauses, InfiniBand credits) rather than fair \
         shares decides which flow waits there, and the fluid model was 2-27 % off a packet \
         simulator's makespan and up to 26 % off its mean in such cases (docs/fabric.md); \
         {how} models it"
    )
}

/// (most flows on one network link at once, links with two or more at once).
fn sharing(cluster: &Cluster, paths: &[Vec<usize>], start: &[f64], done: &[f64]) -> (usize, usize) {
    let mut on: std::collections::HashMap<usize, Vec<(f64, i32)>> = Default::default();
    for (f, p) in paths.iter().enumerate() {
        for &l in p {
            if cluster.fabric.kind[l] != crate::topology::LinkKind::Host {
                let e = on.entry(l).or_default();
                e.push((start[f], 1));
                e.push((done[f], -1));
            }
        }
    }
    let (mut most, mut shared) = (0, 0);
    for mut ev in on.into_values() {
        // Ends before starts at the same instant: a flow that starts as another ends does
        // not share with it.
        ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut now, mut peak) = (0i32, 0i32);
        for (_, d) in ev {
            now += d;
            peak = peak.max(now);
        }
        most = most.max(peak as usize);
        shared += usize::from(peak > 1);
    }
    (most, shared)
}

/// The source port of flow `i`: one that crosses its pinned spine, or one from its index.
fn sport_of(cluster: &Cluster, i: usize, f: &TrafficFlow) -> Result<u16, PlanError> {
    match f.spine {
        None => Ok(crate::engine::event::sport(i, f.from, f.to)),
        Some(s) => sport_for_spine(cluster, f.from, f.to, s).ok_or_else(|| {
            invalid(
                "traffic.spine",
                format!(
                    "flow {i} ({} -> {}): no path of it crosses spine {s}",
                    f.from, f.to
                ),
            )
        }),
    }
}

/// Runs `flows` on `cluster`; `params` sets the packet engine (ignored by the fluid model).
pub fn run_traffic(
    cluster: &Cluster,
    flows: &[TrafficFlow],
    engine: FlowEngine,
    params: &PacketParams,
) -> Result<TrafficReport, PlanError> {
    for (i, f) in flows.iter().enumerate() {
        if f.from >= cluster.gpus() || f.to >= cluster.gpus() {
            return Err(invalid(
                "traffic",
                format!(
                    "flow {i}: GPU {} -> {} outside the design's {} GPUs",
                    f.from,
                    f.to,
                    cluster.gpus()
                ),
            ));
        }
    }
    let sport = flows
        .iter()
        .enumerate()
        .map(|(i, f)| sport_of(cluster, i, f))
        .collect::<Result<Vec<u16>, _>>()?;
    let after: Vec<Vec<usize>> = flows.iter().map(|f| f.after.clone()).collect();
    let mut report = TrafficReport {
        engine,
        start_s: Vec::new(),
        done_s: Vec::new(),
        sport: sport.clone(),
        pauses: 0,
        ecn_marks: 0,
        cnps: 0,
        drops: 0,
        most_on_a_link: 0,
        shared_links: 0,
    };
    let paths: Vec<Vec<usize>> = flows
        .iter()
        .zip(&sport)
        .map(|(f, &s)| {
            let mut p = Vec::new();
            cluster.route(f.from, f.to, None, s, &mut p);
            p
        })
        .collect();
    match engine {
        FlowEngine::Packet => {
            let pf: Vec<Flow> = flows
                .iter()
                .zip(&sport)
                .map(|(f, &s)| Flow {
                    from: f.from,
                    to: f.to,
                    bytes: f.bytes,
                    start_s: f.start_s,
                    sport: s,
                    rail: None,
                })
                .collect();
            let r = simulate_dependent_flows(cluster, &pf, &after, params)?;
            report.start_s = flows
                .iter()
                .map(|f| {
                    f.after
                        .iter()
                        .map(|&d| r.flow_done_s[d])
                        .fold(f.start_s, f64::max)
                })
                .collect();
            report.done_s = r.flow_done_s;
            (report.pauses, report.ecn_marks, report.cnps, report.drops) =
                (r.pauses, r.ecn_marks, r.cnps, r.drops);
        }
        FlowEngine::Fluid => {
            // The packet engine checks the dependencies itself.
            check_order(flows).map_err(|e| invalid("traffic", e.why))?;
            let bits: Vec<f64> = flows.iter().map(|f| f.bytes as f64 * 8.0).collect();
            let start: Vec<f64> = flows.iter().map(|f| f.start_s).collect();
            let (began, arrived) = drain_timed(
                cluster.capacity(),
                &bits,
                &start,
                &after,
                |f| &paths[f],
                |f| cluster.latency(&paths[f]),
            );
            report.start_s = began;
            report.done_s = arrived;
        }
    }
    (report.most_on_a_link, report.shared_links) =
        sharing(cluster, &paths, &report.start_s, &report.done_s);
    Ok(report)
}
