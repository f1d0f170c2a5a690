//! Fabrics as directed links with capacities and latencies, and the path a flow takes.
//!
//! A fabric is a tree-like Clos: endpoints (NIC ports) at the bottom, switches in tiers above.
//! Every node covers a contiguous range of endpoints below it, so routing is up-down: a flow
//! climbs until it reaches a switch that covers its destination, then descends. Where a
//! switch has several equal choices (uplinks, or parallel links down) it picks one by hashing
//! the RoCEv2 5-tuple (source and destination, the QP's UDP source port, destination port
//! 4791), seeded per switch, as ECMP does.
//!
//! Builders: [`LeafSpine`] (two tiers, any oversubscription), [`FatTree`] (k-ary, 2 or 3
//! tiers, non-blocking) and [`RailOptimized`] (a leaf per NIC rank in every scalable unit,
//! DGX SuperPOD style).

use std::fmt;
use std::ops::Range;

/// Index of a directed link.
pub type LinkId = usize;

/// A topology that cannot be built; the message names the field and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyError {
    /// The field at fault.
    pub field: &'static str,
    /// Why.
    pub why: String,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "topology.{}: {}", self.field, self.why)
    }
}

impl std::error::Error for TopologyError {}

pub(crate) fn bad(field: &'static str, why: impl Into<String>) -> TopologyError {
    TopologyError {
        field,
        why: why.into(),
    }
}

fn positive(field: &'static str, v: f64) -> Result<(), TopologyError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(field, format!("{v} b/s: want a positive speed")))
    }
}

fn latency_ok(v: f64) -> Result<(), TopologyError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(bad("link_latency", "want a non-negative time"))
    }
}

/// What a link connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// Between an endpoint (NIC port) and its first switch.
    Edge,
    /// Between two switches.
    Fabric,
    /// Inside a host (NVLink, PCIe); added by [`crate::Cluster`].
    Host,
}

