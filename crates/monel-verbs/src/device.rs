//! Devices, ports and GID tables: one soft device per IP interface, or one bound to an address
//! the user names. GIDs follow rxe: the IPv6 link-local GID first, then one IPv4-mapped GID
//! per IPv4 address, then the other IPv6 addresses; all are RoCE v2.

use std::net::IpAddr;

use monel_rc::Mtu;

use crate::error::{ErrorKind, Result, VerbsError};
pub use monel_peer::gid::Gid;
use monel_peer::gid::{GidKind, GidSlot};

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Interface index (scope of link-local IPv6 addresses).
    pub ifindex: u32,
    /// Its kind (soft devices: always RoCE v2).
    pub kind: GidKind,
}

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// The interface is down.
    Down = 1,
    /// The interface is up and the port can carry traffic.
    Active = 4,
}

/// Port attributes (`ibv_port_attr`, the RoCE-relevant part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU usable on this link: the largest IB MTU that fits the IP MTU minus 80 bytes of
    /// headers (rxe's rule: 1500 gives 1024).
    pub active_mtu: Mtu,
    /// The interface's IP MTU.
    pub link_mtu: u32,
    /// Number of GID entries.
    pub gid_tbl_len: u32,
}

/// Which provider drives a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Monel's soft RNIC: RoCEv2 datagrams on the interface's UDP sockets.
    Soft,
    /// One port of a kernel RDMA device, through rdma-core's libibverbs (a hardware NIC, or
    /// Linux rxe).
    RdmaCore {
        /// The port (from 1).
        port: u8,
        /// Its largest MTU.
        max_mtu: Mtu,
        /// The MTU it uses now.
        active_mtu: Mtu,
    },
}

/// An RDMA device: a soft one on an IP interface (or one address of it), driven by Monel,
/// or one port of a kernel RDMA device ([`Provider::RdmaCore`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Device name (`monel_<interface>` for soft devices; the kernel's, `mlx5_0` or `rxe0`,
    /// for rdma-core ones, with `:port` after it for ports other than 1).
    pub name: String,
    /// Which provider drives it.
    pub provider: Provider,
    /// The interface it sits on (for rdma-core devices: the network device of its GIDs).
    pub ifname: String,
    /// GID table (for rdma-core devices, by index: unused entries are zero).
    pub gids: Vec<GidEntry>,
    /// Interface MTU.
    pub link_mtu: u32,
    /// True if the interface is up.
    pub up: bool,
    /// Node GUID (EUI-64 from the MAC, or from the first address where there is no MAC).
    pub node_guid: u64,
}

/// The largest IB MTU that fits an IP MTU, as rxe computes `active_mtu`.
pub fn active_mtu_for(link_mtu: u32) -> Mtu {
    let room = link_mtu.saturating_sub(80);
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

fn sysfs(ifname: &str, leaf: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/{leaf}"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn guid_from(ifname: &str, first: Option<IpAddr>) -> u64 {
    let mac: Vec<u8> = sysfs(ifname, "address")
        .unwrap_or_default()
        .split(':')
        .filter_map(|h| u8::from_str_radix(h, 16).ok())
        .collect();
    if mac.len() == 6 && mac.iter().any(|&b| b != 0) {
        u64::from_be_bytes([
            mac[0] ^ 2,
            mac[1],
            mac[2],
            0xff,
            0xfe,
            mac[3],
            mac[4],
            mac[5],
        ])
    } else {
        let g = first.map(Gid::from_ip).unwrap_or_default().0;
        u64::from_be_bytes([g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]])
    }
}

/// An interface as `getifaddrs` shows it: its addresses (tentative IPv6 ones included) with
/// its index, and whether its link works.
pub(crate) struct Interface {
    pub(crate) name: String,
    pub(crate) addrs: Vec<(IpAddr, u32)>,
    /// Up and running (carrier), as rxe's port is active on such a net device. From the
    /// interface flags rather than sysfs, which shows the namespace it was mounted in.
    pub(crate) up: bool,
}

