//! Fabrics as directed links with capacities and latencies, and the path a flow takes.
//!
//! First topology: a two-tier leaf-spine (every leaf wired to every spine once), one NIC per
//! host, routed up-down with ECMP: the spine is chosen by hashing the RoCEv2 5-tuple (source
//! and destination address, the QP's UDP source port, destination port 4791), seeded per
//! switch, as switches do.

use std::fmt;

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

fn bad(field: &'static str, why: impl Into<String>) -> TopologyError {
    TopologyError {
        field,
        why: why.into(),
    }
}

/// A two-tier leaf-spine.
#[derive(Debug, Clone, PartialEq)]
pub struct LeafSpine {
    /// Leaf (top-of-rack) switches.
    pub leaves: usize,
    /// Hosts under each leaf.
    pub hosts_per_leaf: usize,
    /// Spine switches (each wired once to every leaf).
    pub spines: usize,
    /// Host-to-leaf link speed, bits per second.
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
        for (field, v) in [
            ("host_link", self.host_link_bps),
            ("spine_link", self.spine_link_bps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(field, format!("{v} b/s: want a positive speed")));
            }
        }
        if !(self.link_latency_s.is_finite() && self.link_latency_s >= 0.0) {
            return Err(bad("link_latency", "want a non-negative time"));
        }
        let hosts = self.leaves * self.hosts_per_leaf;
        let spine_links = if self.leaves > 1 {
            2 * self.leaves * self.spines
        } else {
            0
        };
        let mut capacity = vec![self.host_link_bps; 2 * hosts];
        capacity.extend(std::iter::repeat_n(self.spine_link_bps, spine_links));
        let latency = vec![self.link_latency_s; capacity.len()];
        Ok(Fabric {
            shape: self.clone(),
            hosts,
            capacity,
            latency,
        })
    }

    /// Host bandwidth under a leaf over its uplink bandwidth (1.0: non-blocking).
    pub fn oversubscription(&self) -> f64 {
        (self.hosts_per_leaf as f64 * self.host_link_bps)
            / (self.spines as f64 * self.spine_link_bps)
    }
}

/// A built fabric: directed links and how flows cross them.
#[derive(Debug, Clone)]
pub struct Fabric {
    shape: LeafSpine,
    hosts: usize,
    /// Capacity of each link, bits per second.
    pub capacity: Vec<f64>,
    /// Latency of each link, seconds.
    pub latency: Vec<f64>,
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

impl Fabric {
    /// Hosts (one NIC each).
    pub fn hosts(&self) -> usize {
        self.hosts
    }
    /// The shape it was built from.
    pub fn shape(&self) -> &LeafSpine {
        &self.shape
    }
    fn leaf_of(&self, h: usize) -> usize {
        h / self.shape.hosts_per_leaf
    }
    fn up(&self, h: usize) -> LinkId {
        h
    }
    fn down(&self, h: usize) -> LinkId {
        self.hosts + h
    }
    fn leaf_to_spine(&self, l: usize, s: usize) -> LinkId {
        2 * self.hosts + l * self.shape.spines + s
    }
    fn spine_to_leaf(&self, s: usize, l: usize) -> LinkId {
        2 * self.hosts + self.shape.leaves * self.shape.spines + s * self.shape.leaves + l
    }

    /// The spine a flow from host `src` to host `dst` with UDP source port `sport` crosses,
    /// if it leaves its leaf.
    pub fn spine_of(&self, src: usize, dst: usize, sport: u16) -> Option<usize> {
        let (ls, ld) = (self.leaf_of(src), self.leaf_of(dst));
        (ls != ld).then(|| (ecmp_hash(src, dst, sport, ls) % self.shape.spines as u64) as usize)
    }

    /// The links from host `src` to host `dst` (empty within a host).
    pub fn path(&self, src: usize, dst: usize, sport: u16) -> Vec<LinkId> {
        if src == dst {
            return Vec::new();
        }
        match self.spine_of(src, dst, sport) {
            None => vec![self.up(src), self.down(dst)],
            Some(s) => vec![
                self.up(src),
                self.leaf_to_spine(self.leaf_of(src), s),
                self.spine_to_leaf(s, self.leaf_of(dst)),
                self.down(dst),
            ],
        }
    }

    /// Total latency of a path.
    pub fn path_latency(&self, path: &[LinkId]) -> f64 {
        path.iter().map(|&l| self.latency[l]).sum()
    }

    /// Is `link` a leaf-spine link (either direction)?
    pub fn is_fabric_link(&self, link: LinkId) -> bool {
        link >= 2 * self.hosts
    }
}
