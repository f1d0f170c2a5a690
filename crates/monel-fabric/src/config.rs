//! Cluster designs in TOML, sized for a GPU count, and the planner's report on them.
//!
//! ```toml
//! gpus = 4096
//! [server]     # gpus = 8, nics = 8, nvlink = "3.6Tbps", pcie = "512Gbps"
//! [fabric]     # kind = "leaf-spine" | "fat-tree" | "rail-optimized", transport = "roce" |
//!              # "infiniband", radix = 64, link_speed = "400Gbps", link_latency = "600ns",
//!              # oversubscription = 1 (leaf-spine), servers_per_unit (rail-optimized),
//!              # spine_radix (chassis spines; default radix), tiers (fat-tree: 2 or 3)
//! [collective] # op = "all_reduce", algorithm = "ring", size = "1GiB", dtype = "float32",
//!              # channels (default: GPUs per server)
//! [training]   # forward, backward, optimizer (times), gradients, bucket (sizes); optional
//! [prices]     # switch_port, nic, cable, optic; optional
//!              # packet engine: mtu = "4KiB", switch_buffer = "32MiB", flow_control =
//!              # "pfc" | "lossy" (RoCE) | "credits" (InfiniBand), adaptive_routing = false
//! [congestion] # RoCE: algorithm = "dcqcn" | "none", ecn_kmin, ecn_kmax (sizes), ecn_pmax,
//!              # rate_ai, rate_hai (speeds), timer (time); defaults scale with link_speed
//! [background] # a competing job: gpus, op, algorithm, size, placement = "packed" (its own
//!              # servers after the planned job's) | "interleaved" (servers dealt in turn)
//! [sim]        # overhead = "2us" per message, engine = "auto" | "event" | "lockstep" |
//!              # "packet"
//! ```
//! Every mistake is an error that names the field and says what is allowed: unknown keys
//! (with the closest known one), wrong types, bare numbers where a unit is needed, shapes
//! that cannot be built. Nothing is silently defaulted but what is documented above.

use std::fmt;

use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective, CollectiveKind};
use toml::{Table, Value};

use crate::cluster::{Cluster, Server};
use crate::packet::{Ecn, FlowControl, PacketParams};
use crate::plan::{
    Background, CollectiveSpec, Cost, Engine, Outcome, Placement, PlanError, Prices, Scenario,
    StepReport, Training, cost, run_scenario, training_step,
};
use crate::topology::{FatTree, LeafSpine, RailOptimized, Routing, TopologyError};
use crate::units::{parse_bandwidth, parse_bytes, parse_time};

/// A configuration mistake: the field (dotted path) and what is wrong or allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `fabric.link_speed`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub why: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        why: why.into(),
    }
}

impl From<TopologyError> for ConfigError {
    fn from(e: TopologyError) -> Self {
        err(format!("fabric.{}", e.field), e.why)
    }
}

impl From<PlanError> for ConfigError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Invalid { field, why } => err(format!("collective.{field}"), why),
            PlanError::Replay(r) => err("collective", r.to_string()),
        }
    }
}

/// Fabric transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// RoCEv2: ECMP by 5-tuple hash.
    Roce,
    /// InfiniBand: static D-mod-k fat-tree routing.
    Infiniband,
}

/// A design, parsed and built.
#[derive(Debug, Clone)]
pub struct Design {
    /// Its name (the `name` key, else the caller's).
    pub name: String,
    /// GPUs used.
    pub gpus: usize,
    /// Transport.
    pub transport: Transport,
    /// The cluster (it may hold more GPUs than used: the last leaf or unit partly filled).
    pub cluster: Cluster,
    /// The collective to predict.
    pub spec: CollectiveSpec,
    /// A training step, if given.
    pub training: Option<Training>,
    /// Prices, if given.
    pub prices: Option<Prices>,
    /// Per-message overhead, seconds.
    pub overhead_s: f64,
    /// Engine.
    pub engine: Engine,
    /// Packet-engine settings and competing jobs.
    pub scenario: Scenario,
}