/// Every interface, with or without addresses, in the order the kernel lists them.
pub(crate) fn interfaces() -> Result<Vec<Interface>> {
    use nix::net::if_::InterfaceFlags as F;
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| VerbsError::io("ibv_get_device_list", e))?;
    let mut out: Vec<Interface> = Vec::new();
    for a in addrs {
        let i = match out.iter().position(|i| i.name == a.interface_name) {
            Some(i) => i,
            None => {
                out.push(Interface {
                    name: a.interface_name.clone(),
                    addrs: Vec::new(),
                    up: a.flags.contains(F::IFF_UP) && a.flags.contains(F::IFF_RUNNING),
                });
                out.len() - 1
            }
        };
        let Some(sa) = a.address else { continue };
        let ip = if let Some(v4) = sa.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let ifindex = nix::net::if_::if_nametoindex(a.interface_name.as_str()).unwrap_or(0);
        out[i].addrs.push((ip, ifindex));
    }
    Ok(out)
}

/// The addresses interface `ifname` holds now (none if it has none or does not exist).
pub(crate) fn interface_addresses(ifname: &str) -> Result<Vec<(IpAddr, u32)>> {
    Ok(interfaces()?
        .into_iter()
        .find(|i| i.name == ifname)
        .map(|i| i.addrs)
        .unwrap_or_default())
}

/// One soft device per IP interface that has addresses.
pub fn soft_devices() -> Result<Vec<Device>> {
    Ok(interfaces()?
        .into_iter()
        .filter(|i| !i.addrs.is_empty())
        .map(|i| build(&i.name, i.addrs, i.up))
        .collect())
}

/// The soft device of interface `ifname` even while it has no address (its GID table then
/// starts empty and fills as addresses appear, see [`crate::Context::query_gid`]); `None`
/// if there is no such interface.
pub(crate) fn soft_device_of(ifname: &str) -> Result<Option<Device>> {
    Ok(interfaces()?
        .into_iter()
        .find(|i| i.name == ifname)
        .map(|i| build(&i.name, i.addrs, i.up)))
}

/// The local address the kernel would send from towards `to` (the route's source). A
/// connected UDP socket asks the kernel for the route and sends nothing.
pub fn route_source(to: std::net::SocketAddr) -> std::io::Result<IpAddr> {
    let any = match to {
        std::net::SocketAddr::V4(_) => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        std::net::SocketAddr::V6(_) => std::net::SocketAddr::from(([0u16; 8], 0)),
    };
    let u = std::net::UdpSocket::bind(any)?;
    u.connect(to)?;
    Ok(u.local_addr()?.ip())
}

/// True for IPv6 link-local addresses (fe80::/10), which need a scope when bound or sent to.
pub(crate) fn is_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
}

/// rxe's order of a GID table: link-local IPv6 first, then IPv4 (as mapped GIDs), then
/// other IPv6.
pub(crate) fn rxe_order(ip: &IpAddr) -> u8 {
    match ip {
        _ if is_link_local(ip) => 0,
        IpAddr::V4(_) => 1,
        IpAddr::V6(_) => 2,
    }
}

fn build(ifname: &str, mut ips: Vec<(IpAddr, u32)>, up: bool) -> Device {
    ips.sort_by_key(|(ip, _)| rxe_order(ip));
    let link_mtu = sysfs(ifname, "mtu")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    Device {
        name: format!("monel_{ifname}"),
        provider: Provider::Soft,
        ifname: ifname.to_string(),
        node_guid: guid_from(ifname, ips.first().map(|x| x.0)),
        gids: ips
            .into_iter()
            .map(|(ip, ifindex)| GidEntry {
                gid: Gid::from_ip(ip),
                ifindex,
                kind: GidKind::RoceV2,
            })
            .collect(),
        link_mtu,
        up,
    }
}

impl Device {
    /// A device bound to one address: its GID table has that address alone (index 0). The
    /// interface holding the address supplies the MTU; an address on no interface (any of
    /// 127.0.0.0/8 counts as `lo`) is refused.
    pub fn bind(ip: IpAddr) -> Result<Self> {
        let all = interfaces()?;
        let on_if = all.iter().find(|i| i.addrs.iter().any(|&(a, _)| a == ip));
        let iface = on_if
            .or_else(|| match ip {
                IpAddr::V4(a) if a.is_loopback() => all.iter().find(|i| i.name == "lo"),
                _ => None,
            })
            .ok_or_else(|| {
                VerbsError::new(
                    "ibv_open_device",
                    ErrorKind::NotFound(format!("no interface holds address {ip}")),
                )
            })?;
        let ifindex = nix::net::if_::if_nametoindex(iface.name.as_str()).unwrap_or(0);
        let mut d = build(&iface.name, vec![(ip, ifindex)], iface.up);
        d.name = format!("monel_{}_{ip}", iface.name);
        Ok(d)
    }

