//! Servers with GPUs and NICs on a fabric: what a rank-to-rank message crosses.
//!
//! A server has `gpus` GPUs and `nics` NICs (1:1, 1:2, 1:4 ...). GPU g's own NIC is
//! `g * nics / gpus`. Inside a server, GPUs talk through an NVLink switch (one link each way
//! per GPU, `nvlink_bps`). Between servers a message goes down a PCIe link to a NIC (shared by
//! the GPUs behind it, `pcie_bps`), across the fabric, and up the far NIC's PCIe link. A
//! message between servers uses the NIC *rail* its channel is given (NCCL builds a ring per
//! NIC, leaving and entering every server through the same rail, and moves data to that
//! NIC over NVLink first when it is not the GPU's own, as PXN does); without a channel, the
//! destination GPU's own rail. The NVLink hop of such a detour is not modelled (NVLink is
//! several times faster than a NIC).

use crate::topology::{Fabric, LinkId, LinkKind, TopologyError, bad};

/// What one server holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// GPUs (ranks) per server.
    pub gpus: usize,
    /// NICs per server.
    pub nics: usize,
    /// Each GPU's link to the NVLink switch, each way, bits per second.
    pub nvlink_bps: f64,
    /// Each NIC's PCIe link, each way, bits per second (shared by its GPUs).
    pub pcie_bps: f64,
}

impl Server {
    /// One GPU and one NIC, nothing inside to share: a plain host.
    pub fn plain() -> Self {
        Self {
            gpus: 1,
            nics: 1,
            nvlink_bps: f64::INFINITY,
            pcie_bps: f64::INFINITY,
        }
    }
}

/// Servers on a fabric.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The fabric, with the servers' internal links appended to its links.
    pub fabric: Fabric,
    /// What each server holds.
    pub server: Server,
    servers: usize,
    /// First NVLink link: GPU g's up link is `nvlink + 2g`, its down link `nvlink + 2g + 1`.
    nvlink: Option<LinkId>,
    /// First PCIe link: NIC e's (endpoint e's) GPU-to-NIC link is `pcie + 2e`, the other way
    /// `pcie + 2e + 1`.
    pcie: Option<LinkId>,
}

impl Cluster {
    /// Puts servers on every endpoint of `fabric` (`server.nics` endpoints each).
    pub fn new(mut fabric: Fabric, server: Server) -> Result<Self, TopologyError> {
        if server.gpus == 0 {
            return Err(bad("gpus_per_server", "want at least 1"));
        }
        if server.nics == 0 || server.gpus % server.nics != 0 {
            return Err(bad(
                "nics_per_server",
                format!(
                    "{}: want a divisor of gpus_per_server ({}), at least 1",
                    server.nics, server.gpus
                ),
            ));
        }
        if let Some(r) = fabric.rails()
            && r != server.nics
        {
            return Err(bad(
                "nics_per_server",
                format!("{}: the rail-optimized fabric has {r} rails", server.nics),
            ));
        }
        if fabric.hosts() % server.nics != 0 {
            return Err(bad(
                "nics_per_server",
                format!(
                    "{} endpoints do not divide into servers of {} NICs",
                    fabric.hosts(),
                    server.nics
                ),
            ));
        }
        for (field, v) in [("nvlink", server.nvlink_bps), ("pcie", server.pcie_bps)] {
            if v.is_nan() || v <= 0.0 {
                return Err(bad(field, format!("{v} b/s: want a positive speed")));
            }
        }
        let servers = fabric.hosts() / server.nics;
        let nvlink = (server.gpus > 1).then(|| {
            let first = fabric.links();
            for _ in 0..servers * server.gpus * 2 {
                fabric.add_link(server.nvlink_bps, 0.0, LinkKind::Host);
            }
            first
        });
        let pcie = server.pcie_bps.is_finite().then(|| {
            let first = fabric.links();
            for _ in 0..fabric.hosts() * 2 {
                fabric.add_link(server.pcie_bps, 0.0, LinkKind::Host);
            }
            first
        });
        Ok(Self {
            fabric,
            server,
            servers,
            nvlink,
            pcie,
        })
    }

    /// A fabric of plain hosts (one GPU, one NIC each).
    pub fn plain(fabric: Fabric) -> Self {
        Self::new(fabric, Server::plain()).expect("a plain server fits every fabric")
    }

    /// Servers.
    pub fn servers(&self) -> usize {
        self.servers
    }

    /// GPUs (rank slots).
    pub fn gpus(&self) -> usize {
        self.servers * self.server.gpus
    }

    /// Link capacities, bits per second.
    pub fn capacity(&self) -> &[f64] {
        &self.fabric.capacity
    }

    /// The NIC (rail) GPU `g` of its server calls its own.
    pub fn own_nic(&self, g: usize) -> usize {
        g % self.server.gpus * self.server.nics / self.server.gpus
    }