/// The ECMP hash of a flow's 5-tuple at one switch (a 64-bit mix, seeded by the switch).
pub fn ecmp_hash(src: usize, dst: usize, udp_sport: u16, switch: usize) -> u64 {
    let mut x = (src as u64) << 32 ^ dst as u64;
    x ^= (u64::from(udp_sport) << 16 | 4791) << 7;
    x ^= (switch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// How switches choose among equal uplinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// RoCE: a hash of the 5-tuple, the QP's UDP source port included.
    Ecmp,
    /// InfiniBand's static fat-tree routing (OpenSM ftree, "D-mod-k"): the uplink is picked
    /// by the destination's number, which spreads any permutation of distinct destinations
    /// evenly over the uplinks.
    DestMod,
}

/// A built fabric: nodes (endpoints, then switches), directed links and how flows cross them.
#[derive(Debug, Clone)]
pub struct Fabric {
    /// What it is, in words (for reports).
    pub name: String,
    endpoints: usize,
    /// Switches by tier, lowest first.
    pub switches_per_tier: Vec<usize>,
    /// Capacity of each link, bits per second.
    pub capacity: Vec<f64>,
    /// Latency of each link, seconds.
    pub latency: Vec<f64>,
    /// What each link connects.
    pub kind: Vec<LinkKind>,
    head: Vec<usize>,
    up: Vec<Vec<LinkId>>,
    down: Vec<Vec<(Range<usize>, LinkId)>>,
    cover: Vec<Range<usize>>,
    /// Endpoint of NIC `m` of host `h`: `h * nics + m`, or rail-major inside a scalable unit.
    layout: Layout,
    /// Endpoint (NIC port) speed, bits per second.
    pub edge_bps: f64,
    /// How uplinks are chosen.
    pub routing: Routing,
    /// Switches to pay for (a partly populated fat-tree needs fewer core switches than it
    /// models: their ports are consolidated).
    pub billed_switches: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    HostMajor,
    /// Rail-major inside scalable units of this many servers, with this many rails.
    Rails {
        servers: usize,
        rails: usize,
    },
}

/// Builds a fabric node by node.
struct Builder {
    f: Fabric,
}

impl Builder {
    fn new(name: String, endpoints: usize, edge_bps: f64) -> Self {
        Self {
            f: Fabric {
                name,
                endpoints,
                switches_per_tier: Vec::new(),
                capacity: Vec::new(),
                latency: Vec::new(),
                kind: Vec::new(),
                head: Vec::new(),
                up: vec![Vec::new(); endpoints],
                down: vec![Vec::new(); endpoints],
                cover: (0..endpoints).map(|e| e..e + 1).collect(),
                layout: Layout::HostMajor,
                edge_bps,
                routing: Routing::Ecmp,
                billed_switches: 0,
            },
        }
    }
    /// A new switch covering `cover`; returns its node id.
    fn switch(&mut self, cover: Range<usize>) -> usize {
        self.f.up.push(Vec::new());
        self.f.down.push(Vec::new());
        self.f.cover.push(cover);
        self.f.up.len() - 1
    }
    fn tier(&mut self, count: usize) {
        self.f.switches_per_tier.push(count);
    }
    fn link(&mut self, to: usize, bps: f64, lat: f64, kind: LinkKind) -> LinkId {
        self.f.capacity.push(bps);
        self.f.latency.push(lat);
        self.f.kind.push(kind);
        self.f.head.push(to);
        self.f.capacity.len() - 1
    }
    /// A cable between `child` and `parent`: one link each way.
    fn cable(&mut self, child: usize, parent: usize, bps: f64, lat: f64, kind: LinkKind) {
        let up = self.link(parent, bps, lat, kind);
        let down = self.link(child, bps, lat, kind);
        self.f.up[child].push(up);
        let cover = self.f.cover[child].clone();
        self.f.down[parent].push((cover, down));
    }
    fn finish(mut self) -> Fabric {
        for d in &mut self.f.down {
            d.sort_by_key(|(r, l)| (r.start, *l));
        }
        self.f.billed_switches = self.f.switches();
        self.f
    }
}

/// A two-tier leaf-spine with any oversubscription.
#[derive(Debug, Clone, PartialEq)]
pub struct LeafSpine {
    /// Leaf (top-of-rack) switches.
    pub leaves: usize,
    /// Endpoints (NIC ports) under each leaf.
    pub hosts_per_leaf: usize,
    /// Spine switches (each wired once to every leaf).
    pub spines: usize,
    /// Endpoint-to-leaf link speed, bits per second.
    pub host_link_bps: f64,
    /// Leaf-to-spine link speed, bits per second.
    pub spine_link_bps: f64,
    /// Propagation and switching latency of every link, seconds.
    pub link_latency_s: f64,
}

impl LeafSpine {
    /// Checks the shape and builds the fabric.
    pub fn build(&self) -> Result<Fabric, TopologyError> {
        if self.leaves == 0 {
            return Err(bad("leaves", "want at least 1"));
        }
        if self.hosts_per_leaf == 0 {
            return Err(bad("hosts_per_leaf", "want at least 1"));
        }
        if self.leaves > 1 && self.spines == 0 {
            return Err(bad(
                "spines",
                format!(
                    "{} leaves need at least 1 spine to reach each other",
                    self.leaves
                ),
            ));
        }
        positive("host_link", self.host_link_bps)?;
        positive("spine_link", self.spine_link_bps)?;
        latency_ok(self.link_latency_s)?;
        let hosts = self.leaves * self.hosts_per_leaf;
        let name = format!(
            "leaf-spine {} leaves x {} ports, {} spines ({:.2}:1)",
            self.leaves,
            self.hosts_per_leaf,
            self.spines,
            self.oversubscription()
        );
        let mut b = Builder::new(name, hosts, self.host_link_bps);
        let lat = self.link_latency_s;
        let leaves: Vec<usize> = (0..self.leaves)
            .map(|l| b.switch(l * self.hosts_per_leaf..(l + 1) * self.hosts_per_leaf))
            .collect();
        b.tier(self.leaves);
        for h in 0..hosts {
            b.cable(
                h,
                leaves[h / self.hosts_per_leaf],
                self.host_link_bps,
                lat,
                LinkKind::Edge,
            );
        }
        if self.leaves > 1 {
            let spines: Vec<usize> = (0..self.spines).map(|_| b.switch(0..hosts)).collect();
            b.tier(self.spines);
            for &l in &leaves {
                for &s in &spines {
                    b.cable(l, s, self.spine_link_bps, lat, LinkKind::Fabric);
                }
            }
        }
        Ok(b.finish())
    }

    /// Endpoint bandwidth under a leaf over its uplink bandwidth (1.0: non-blocking).
    pub fn oversubscription(&self) -> f64 {
        (self.hosts_per_leaf as f64 * self.host_link_bps)
            / (self.spines as f64 * self.spine_link_bps)
    }
}

/// A k-ary fat-tree of radix-k switches, all links one speed: 2 tiers (k leaves of k/2
/// endpoints, k/2 spines: k^2/2 endpoints) or 3 tiers (k pods of k/2 edge and k/2
/// aggregation switches, (k/2)^2 cores: k^3/4 endpoints). Non-blocking.
#[derive(Debug, Clone, PartialEq)]
pub struct FatTree {
    /// Switch radix (even, at least 2).
    pub k: usize,
    /// 2 or 3.
    pub tiers: usize,
    /// Link speed, bits per second.
    pub link_bps: f64,
    /// Latency of every link, seconds.
    pub link_latency_s: f64,
    /// Pods built (3 tiers; 0: all k). Fewer pods serve fewer endpoints; the core switches'
    /// unused ports are consolidated when billing.
    pub pods: usize,
}

impl FatTree {
    fn pods(&self) -> usize {
        if self.pods == 0 { self.k } else { self.pods }
    }
    /// Endpoints it serves.
    pub fn endpoints(&self) -> usize {
        match self.tiers {
            2 => self.k * self.k / 2,
            _ => self.pods() * self.k * self.k / 4,
        }
    }

    /// Checks the shape and builds the fabric.
    pub fn build(&self) -> Result<Fabric, TopologyError> {
        let k = self.k;
        if k < 2 || k % 2 != 0 {
            return Err(bad("k", format!("{k}: want an even radix of at least 2")));
        }
        if self.tiers != 2 && self.tiers != 3 {
            return Err(bad("tiers", format!("{}: want 2 or 3", self.tiers)));
        }
        positive("link_speed", self.link_bps)?;
        latency_ok(self.link_latency_s)?;
        if self.pods > k {
            return Err(bad("pods", format!("{}: want at most k = {k}", self.pods)));
        }
        let (h, bps, lat) = (k / 2, self.link_bps, self.link_latency_s);
        let n = self.endpoints();
        let name = format!("{}-tier fat-tree k={k}", self.tiers);
        let mut b = Builder::new(name, n, bps);
        let pods = self.pods();
        let leaves = if self.tiers == 2 { k } else { pods * h };
        let edge: Vec<usize> = (0..leaves).map(|l| b.switch(l * h..(l + 1) * h)).collect();
        b.tier(leaves);
        for e in 0..n {
            b.cable(e, edge[e / h], bps, lat, LinkKind::Edge);
        }
        if self.tiers == 2 {
            let spines: Vec<usize> = (0..h).map(|_| b.switch(0..n)).collect();
            b.tier(h);
            for &l in &edge {
                for &s in &spines {
                    b.cable(l, s, bps, lat, LinkKind::Fabric);
                }
            }
            return Ok(b.finish());
        }
        let pod = h * h; // endpoints per pod
        let agg: Vec<usize> = (0..pods * h)
            .map(|a| b.switch((a / h) * pod..(a / h + 1) * pod))
            .collect();
        b.tier(pods * h);
        for p in 0..pods {
            for e in 0..h {
                for a in 0..h {
                    b.cable(edge[p * h + e], agg[p * h + a], bps, lat, LinkKind::Fabric);
                }
            }
        }
        let core: Vec<usize> = (0..h * h).map(|_| b.switch(0..n)).collect();
        b.tier(h * h);
        // Core j is wired to aggregation switch j / (k/2) of every pod.
        for (j, &c) in core.iter().enumerate() {
            for p in 0..pods {
                b.cable(agg[p * h + j / h], c, bps, lat, LinkKind::Fabric);
            }
        }
        let mut f = b.finish();
        f.billed_switches = leaves + pods * h + (h * h * pods).div_ceil(k);
        Ok(f)
    }
}

/// A rail-optimized two-tier fabric (DGX SuperPOD style): servers with `rails` NICs are
/// grouped into scalable units; NIC i of every server in a unit goes to that unit's rail-i
/// leaf; every leaf is wired once to every spine.
#[derive(Debug, Clone, PartialEq)]
pub struct RailOptimized {
    /// Scalable units.
    pub units: usize,
    /// Servers per scalable unit (ports per rail leaf).
    pub servers_per_unit: usize,
    /// NICs per server (rails, and leaves per unit).
    pub rails: usize,
    /// Spine switches.
    pub spines: usize,
    /// Link speed (NIC and leaf-spine), bits per second.
    pub link_bps: f64,
    /// Latency of every link, seconds.
    pub link_latency_s: f64,
}

impl RailOptimized {
    /// Checks the shape and builds the fabric.
    pub fn build(&self) -> Result<Fabric, TopologyError> {
        for (field, v) in [
            ("units", self.units),
            ("servers_per_unit", self.servers_per_unit),
            ("rails", self.rails),
        ] {
            if v == 0 {
                return Err(bad(field, "want at least 1"));
            }
        }
        let leaves = self.units * self.rails;
        if leaves > 1 && self.spines == 0 {
            return Err(bad(
                "spines",
                format!("{leaves} rail leaves need at least 1 spine"),
            ));
        }
        positive("link_speed", self.link_bps)?;
        latency_ok(self.link_latency_s)?;
        let s = self.servers_per_unit;
        let n = leaves * s;
        let name = format!(
            "rail-optimized {} units x {} servers x {} rails, {} spines",
            self.units, s, self.rails, self.spines
        );
        let (bps, lat) = (self.link_bps, self.link_latency_s);
        let mut b = Builder::new(name, n, bps);
        let leaf: Vec<usize> = (0..leaves).map(|l| b.switch(l * s..(l + 1) * s)).collect();
        b.tier(leaves);
        for e in 0..n {
            b.cable(e, leaf[e / s], bps, lat, LinkKind::Edge);
        }
        if leaves > 1 {
            let spines: Vec<usize> = (0..self.spines).map(|_| b.switch(0..n)).collect();
            b.tier(self.spines);
            for &l in &leaf {
                for &sp in &spines {
                    b.cable(l, sp, bps, lat, LinkKind::Fabric);
                }
            }
        }
        let mut f = b.finish();
        f.layout = Layout::Rails {
            servers: s,
            rails: self.rails,
        };
        Ok(f)
    }
}

impl Fabric {
    /// Endpoints (NIC ports).
    pub fn hosts(&self) -> usize {
        self.endpoints
    }

    /// Switches in all tiers.
    pub fn switches(&self) -> usize {
        self.switches_per_tier.iter().sum()
    }

    /// Links (directed), including any added inside hosts.
    pub fn links(&self) -> usize {
        self.capacity.len()
    }

    /// NICs per server the layout fixes (rail-optimized fabrics), if any.
    pub fn rails(&self) -> Option<usize> {
        match self.layout {
            Layout::Rails { rails, .. } => Some(rails),
            Layout::HostMajor => None,
        }
    }

    /// The endpoint of NIC `nic` of server `host`, with `nics` NICs per server.
    pub fn endpoint(&self, host: usize, nic: usize, nics: usize) -> usize {
        match self.layout {
            Layout::HostMajor => host * nics + nic,
            Layout::Rails { servers, rails } => {
                let (unit, s) = (host / servers, host % servers);
                (unit * rails + nic) * servers + s
            }
        }
    }

    /// The switch a flow from endpoint `src` to `dst` with UDP source port `sport` turns
    /// around at, if it leaves its leaf, counted from 0 in its own tier: a spine of a
    /// leaf-spine; in a 3-tier fat-tree, a core switch between pods and an aggregation switch
    /// (numbered across pods) inside one.
    pub fn spine_of(&self, src: usize, dst: usize, sport: u16) -> Option<usize> {
        let path = self.path(src, dst, sport);
        if path.len() <= 2 {
            return None;
        }
        let mut first = self.endpoints;
        let top = self.head[path[path.len() / 2 - 1]];
        for &n in &self.switches_per_tier {
            if top < first + n {
                return Some(top - first);
            }
            first += n;
        }
        None
    }

    /// The links from endpoint `src` to endpoint `dst` (empty from an endpoint to itself).
    pub fn path(&self, src: usize, dst: usize, sport: u16) -> Vec<LinkId> {
        let mut path = Vec::with_capacity(6);
        self.path_into(src, dst, sport, &mut path);
        path
    }

    /// [`Fabric::path`] into a reused buffer (appended).
    pub fn path_into(&self, src: usize, dst: usize, sport: u16, path: &mut Vec<LinkId>) {
        self.route_from(src, src, dst, sport, path);
    }

    /// The rest of the path from `src` to `dst` once it is at `node` (appended).
    pub(crate) fn route_from(
        &self,
        node: usize,
        src: usize,
        dst: usize,
        sport: u16,
        path: &mut Vec<LinkId>,
    ) {
        let mut node = node;
        let mut spread = dst;
        while !self.cover[node].contains(&dst) {
            let ups = &self.up[node];
            let pick = if ups.len() == 1 {
                0
            } else if self.routing == Routing::DestMod {
                let p = spread % ups.len();
                spread /= ups.len();
                p
            } else {
                (ecmp_hash(src, dst, sport, node) % ups.len() as u64) as usize
            };
            let l = ups[pick];
            path.push(l);
            node = self.head[l];
        }
        while node != dst {
            let down = &self.down[node];
            let first = down.partition_point(|(r, _)| r.end <= dst);
            let range = &down[first].0;
            let same = down[first..].iter().take_while(|(r, _)| r == range).count();
            let pick = if same == 1 {
                0
            } else {
                (ecmp_hash(src, dst, sport, node) % same as u64) as usize
            };
            let l = down[first + pick].1;
            path.push(l);
            node = self.head[l];
        }
    }

    /// The node link `l` leads to (`usize::MAX` for links inside hosts).
    pub(crate) fn head(&self, l: LinkId) -> usize {
        self.head[l]
    }

    /// The node each link leaves from (`usize::MAX` for links inside hosts).
    pub(crate) fn tails(&self) -> Vec<usize> {
        let mut tail = vec![usize::MAX; self.links()];
        for (node, ups) in self.up.iter().enumerate() {
            for &l in ups {
                tail[l] = node;
            }
        }
        for (node, downs) in self.down.iter().enumerate() {
            for &(_, l) in downs {
                tail[l] = node;
            }
        }
        tail
    }

    /// The uplinks of `node`.
    pub(crate) fn up_links(&self, node: usize) -> &[LinkId] {
        &self.up[node]
    }

    /// Nodes: endpoints, then switches.
    pub(crate) fn nodes(&self) -> usize {
        self.up.len()
    }

    /// Total latency of a path.
    pub fn path_latency(&self, path: &[LinkId]) -> f64 {
        path.iter().map(|&l| self.latency[l]).sum()
    }

    /// Is `link` between two switches?
    pub fn is_fabric_link(&self, link: LinkId) -> bool {
        self.kind[link] == LinkKind::Fabric
    }

    /// Adds a link that no routing uses (host-internal links of a [`crate::Cluster`]).
    pub(crate) fn add_link(&mut self, bps: f64, lat: f64, kind: LinkKind) -> LinkId {
        self.capacity.push(bps);
        self.latency.push(lat);
        self.kind.push(kind);
        self.head.push(usize::MAX);
        self.capacity.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connected(f: &Fabric) {
        let n = f.hosts();
        for (a, b) in [(0, n - 1), (n - 1, 0), (0, n / 2), (1, n / 3)] {
            let p = f.path(a, b, 0xC001);
            // The path is a chain from a to b.
            assert!(!p.is_empty() || a == b);
            assert!(p.len() % 2 == 0, "up-down paths are symmetric: {p:?}");
            assert_eq!(f.head[*p.last().unwrap()], b);
        }
    }

    #[test]
    fn fat_trees_have_the_textbook_sizes() {
        let t3 = FatTree {
            k: 8,
            tiers: 3,
            link_bps: 1e9,
            link_latency_s: 0.0,
            pods: 0,
        };
        let f = t3.build().unwrap();
        assert_eq!(f.hosts(), 128); // k^3/4
        assert_eq!(f.switches(), 80); // 5k^2/4
        assert_eq!(f.links(), 2 * 3 * 128); // host, edge-agg and agg-core cables, both ways
        connected(&f);
        // Hosts in other pods are 6 hops away, under the same edge 2.
        assert_eq!(f.path(0, 127, 7).len(), 6);
        assert_eq!(f.path(0, 3, 7).len(), 2);
        assert_eq!(f.path(0, 5, 7).len(), 4);
        let f2 = FatTree { tiers: 2, ..t3 }.build().unwrap();
        assert_eq!((f2.hosts(), f2.switches()), (32, 12));
        connected(&f2);
    }

    #[test]
    fn rail_leaves_hold_one_nic_of_every_server() {
        let f = RailOptimized {
            units: 2,
            servers_per_unit: 4,
            rails: 8,
            spines: 4,
            link_bps: 400e9,
            link_latency_s: 0.0,
        }
        .build()
        .unwrap();
        assert_eq!((f.hosts(), f.switches()), (64, 20));
        connected(&f);
        // NIC 3 of servers 0 and 2 (same unit) share a leaf; NIC 3 and NIC 4 do not.
        let (a, b, c) = (
            f.endpoint(0, 3, 8),
            f.endpoint(2, 3, 8),
            f.endpoint(2, 4, 8),
        );
        assert_eq!(f.path(a, b, 1).len(), 2);
        assert_eq!(f.path(a, c, 1).len(), 4);
        // Every endpoint is some server's NIC, once.
        let mut seen = [false; 64];
        for h in 0..8 {
            for m in 0..8 {
                let e = f.endpoint(h, m, 8);
                assert!(!seen[e]);
                seen[e] = true;
            }
        }
    }

    #[test]
    fn bad_shapes_name_their_field() {
        let e = FatTree {
            k: 7,
            tiers: 3,
            link_bps: 1e9,
            link_latency_s: 0.0,
            pods: 0,
        }
        .build()
        .unwrap_err();
        assert_eq!(e.field, "k");
        let e = FatTree {
            k: 8,
            tiers: 4,
            link_bps: 1e9,
            link_latency_s: 0.0,
            pods: 0,
        }
        .build()
        .unwrap_err();
        assert_eq!(e.field, "tiers");
        assert!(e.to_string().contains("want 2 or 3"));
    }
}