/// Reads one table's keys, refusing unknown ones.
struct Section<'a> {
    name: &'static str,
    t: Option<&'a Table>,
}

fn closest<'k>(key: &str, allowed: &[&'k str]) -> Option<&'k str> {
    fn dist(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    }
    allowed
        .iter()
        .map(|&a| (dist(key, a), a))
        .min()
        .filter(|&(d, a)| d <= a.len() / 2 + 1)
        .map(|(_, a)| a)
}

/// Refuses keys of `t` not in `allowed`, naming the closest allowed one.
fn known_keys(t: &Table, prefix: &str, allowed: &[&str]) -> Result<(), ConfigError> {
    match t.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => {
            let hint = closest(k, allowed)
                .map(|c| format!("did you mean {c}? "))
                .unwrap_or_default();
            Err(err(
                format!("{prefix}{k}"),
                format!("unknown key; {hint}allowed: {}", allowed.join(", ")),
            ))
        }
    }
}

impl<'a> Section<'a> {
    fn new(root: &'a Table, name: &'static str, allowed: &[&str]) -> Result<Self, ConfigError> {
        let t = match root.get(name) {
            None => None,
            Some(Value::Table(t)) => Some(t),
            Some(_) => return Err(err(name, "want a table ([section])")),
        };
        if let Some(t) = t {
            known_keys(t, &format!("{name}."), allowed)?;
        }
        Ok(Section { name, t })
    }
    fn field(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.t.and_then(|t| t.get(key))
    }
    fn str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(err(
                self.field(key),
                format!("want a string, got {}", v.type_str()),
            )),
        }
    }
    fn choice(
        &self,
        key: &str,
        allowed: &[&str],
        default: &'a str,
    ) -> Result<&'a str, ConfigError> {
        let v = self.str(key)?.unwrap_or(default);
        if allowed.contains(&v) {
            Ok(v)
        } else {
            Err(err(
                self.field(key),
                format!("{v:?}: want one of {}", allowed.join(", ")),
            ))
        }
    }
    fn bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(*b)),
            Some(v) => Err(err(self.field(key), format!("{v}: want true or false"))),
        }
    }
    fn int(&self, key: &str, min: i64) -> Result<Option<usize>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Integer(i)) if *i >= min => Ok(Some(*i as usize)),
            Some(Value::Integer(i)) => Err(err(
                self.field(key),
                format!("{i}: want a whole number of at least {min}"),
            )),
            Some(v) => Err(err(
                self.field(key),
                format!("want a whole number, got {}", v.type_str()),
            )),
        }
    }
    fn num(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Integer(i)) if *i >= 0 => Ok(Some(*i as f64)),
            Some(Value::Float(x)) if x.is_finite() && *x >= 0.0 => Ok(Some(*x)),
            Some(v) => Err(err(
                self.field(key),
                format!("want a non-negative number, got {v}"),
            )),
        }
    }
    fn unit<T>(
        &self,
        key: &str,
        parse: impl Fn(&str) -> Result<T, crate::UnitError>,
    ) -> Result<Option<T>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => parse(s)
                .map(Some)
                .map_err(|e| err(self.field(key), e.to_string())),
            Some(v) => Err(err(
                self.field(key),
                format!(
                    "{v}: want a quoted quantity with its unit (for example \"400Gbps\", \"1us\", \"25MiB\")"
                ),
            )),
        }
    }
    fn bps(&self, key: &str, default: Option<&str>) -> Result<f64, ConfigError> {
        match self.unit(key, parse_bandwidth)? {
            Some(v) => Ok(v),
            None => match default {
                Some(d) => Ok(parse_bandwidth(d).expect("a valid default")),
                None => Err(err(
                    self.field(key),
                    "missing: want a speed, e.g. \"400Gbps\"",
                )),
            },
        }
    }
    fn secs(&self, key: &str, default: Option<&str>) -> Result<f64, ConfigError> {
        match self.unit(key, parse_time)? {
            Some(v) => Ok(v),
            None => match default {
                Some(d) => Ok(parse_time(d).expect("a valid default")),
                None => Err(err(self.field(key), "missing: want a time, e.g. \"40ms\"")),
            },
        }
    }
    fn bytes(&self, key: &str, default: Option<&str>) -> Result<u64, ConfigError> {
        match self.unit(key, parse_bytes)? {
            Some(v) => Ok(v),
            None => match default {
                Some(d) => Ok(parse_bytes(d).expect("a valid default")),
                None => Err(err(self.field(key), "missing: want a size, e.g. \"2GiB\"")),
            },
        }
    }
}