    /// True for a soft device on a whole interface, whose GID table follows the interface's
    /// addresses once open (a device bound to one address keeps that one).
    pub fn follows_interface(&self) -> bool {
        self.provider == Provider::Soft && self.name == format!("monel_{}", self.ifname)
    }

    /// Reads a soft device's link state and MTU again from the interface.
    pub(crate) fn refresh_link(&mut self) {
        if self.provider != Provider::Soft {
            return;
        }
        if let Some(m) = sysfs(&self.ifname, "mtu").and_then(|s| s.parse().ok()) {
            self.link_mtu = m;
        }
        if let Ok(all) = interfaces() {
            self.up = all.iter().any(|i| i.name == self.ifname && i.up);
        }
    }

    /// True for a kernel RDMA device driven through rdma-core.
    pub fn is_rdma_core(&self) -> bool {
        matches!(self.provider, Provider::RdmaCore { .. })
    }

    /// The port's attributes, as of listing ([`crate::Context::query_port`] reads them now).
    pub fn port_attr(&self) -> PortAttr {
        let (max_mtu, active_mtu) = match self.provider {
            Provider::Soft => (Mtu::Mtu4096, active_mtu_for(self.link_mtu)),
            Provider::RdmaCore {
                max_mtu,
                active_mtu,
                ..
            } => (max_mtu, active_mtu),
        };
        PortAttr {
            state: if self.up {
                PortState::Active
            } else {
                PortState::Down
            },
            max_mtu,
            active_mtu,
            link_mtu: self.link_mtu,
            gid_tbl_len: self.gids.len() as u32,
        }
    }

    /// The GID at `index`, as of listing ([`crate::Context::query_gid`] reads the table now).
    pub fn gid(&self, index: u8) -> Result<GidEntry> {
        self.gids.get(usize::from(index)).copied().ok_or_else(|| {
            VerbsError::new(
                "ibv_query_gid",
                ErrorKind::NotFound(format!("GID index {index} (table has {})", self.gids.len())),
            )
        })
    }

    /// Index of the first IPv4-mapped RoCE v2 GID, which rdma-core tools use with `-g`.
    pub fn ipv4_gid_index(&self) -> Option<u8> {
        self.gids
            .iter()
            .position(|g| g.kind == GidKind::RoceV2 && g.gid.is_global() && g.gid.to_ip().is_ipv4())
            .and_then(|i| u8::try_from(i).ok())
    }

    /// The filled GID entries with their kinds, as [`monel_peer::hca::choose_gid`] takes them.
    pub fn gid_slots(&self) -> Vec<GidSlot> {
        self.gids
            .iter()
            .enumerate()
            .filter(|(_, g)| g.gid.0 != [0; 16])
            .map(|(i, g)| GidSlot {
                index: i as u16,
                gid: g.gid,
                kind: g.kind,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_rule_matches_rxe() {
        assert_eq!(active_mtu_for(1500), Mtu::Mtu1024);
        assert_eq!(active_mtu_for(4176), Mtu::Mtu4096);
        assert_eq!(active_mtu_for(4175), Mtu::Mtu2048);
        assert_eq!(active_mtu_for(65536), Mtu::Mtu4096);
        assert_eq!(active_mtu_for(300), Mtu::Mtu256);
    }

    #[test]
    fn gid_hex_round_trip() {
        let g = Gid::from_ip("10.77.0.3".parse().unwrap());
        assert_eq!(g.to_wire_hex(), "00000000000000000000ffff0a4d0003");
        assert_eq!(Gid::from_wire_hex(&g.to_wire_hex()), Some(g));
        assert_eq!(g.to_ip(), "10.77.0.3".parse::<IpAddr>().unwrap());
        assert!(g.is_global());
        assert_eq!(Gid::from_wire_hex("zz"), None);
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a4d:0003");
    }

    #[test]
    fn loopback_device_has_ipv4_gid() {
        let d = Device::by_name("lo").unwrap();
        let i = d.ipv4_gid_index().unwrap();
        assert_eq!(
            d.gid(i).unwrap().gid.to_ip(),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert!(d.gid(200).is_err());
        let b = Device::bind("127.0.0.9".parse().unwrap()).unwrap();
        assert_eq!(b.gids.len(), 1);
        assert_eq!(b.port_attr().active_mtu, Mtu::Mtu4096);
    }
}
