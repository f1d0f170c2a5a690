//! GIDs: the 16-byte addresses of RoCE ports (an IPv4 address is `::ffff:a.b.c.d`), what kind
//! each table entry is, and an entry with its index, as device listings and the GID choice
//! share them.

use core::fmt;
use std::net::IpAddr;

use monel_wire::IpAddress;

/// A 16-byte GID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4 becomes `::ffff:a.b.c.d`).
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => Self(IpAddress::V4(a.octets()).to_gid()),
            IpAddr::V6(a) => Self(a.octets()),
        }
    }
    /// The IP address this GID stands for (rxe's `rdma_gid2ip`).
    pub fn to_ip(self) -> IpAddr {
        IpAddress::from_gid(self.0).into()
    }
    /// The GID as rdma-core's pingpong puts it on the wire: 32 lowercase hex digits.
    pub fn to_wire_hex(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    /// Parses 32 hex digits (the inverse of [`to_wire_hex`](Self::to_wire_hex)).
    pub fn from_wire_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut g = [0u8; 16];
        for (i, b) in g.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(g))
    }
    /// True if the interface ID (last 8 bytes) is non-zero, i.e. the GID is usable in a GRH.
    pub fn is_global(self) -> bool {
        self.0[8..].iter().any(|&b| b != 0)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", c[0], c[1])?;
        }
        Ok(())
    }
}
impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// What kind of address a GID entry is, as the kernel says (`gid_attrs/types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand (`IB/RoCE v1` on an InfiniBand port).
    Ib,
    /// RoCE v1 (`IB/RoCE v1` on an Ethernet port).
    RoceV1,
    /// RoCE v2 (`RoCE v2`).
    RoceV2,
}

impl GidKind {
    /// The kernel's words for it on a port whose link layer is `link_layer`.
    pub fn from_sysfs(text: &str, link_layer: &str) -> Option<Self> {
        match text.trim() {
            "RoCE v2" => Some(Self::RoceV2),
            "IB/RoCE v1" if link_layer.trim().eq_ignore_ascii_case("ethernet") => {
                Some(Self::RoceV1)
            }
            "IB/RoCE v1" => Some(Self::Ib),
            _ => None,
        }
    }
}

impl std::fmt::Display for GidKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ib => "IB",
            Self::RoceV1 => "RoCE v1",
            Self::RoceV2 => "RoCE v2",
        })
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidSlot {
    /// Its index (`ibv_query_gid`'s).
    pub index: u16,
    /// The GID.
    pub gid: Gid,
    /// Its kind.
    pub kind: GidKind,
}