const TOP: &[&str] = &[
    "name",
    "gpus",
    "server",
    "fabric",
    "collective",
    "training",
    "prices",
    "congestion",
    "background",
    "sim",
];

/// Parses a design; `gpus` overrides the file's GPU count (sweeps); `name` is used when the
/// file has none.
pub fn parse_design(text: &str, name: &str, gpus: Option<usize>) -> Result<Design, ConfigError> {
    let root: Table = text
        .parse()
        .map_err(|e: toml::de::Error| err("toml", e.to_string().trim().to_string()))?;
    known_keys(&root, "", TOP)?;
    let top = Section {
        name: "",
        t: Some(&root),
    };
    let name = match root.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(err("name", "want a string")),
        None => name.to_string(),
    };
    let gpus = match gpus {
        Some(g) => g,
        None => top
            .int("gpus", 1)
            .map_err(|e| err("gpus", e.why))?
            .ok_or_else(|| err("gpus", "missing: want the number of GPUs, e.g. gpus = 4096"))?,
    };
    if gpus == 0 {
        return Err(err("gpus", "want at least 1"));
    }

    let s = Section::new(&root, "server", &["gpus", "nics", "nvlink", "pcie"])?;
    let per = s.int("gpus", 1)?.unwrap_or(8);
    let server = Server {
        gpus: per,
        nics: s.int("nics", 1)?.unwrap_or(per),
        nvlink_bps: s.bps("nvlink", Some("3.6Tbps"))?,
        pcie_bps: s.bps("pcie", Some("512Gbps"))?,
    };
    if server.nics > per || per % server.nics != 0 {
        return Err(err(
            "server.nics",
            format!("{}: want a divisor of server.gpus ({per})", server.nics),
        ));
    }
    let bg = Section::new(
        &root,
        "background",
        &["gpus", "op", "algorithm", "size", "placement"],
    )?;
    let bg_gpus = match bg.t {
        None => 0,
        Some(_) => bg
            .int("gpus", 1)?
            .ok_or_else(|| err("background.gpus", "missing: want the competing job's GPUs"))?,
    };
    // The competing job has servers of its own.
    let servers = gpus.div_ceil(per) + bg_gpus.div_ceil(per);
    let endpoints = servers * server.nics;

    let f = Section::new(
        &root,
        "fabric",
        &[
            "kind",
            "transport",
            "radix",
            "link_speed",
            "link_latency",
            "oversubscription",
            "servers_per_unit",
            "spine_radix",
            "tiers",
            "mtu",
            "switch_buffer",
            "flow_control",
            "adaptive_routing",
        ],
    )?;
    let kind = f.choice("kind", &["leaf-spine", "fat-tree", "rail-optimized"], "")?;
    let transport = match f.choice("transport", &["roce", "infiniband"], "roce")? {
        "infiniband" => Transport::Infiniband,
        _ => Transport::Roce,
    };
    let radix = f.int("radix", 2)?.unwrap_or(64);
    let spine_radix = f.int("spine_radix", 2)?.unwrap_or(radix);
    let bps = f.bps("link_speed", None)?;
    let lat = f.secs("link_latency", Some("600ns"))?;
    let only = |key: &str, k: &str| -> Result<(), ConfigError> {
        if f.get(key).is_some() && kind != k {
            return Err(err(f.field(key), format!("only for kind = \"{k}\"")));
        }
        Ok(())
    };
    only("oversubscription", "leaf-spine")?;
    only("servers_per_unit", "rail-optimized")?;
    only("tiers", "fat-tree")?;
    if f.get("spine_radix").is_some() && kind == "fat-tree" {
        return Err(err(
            "fabric.spine_radix",
            "only for leaf-spine and rail-optimized (a fat-tree is built of one radix)",
        ));
    }
    let fabric = match kind {
        "leaf-spine" => {
            let r = f.num("oversubscription")?.unwrap_or(1.0);
            if r < 1.0 {
                return Err(err(
                    "fabric.oversubscription",
                    format!("{r}: want 1 (non-blocking) or more (down:up)"),
                ));
            }
            let down = ((radix as f64 * r / (r + 1.0)).round() as usize).clamp(1, radix - 1);
            let up = radix - down;
            let leaves = endpoints.div_ceil(down);
            if leaves > spine_radix {
                return Err(err(
                    "gpus",
                    format!(
                        "{gpus} GPUs need {leaves} leaves of {down} ports; a radix-{spine_radix} \
                         spine reaches {spine_radix}: use kind = \"fat-tree\" (3 tiers) or a \
                         larger spine_radix"
                    ),
                ));
            }
            LeafSpine {
                leaves,
                hosts_per_leaf: down,
                spines: if leaves > 1 { up } else { 0 },
                host_link_bps: bps,
                spine_link_bps: bps,
                link_latency_s: lat,
            }
            .build()?
        }
        "fat-tree" => {
            if radix % 2 != 0 {
                return Err(err("fabric.radix", format!("{radix}: want an even radix")));
            }
            let h = radix / 2;
            let tiers = match f.int("tiers", 2)? {
                Some(t) if t == 2 || t == 3 => t,
                Some(t) => return Err(err("fabric.tiers", format!("{t}: want 2 or 3"))),
                None if endpoints <= radix * h => 2,
                None => 3,
            };
            let cap = if tiers == 2 { radix * h } else { radix * h * h };
            if endpoints > cap {
                return Err(err(
                    "gpus",
                    format!(
                        "{gpus} GPUs need {endpoints} NIC ports; a {tiers}-tier radix-{radix} \
                         fat-tree serves {cap}"
                    ),
                ));
            }
            if tiers == 2 {
                let leaves = endpoints.div_ceil(h);
                LeafSpine {
                    leaves,
                    hosts_per_leaf: h,
                    spines: if leaves > 1 { h } else { 0 },
                    host_link_bps: bps,
                    spine_link_bps: bps,
                    link_latency_s: lat,
                }
                .build()?
            } else {
                FatTree {
                    k: radix,
                    tiers: 3,
                    link_bps: bps,
                    link_latency_s: lat,
                    pods: endpoints.div_ceil(h * h),
                }
                .build()?
            }
        }
        "rail-optimized" => {
            let spu = f.int("servers_per_unit", 1)?.unwrap_or(radix / 2);
            if spu > radix {
                return Err(err(
                    "fabric.servers_per_unit",
                    format!("{spu}: a radix-{radix} leaf has at most {radix} ports"),
                ));
            }
            let units = servers.div_ceil(spu);
            let leaves = units * server.nics;
            if leaves > spine_radix && leaves > 1 {
                return Err(err(
                    "gpus",
                    format!(
                        "{gpus} GPUs need {leaves} rail leaves; a radix-{spine_radix} spine \
                         reaches {spine_radix}: use a larger spine_radix or kind = \"fat-tree\""
                    ),
                ));
            }
            RailOptimized {
                units,
                servers_per_unit: spu,
                rails: server.nics,
                spines: if leaves > 1 { (radix - spu).max(1) } else { 0 },
                link_bps: bps,
                link_latency_s: lat,
            }
            .build()?
        }
        _ => {
            return Err(err(
                "fabric.kind",
                "missing: want one of leaf-spine, fat-tree, rail-optimized",
            ));
        }
    };
    let mut fabric = fabric;
    if transport == Transport::Infiniband {
        fabric.routing = Routing::DestMod;
    }
    let cluster = Cluster::new(fabric, server)?;

    let c = Section::new(
        &root,
        "collective",
        &["op", "algorithm", "size", "dtype", "channels"],
    )?;
    let (coll, algo) = op_and_algorithm(&c)?;
    let elem_bytes = match c.choice(
        "dtype",
        &["float32", "bfloat16", "float16", "float64", "int8", "fp8"],
        "float32",
    )? {
        "float64" => 8,
        "bfloat16" | "float16" => 2,
        "int8" | "fp8" => 1,
        _ => 4,
    };
    let spec = CollectiveSpec {
        coll,
        algo,
        bytes: c.bytes("size", Some("1GiB"))?,
        elem_bytes,
        channels: c.int("channels", 1)?.unwrap_or(per),
        ranks: gpus,
    };

    let t = Section::new(
        &root,
        "training",
        &["forward", "backward", "optimizer", "gradients", "bucket"],
    )?;
    let training = match t.t {
        None => None,
        Some(_) => Some(Training {
            forward_s: t.secs("forward", None)?,
            backward_s: t.secs("backward", None)?,
            optimizer_s: t.secs("optimizer", Some("0s"))?,
            gradient_bytes: t.bytes("gradients", None)?,
            bucket_bytes: t.bytes("bucket", Some("25MiB"))?,
        }),
    };
    let p = Section::new(&root, "prices", &["switch_port", "nic", "cable", "optic"])?;
    let prices = match p.t {
        None => None,
        Some(_) => Some(Prices {
            switch_port: p.num("switch_port")?.unwrap_or(0.0),
            nic: p.num("nic")?.unwrap_or(0.0),
            cable: p.num("cable")?.unwrap_or(0.0),
            optic: p.num("optic")?.unwrap_or(0.0),
        }),
    };
    let sim = Section::new(&root, "sim", &["overhead", "engine"])?;
    let engine = match sim.choice("engine", &["auto", "event", "lockstep", "packet"], "auto")? {
        "event" => Engine::Event,
        "lockstep" => Engine::Lockstep,
        "packet" => Engine::Packet,
        _ => Engine::Auto,
    };
    let packet = packet_params(&f, &root, transport, bps)?;
    let background = match bg.t {
        None => Vec::new(),
        Some(_) => {
            let (coll, algo) = op_and_algorithm(&bg)?;
            vec![Background {
                spec: CollectiveSpec {
                    coll,
                    algo,
                    bytes: bg.bytes("size", Some("1GiB"))?,
                    elem_bytes,
                    channels: per,
                    ranks: bg_gpus,
                },
            }]
        }
    };
    Ok(Design {
        name,
        gpus,
        transport,
        cluster,
        spec,
        training,
        prices,
        overhead_s: sim.secs("overhead", Some("2us"))?,
        engine,
        scenario: Scenario {
            packet: Some(packet),
            background,
            placement: match bg.choice("placement", &["packed", "interleaved"], "packed")? {
                "interleaved" => Placement::Interleaved,
                _ => Placement::Packed,
            },
        },
    })
}