    /// The links from GPU `a` to GPU `b` (global GPU numbers: server-major), appended to
    /// `path`. Between servers the message uses NIC `rail` (default: `b`'s own NIC) at both
    /// ends; `sport` is its QP's UDP source port, which ECMP hashes.
    pub fn route(
        &self,
        a: usize,
        b: usize,
        rail: Option<usize>,
        sport: u16,
        path: &mut Vec<LinkId>,
    ) {
        if a == b {
            return;
        }
        let g = self.server.gpus;
        let (sa, sb) = (a / g, b / g);
        if sa == sb {
            let nv = self
                .nvlink
                .expect("servers of more than one GPU have NVLink");
            path.push(nv + 2 * a);
            path.push(nv + 2 * b + 1);
            return;
        }
        let (ea, eb) = self.endpoints(a, b, rail);
        if let Some(p) = self.pcie {
            path.push(p + 2 * ea);
        }
        self.fabric.path_into(ea, eb, sport, path);
        if let Some(p) = self.pcie {
            path.push(p + 2 * eb + 1);
        }
    }

    /// The fabric endpoints (NIC ports) a message from GPU `a` to GPU `b` of another server
    /// leaves and enters by, on NIC `rail` (default: `b`'s own NIC).
    fn endpoints(&self, a: usize, b: usize, rail: Option<usize>) -> (usize, usize) {
        let g = self.server.gpus;
        let nic = rail.unwrap_or_else(|| self.own_nic(b)) % self.server.nics;
        (
            self.fabric.endpoint(a / g, nic, self.server.nics),
            self.fabric.endpoint(b / g, nic, self.server.nics),
        )
    }

    /// The spine (top-tier switch) a message from GPU `a` to GPU `b` with UDP source port
    /// `sport` turns around at, if it leaves its leaf.
    pub fn spine_of(&self, a: usize, b: usize, rail: Option<usize>, sport: u16) -> Option<usize> {
        if a / self.server.gpus == b / self.server.gpus {
            return None;
        }
        let (ea, eb) = self.endpoints(a, b, rail);
        self.fabric.spine_of(ea, eb, sport)
    }

    /// The links back along `path`, each crossed the other way (every cable, NVLink and
    /// PCIe link is made as a pair: one direction at an even id, the other at the next).
    pub fn reverse(&self, path: &[LinkId]) -> Vec<LinkId> {
        path.iter().rev().map(|&l| l ^ 1).collect()
    }

    /// Latency of a path.
    pub fn latency(&self, path: &[LinkId]) -> f64 {
        self.fabric.path_latency(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::LeafSpine;

    fn fabric(ports: usize) -> Fabric {
        LeafSpine {
            leaves: 2,
            hosts_per_leaf: ports,
            spines: 2,
            host_link_bps: 400e9,
            spine_link_bps: 400e9,
            link_latency_s: 1e-6,
        }
        .build()
        .unwrap()
    }

    #[test]
    fn gpus_share_nics_as_the_ratio_says() {
        let server = Server {
            gpus: 8,
            nics: 2,
            nvlink_bps: 3.6e12,
            pcie_bps: 512e9,
        };
        let c = Cluster::new(fabric(4), server).unwrap();
        assert_eq!((c.servers(), c.gpus()), (4, 32));
        assert_eq!(
            (0..8).map(|g| c.own_nic(g)).collect::<Vec<_>>(),
            [0, 0, 0, 0, 1, 1, 1, 1]
        );
        let mut p = Vec::new();
        c.route(0, 5, None, 1, &mut p);
        assert_eq!(p.len(), 2, "inside a server: NVLink up and down");
        assert!(p.iter().all(|&l| c.fabric.kind[l] == LinkKind::Host));
        p.clear();
        c.route(1, 31, Some(1), 1, &mut p);
        // PCIe, the fabric (server 0 and 3 are under different leaves), PCIe.
        assert_eq!(p.len(), 6, "{p:?}");
        assert_eq!(c.fabric.kind[p[0]], LinkKind::Host);
        assert_eq!(c.fabric.kind[p[1]], LinkKind::Edge);
        assert_eq!(c.fabric.kind[p[2]], LinkKind::Fabric);
    }

    #[test]
    fn a_path_reversed_is_the_way_back() {
        // One spine: every route is unique, so the way back is the route from b to a.
        let fabric = LeafSpine {
            leaves: 2,
            hosts_per_leaf: 4,
            spines: 1,
            host_link_bps: 400e9,
            spine_link_bps: 400e9,
            link_latency_s: 1e-6,
        }
        .build()
        .unwrap();
        let server = Server {
            gpus: 4,
            nics: 2,
            nvlink_bps: 3.6e12,
            pcie_bps: 512e9,
        };
        let c = Cluster::new(fabric, server).unwrap();
        for (a, b) in [(0, 1), (1, 6), (7, 2), (3, 12)] {
            let (mut there, mut back) = (Vec::new(), Vec::new());
            c.route(a, b, None, 7, &mut there);
            c.route(b, a, Some(c.own_nic(b)), 7, &mut back);
            assert_eq!(c.reverse(&there), back, "{a} -> {b}");
        }
    }

    #[test]
    fn servers_that_do_not_fit_are_named() {
        let s = |gpus, nics| Server {
            gpus,
            nics,
            nvlink_bps: 1e12,
            pcie_bps: 1e11,
        };
        let e = Cluster::new(fabric(4), s(8, 3)).unwrap_err();
        assert_eq!(e.field, "nics_per_server");
        let e = Cluster::new(fabric(3), s(8, 4)).unwrap_err();
        assert!(e.why.contains("do not divide"), "{e}");
        let e = Cluster::new(fabric(4), s(0, 1)).unwrap_err();
        assert_eq!(e.field, "gpus_per_server");
    }
}
