//! Cluster designs in TOML, sized for a GPU count, and the planner's report on them.
//!
//! ```toml
//! gpus = 4096
//! [server]     # gpus = 8, nics = 8, nvlink = "3.6Tbps", pcie = "512Gbps"
//! [fabric]     # kind = "leaf-spine" | "fat-tree" | "rail-optimized", transport = "roce" |
//!              # "infiniband", radix = 64, link_speed = "400Gbps", link_latency = "600ns",
//!              # oversubscription = 1 (leaf-spine), servers_per_unit (rail-optimized),
//!              # spine_radix (chassis spines; default radix), tiers (fat-tree: 2 or 3)
//! [collective] # op = "all_reduce", algorithm = "auto" (what NCCL's tuner would run, per
//!              # size) | "ring" | "tree" | ..., size = "1GiB", dtype = "float32",
//!              # channels (default: GPUs per server)
//! [training]   # forward, backward, optimizer (times), gradients, bucket (sizes); optional
//! [prices]     # switch_port, nic, cable, optic; optional
//!              # packet engine: mtu = "4KiB", switch_buffer = "32MiB", flow_control =
//!              # "pfc" | "lossy" (RoCE) | "credits" (InfiniBand), adaptive_routing = false,
//!              # header_bytes = 78 (wire bytes per packet beyond the payload), acks =
//!              # false (true: an ACK of header_bytes back per data packet), PFC:
//!              # pfc_alpha = 0.125 (dynamic threshold, of the free buffer) or pfc_threshold
//!              # (a fixed size per ingress port), pfc_resume = "8348B" (below the threshold)
//! [congestion] # RoCE: algorithm = "dcqcn" | "none", ecn_kmin, ecn_kmax (sizes), ecn_pmax
//!              # (step marking: ecn_kmin = ecn_kmax, ecn_pmax = 1),
//!              # rate_ai, rate_hai (speeds), timer (time); defaults scale with link_speed
//! [background] # a competing job: gpus, op, algorithm, size, placement = "packed" (its own
//!              # servers after the planned job's) | "interleaved" (servers dealt in turn)
//! [sim]        # overhead = "2us" per message, engine = "auto" | "event" | "lockstep" |
//!              # "packet"
//! ```
//! Every mistake is an error that names the field and says what is allowed: unknown keys
//! (with the closest known one), wrong types, bare numbers where a unit is needed, shapes
//! that cannot be built. Nothing is silently defaulted but what is documented above.

use monel_sched::RedOp;
use monel_sched::plan::{Algorithm, Collective, CollectiveKind};
use toml::{Table, Value};

use crate::cluster::{Cluster, Server};
use crate::design::{Design, Transport};
use crate::engine::packet::{Ecn, FlowControl, PacketParams};
use crate::error::{ConfigError, err};
use crate::scenario::{Background, CollectiveSpec, Engine, Placement, Prices, Scenario, Training};
use crate::topology::{FatTree, LeafSpine, RailOptimized, Routing};
use crate::units::{parse_bandwidth, parse_bytes, parse_time};

/// Reads one table's keys, refusing unknown ones.
struct Section<'a> {
    name: &'static str,
    t: Option<&'a Table>,
}

fn closest<'k>(key: &str, allowed: &[&'k str]) -> Option<&'k str> {
    allowed
        .iter()
        .map(|&a| (strsim::levenshtein(key, a), a))
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
            "header_bytes",
            "acks",
            "pfc_alpha",
            "pfc_resume",
            "pfc_threshold",
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
    let (coll, forced) = op_and_algorithm(&c)?;
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
    let mut spec = CollectiveSpec {
        coll,
        algo: forced.unwrap_or(Algorithm::Ring),
        bytes: c.bytes("size", Some("1GiB"))?,
        elem_bytes,
        channels: c.int("channels", 1)?.unwrap_or(per),
        ranks: gpus,
    };
    let choice = match forced {
        Some(_) => None,
        None => spec.tune(&cluster),
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
            let (coll, forced) = op_and_algorithm(&bg)?;
            let mut spec = CollectiveSpec {
                coll,
                algo: forced.unwrap_or(Algorithm::Ring),
                bytes: bg.bytes("size", Some("1GiB"))?,
                elem_bytes,
                channels: per,
                ranks: bg_gpus,
            };
            if forced.is_none() {
                spec.tune(&cluster);
            }
            vec![Background { spec }]
        }
    };
    Ok(Design {
        name,
        gpus,
        transport,
        cluster,
        spec,
        choice,
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

/// The `op` and `algorithm` keys of a collective's section: the algorithm forced, or `None`
/// for NCCL's choice (`auto`, the default; all-to-all has one algorithm, direct).
fn op_and_algorithm(c: &Section<'_>) -> Result<(Collective, Option<Algorithm>), ConfigError> {
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
    let mut names: Vec<&str> = vec!["auto"];
    names.extend(Algorithm::ALL.iter().map(|a| a.name()));
    let algo = match c.choice("algorithm", &names, "auto")? {
        "auto" if coll.algorithms().len() == 1 => coll.algorithms()[0],
        "auto" => return Ok((coll, None)),
        name => Algorithm::parse(name).expect("listed"),
    };
    if !coll.algorithms().contains(&algo) {
        let have: Vec<&str> = coll.algorithms().iter().map(|a| a.name()).collect();
        return Err(err(
            c.field("algorithm"),
            format!(
                "{} has no {}: want auto or one of {}",
                coll.name(),
                algo.name(),
                have.join(", ")
            ),
        ));
    }
    Ok((coll, Some(algo)))
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
    if let Some(h) = f.num("header_bytes")? {
        if !(0.0..=65536.0).contains(&h) || h.fract() != 0.0 {
            return Err(err(
                "fabric.header_bytes",
                format!("{h}: want 0 to 65536 bytes"),
            ));
        }
        p.header_bytes = h as u32;
    }
    p.acks = f.bool("acks")?.unwrap_or(false);
    if let Some(a) = f.num("pfc_alpha")? {
        if !(a > 0.0 && a.is_finite()) {
            return Err(err(
                "fabric.pfc_alpha",
                format!("{a}: want a positive number"),
            ));
        }
        p.pfc_alpha = a;
    }
    let resume = format!("{}B", p.pfc_resume_bytes);
    p.pfc_resume_bytes = f.bytes("pfc_resume", Some(&resume))?;
    if f.t.is_some_and(|t| t.contains_key("pfc_threshold")) {
        let x = f.bytes("pfc_threshold", None)?;
        let packet = u64::from(p.mtu + p.header_bytes);
        if x < packet || x > p.switch_buffer_bytes {
            return Err(err(
                "fabric.pfc_threshold",
                format!(
                    "{x} B: want one packet ({packet} B) to the switch buffer ({} B)",
                    p.switch_buffer_bytes
                ),
            ));
        }
        p.pfc_xoff_bytes = Some(x);
    }
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