/// The `op` and `algorithm` keys of a collective's section.
fn op_and_algorithm(c: &Section<'_>) -> Result<(Collective, Algorithm), ConfigError> {
    let kinds = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllToAll,
        CollectiveKind::Broadcast,
        CollectiveKind::Reduce,
    ];
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let coll = CollectiveKind::parse(c.choice("op", &names, "all_reduce")?)
        .expect("listed")
        .with(RedOp::Sum, 0);
    let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
    let algo = Algorithm::parse(c.choice("algorithm", &names, "ring")?).expect("listed");
    if !coll.algorithms().contains(&algo) {
        let have: Vec<&str> = coll.algorithms().iter().map(|a| a.name()).collect();
        return Err(err(
            c.field("algorithm"),
            format!(
                "{} has no {}: want one of {}",
                coll.name(),
                algo.name(),
                have.join(", ")
            ),
        ));
    }
    Ok((coll, algo))
}

/// The packet engine's settings from `[fabric]` and `[congestion]`.
fn packet_params(
    f: &Section<'_>,
    root: &Table,
    transport: Transport,
    bps: f64,
) -> Result<PacketParams, ConfigError> {
    let cc = Section::new(
        root,
        "congestion",
        &[
            "algorithm",
            "ecn_kmin",
            "ecn_kmax",
            "ecn_pmax",
            "rate_ai",
            "rate_hai",
            "timer",
        ],
    )?;
    let ib = transport == Transport::Infiniband;
    let mut p = if ib {
        PacketParams::infiniband()
    } else {
        PacketParams::roce(bps)
    };
    if ib && let Some(t) = cc.t {
        let key = t.keys().next().cloned().unwrap_or_default();
        return Err(err(
            format!("congestion.{key}"),
            "InfiniBand's congestion control is not modelled (credits keep it lossless): \
             remove [congestion], or use transport = \"roce\"",
        ));
    }
    let mtu = f.bytes("mtu", Some("4KiB"))?;
    if !(256..=1 << 20).contains(&mtu) {
        return Err(err("fabric.mtu", format!("{mtu} B: want 256 B to 1 MiB")));
    }
    p.mtu = mtu as u32;
    p.switch_buffer_bytes = f.bytes("switch_buffer", Some("32MiB"))?;
    let default = if ib { "credits" } else { "pfc" };
    p.flow_control = match f.choice("flow_control", &["pfc", "lossy", "credits"], default)? {
        "pfc" if !ib => FlowControl::Pfc,
        "lossy" if !ib => FlowControl::Lossy,
        "credits" if ib => FlowControl::Credits,
        other => {
            return Err(err(
                "fabric.flow_control",
                format!(
                    "{other:?}: {}",
                    if ib {
                        "InfiniBand uses \"credits\""
                    } else {
                        "RoCE wants \"pfc\" or \"lossy\""
                    }
                ),
            ));
        }
    };
    p.adaptive_routing = f.bool("adaptive_routing")?.unwrap_or(false);
    if !ib {
        let d = Ecn::for_link(bps);
        let ecn = Ecn {
            kmin_bytes: cc.bytes("ecn_kmin", Some(&format!("{}B", d.kmin_bytes)))?,
            kmax_bytes: cc.bytes("ecn_kmax", Some(&format!("{}B", d.kmax_bytes)))?,
            pmax: cc.num("ecn_pmax")?.unwrap_or(d.pmax),
        };
        if ecn.kmin_bytes > ecn.kmax_bytes {
            return Err(err(
                "congestion.ecn_kmin",
                format!(
                    "{} B is above ecn_kmax ({} B): want kmin <= kmax",
                    ecn.kmin_bytes, ecn.kmax_bytes
                ),
            ));
        }
        if !(0.0..=1.0).contains(&ecn.pmax) {
            return Err(err(
                "congestion.ecn_pmax",
                format!("{}: want a probability from 0 to 1", ecn.pmax),
            ));
        }
        p.ecn = Some(ecn);
        p.dcqcn = match cc.choice("algorithm", &["dcqcn", "none"], "dcqcn")? {
            "none" => None,
            _ => {
                let mut d = p.dcqcn.expect("RoCE defaults to DCQCN");
                d.rate_ai_bps = cc.bps("rate_ai", Some(&format!("{}bps", d.rate_ai_bps)))?;
                d.rate_hai_bps = cc.bps("rate_hai", Some(&format!("{}bps", d.rate_hai_bps)))?;
                d.time_reset = std::time::Duration::from_secs_f64(
                    cc.secs("timer", Some(&format!("{}ns", d.time_reset.as_nanos())))?,
                );
                Some(d)
            }
        };
    }
    Ok(p)
}

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
        let chans = if d.spec.algo == Algorithm::Ring {
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
            writeln!(
                f,
                "  training step: {:.2} ms (compute {:.2} ms, exposed communication {:.2} ms; \
                 {} buckets, all-reduce {:.2} ms in all)",
                s.step_s * 1e3,
                s.compute_s * 1e3,
                s.exposed_s * 1e3,
                s.buckets,
                s.allreduce_s * 1e3
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
}

impl SweepRow {
    /// CSV header.
    pub const HEADER: &'static str = "design,gpus,time_ms,busbw_GBps,step_ms,exposed_ms,cost_per_gpu,fabric_utilization,max_flows_per_link,pfc_pauses";
    /// This row in CSV.
    pub fn csv(&self) -> String {
        let o = |x: Option<f64>, k: f64| x.map(|v| format!("{:.4}", v * k)).unwrap_or_default();
        format!(
            "{},{},{:.4},{:.3},{},{},{},{},{},{}",
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
            self.pfc_pauses.map(|m| m.to_string()).unwrap_or_default()
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
        }
    }
}

/// A line chart in SVG: one line per series of (x, y) points, x on a log2 axis.
pub fn svg_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let (w, h, l, r, t, b) = (880.0, 420.0, 70.0, 300.0, 40.0, 50.0);
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x.log2());
        x1 = x1.max(x.log2());
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let px = |x: f64| l + (x.log2() - x0) / (x1 - x0) * (w - l - r);
    let py = |y: f64| h - b - y / y1 * (h - t - b);
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f",
    ];
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n\
         <line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>\n",
        (w - r + l) / 2.0,
        esc(title),
        h - b,
        w - r,
        h - b,
        h - b,
        (w - r + l) / 2.0,
        h - 12.0,
        esc(x_label),
        (h - b + t) / 2.0,
        (h - b + t) / 2.0,
        esc(y_label)
    );
    for i in 0..=4 {
        let y = y1 * f64::from(i) / 4.0;
        s += &format!(
            "<line x1=\"{l}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{4:.3}</text>\n",
            py(y),
            w - r,
            l - 6.0,
            py(y) + 4.0,
            y
        );
    }
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x}</text>\n",
            px(x),
            h - b + 16.0
        );
    }
    // A variant of another series ("name (hier)" beside "name") takes its colour, dashed.
    let mut color_of: Vec<usize> = Vec::new();
    let mut fresh = 0;
    for (name, _) in series {
        let base = name
            .rsplit_once(" (")
            .and_then(|(b, _)| series.iter().position(|(n, _)| n == b));
        match base {
            Some(k) if k < color_of.len() => color_of.push(color_of[k]),
            _ => {
                color_of.push(fresh);
                fresh += 1;
            }
        }
    }
    for (i, (name, p)) in series.iter().enumerate() {
        let c = colors[color_of[i] % colors.len()];
        let dash = if color_of[..i].contains(&color_of[i]) {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let d: Vec<String> = p
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash} points=\"{}\"/>\n",
            d.join(" ")
        );
        for &(x, y) in p {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>\n",
                px(x),
                py(y)
            );
        }
        let ly = t + 10.0 + 18.0 * i as f64;
        s += &format!(
            "<line x1=\"{x1}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"{c}\" stroke-width=\"3\"{dash}/><text x=\"{tx}\" y=\"{ly}\">{name}</text>\n",
            x1 = w - r + 8.0,
            x2 = w - r + 26.0,
            y = ly - 4.0,
            tx = w - r + 30.0,
            name = esc(name)
        );
    }
    s + "</svg>\n"
}
