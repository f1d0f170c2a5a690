//! Which RDMA devices, ports and GIDs to use, as NCCL users expect: `MONEL_IB_HCA` in
//! NCCL's syntax, and the automatic GID choice (`MONEL_IB_GID_INDEX`,
//! `MONEL_IB_ROCE_VERSION_NUM`, `MONEL_IB_ADDR_FAMILY`, `MONEL_IB_ADDR_RANGE`), each
//! `NCCL_*` spelling accepted as an alias. Pure: no I/O; every choice comes with its reason.

use std::net::IpAddr;

use crate::gid::Gid;
pub use crate::gid::{GidKind, GidSlot};

/// `MONEL_IB_HCA`: which devices (and ports) to use.
///
/// NCCL's syntax: a comma list of `name` or `name:port`; a name is a prefix (`mlx5` takes
/// `mlx5_0` and `mlx5_1`) unless the list starts with `=` (exact names); a list that starts
/// with `^` (or `^=`) names the devices to leave out instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    items: Vec<(String, Option<u8>)>,
}

impl HcaFilter {
    /// Parses a `MONEL_IB_HCA` value.
    pub fn parse(v: &str) -> Result<Self, String> {
        let mut rest = v.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let mut items = Vec::new();
        for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, port) = match part.split_once(':') {
                Some((n, p)) => {
                    let port =
                        p.parse::<u8>().ok().filter(|&p| p > 0).ok_or_else(|| {
                            format!("{v:?}: port {p:?} in {part:?} is not 1..=255")
                        })?;
                    (n, Some(port))
                }
                None => (part, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("{v:?}: {name:?} is not a device name"));
            }
            items.push((name.to_string(), port));
        }
        if items.is_empty() {
            return Err(format!("{v:?} names no device"));
        }
        Ok(Self {
            exclude,
            exact,
            items,
        })
    }

    fn names(&self, dev: &str, port: u8) -> bool {
        self.items.iter().any(|(n, p)| {
            let name = if self.exact {
                dev == n
            } else {
                dev.starts_with(n.as_str())
            };
            name && p.is_none_or(|p| p == port)
        })
    }

    /// Whether port `port` of device `dev` may be used.
    pub fn admits(&self, dev: &str, port: u8) -> bool {
        self.names(dev, port) != self.exclude
    }
}

/// Address family of a GID (`MONEL_IB_ADDR_FAMILY`: `AF_INET` or `AF_INET6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 (an IPv4-mapped GID).
    V4,
    /// IPv6.
    V6,
}

/// How the GID is chosen.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GidPolicy {
    /// A fixed index (`MONEL_IB_GID_INDEX`); `None`: automatic.
    pub index: Option<u16>,
    /// RoCE version wanted (`MONEL_IB_ROCE_VERSION_NUM`, 1 or 2; default 2).
    pub roce_version: Option<u8>,
    /// Family wanted (`MONEL_IB_ADDR_FAMILY`); `None`: IPv4 first, IPv6 when none.
    pub family: Option<Family>,
    /// Only addresses in this prefix (`MONEL_IB_ADDR_RANGE`, `ADDR/LEN`).
    pub range: Option<(IpAddr, u8)>,
}

/// Looks a variable up by its `MONEL_` name, then by its `NCCL_` alias; says which it took.
pub fn lookup(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<(String, &'static str)> {
    let monel = format!("MONEL_{name}");
    if let Some(v) = env(&monel) {
        return Some((v, "MONEL"));
    }
    env(&format!("NCCL_{name}")).map(|v| (v, "NCCL"))
}

fn parse_range(v: &str) -> Result<(IpAddr, u8), String> {
    let (a, l) = v
        .split_once('/')
        .ok_or_else(|| format!("{v:?}: want ADDRESS/PREFIX_LENGTH"))?;
    let ip: IpAddr = a
        .parse()
        .map_err(|_| format!("{v:?}: {a:?} is not an address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = l
        .parse::<u8>()
        .ok()
        .filter(|&l| l <= max)
        .ok_or_else(|| format!("{v:?}: prefix length {l:?} is not 0..={max}"))?;
    Ok((ip, len))
}

impl GidPolicy {
    /// The policy the `MONEL_IB_*` variables (or their `NCCL_IB_*` aliases) ask for, with a
    /// note for each alias used. A malformed value is an error naming the variable.
    pub fn from_vars(env: &dyn Fn(&str) -> Option<String>) -> Result<(Self, Vec<String>), String> {
        let mut p = Self::default();
        let mut notes = Vec::new();
        let mut take = |name: &str| {
            lookup(env, name).map(|(v, from)| {
                if from == "NCCL" {
                    notes.push(format!("NCCL_{name}={v} read as MONEL_{name}"));
                }
                (v, format!("{from}_{name}"))
            })
        };
        if let Some((v, var)) = take("IB_GID_INDEX") {
            let i: i64 = v
                .trim()
                .parse()
                .map_err(|_| format!("{var}={v:?}: want an index, or -1 for automatic"))?;
            p.index = match i {
                -1 => None,
                0..=65535 => Some(i as u16),
                _ => return Err(format!("{var}={v:?}: want 0..=65535, or -1")),
            };
        }
        if let Some((v, var)) = take("IB_ROCE_VERSION_NUM") {
            p.roce_version = match v.trim() {
                "1" => Some(1),
                "2" => Some(2),
                _ => return Err(format!("{var}={v:?}: want 1 or 2")),
            };
        }
        if let Some((v, var)) = take("IB_ADDR_FAMILY") {
            p.family = match v.trim() {
                "AF_INET" => Some(Family::V4),
                "AF_INET6" => Some(Family::V6),
                _ => return Err(format!("{var}={v:?}: want AF_INET or AF_INET6")),
            };
        }
        if let Some((v, var)) = take("IB_ADDR_RANGE") {
            p.range = Some(parse_range(v.trim()).map_err(|e| format!("{var}: {e}"))?);
        }
        Ok((p, notes))
    }
}

/// The family of a GID: IPv4-mapped (`::ffff:a.b.c.d`) or IPv6.
pub fn family_of(g: Gid) -> Family {
    match g.to_ip() {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    }
}

fn in_range(ip: IpAddr, (net, len): (IpAddr, u8)) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v) if v.segments()[0] & 0xffc0 == 0xfe80)
}

/// Picks the GID of `table` (port `port` of `dev`) that `p` asks for: the fixed index when
/// set (it must exist and hold a GID of the wanted RoCE version), else the first RoCE v2
/// entry (or v1, as asked) of the wanted family in the range, IPv4 before IPv6 and global
/// before link-local when the family is not fixed. Returns the entry and the reason in
/// words; an error names the device and what its table holds.
pub fn choose_gid(
    dev: &str,
    port: u8,
    table: &[GidSlot],
    p: &GidPolicy,
) -> Result<(GidSlot, String), String> {
    let held = || {
        let mut s: Vec<String> = table
            .iter()
            .filter(|e| e.gid.0 != [0; 16])
            .map(|e| format!("{}: {} {}", e.index, e.kind, e.gid.to_ip()))
            .collect();
        if s.is_empty() {
            s.push("no GID yet (is the interface up, with an address?)".into());
        }
        s.join(", ")
    };
    let want = match p.roce_version.unwrap_or(2) {
        1 => GidKind::RoceV1,
        _ => GidKind::RoceV2,
    };
    let fits_kind = |e: &GidSlot| e.kind == want || e.kind == GidKind::Ib;
    if let Some(i) = p.index {
        let Some(e) = table.iter().find(|e| e.index == i && e.gid.0 != [0; 16]) else {
            return Err(format!(
                "{dev} port {port} has no GID at index {i} (MONEL_IB_GID_INDEX); it holds {}",
                held()
            ));
        };
        if !fits_kind(e) {
            return Err(format!(
                "{dev} port {port} GID {i} is {}, not {want} (MONEL_IB_ROCE_VERSION_NUM); it holds {}",
                e.kind,
                held()
            ));
        }
        return Ok((*e, format!("index {i}, as MONEL_IB_GID_INDEX says")));
    }
    let candidates: Vec<&GidSlot> = table
        .iter()
        .filter(|e| e.gid.0 != [0; 16] && fits_kind(e))
        .filter(|e| p.range.is_none_or(|r| in_range(e.gid.to_ip(), r)))
        .collect();
    let order = |e: &&GidSlot| {
        let fam = family_of(e.gid);
        let family_rank = match p.family {
            Some(f) if f == fam => 0,
            Some(_) => 9,
            None if fam == Family::V4 => 0,
            None => 1,
        };
        (family_rank, u8::from(link_local(e.gid.to_ip())), e.index)
    };
    let best = candidates
        .iter()
        .filter(|e| p.family.is_none_or(|f| f == family_of(e.gid)))
        .min_by_key(|e| order(e));
    match best {
        Some(e) => {
            let fam = match family_of(e.gid) {
                Family::V4 => "IPv4",
                Family::V6 => "IPv6",
            };
            let mut why = format!("index {}: the first {} {fam} GID", e.index, e.kind);
            if p.family.is_none() && family_of(e.gid) == Family::V6 {
                why.push_str(" (no IPv4 one)");
            }
            if let Some((net, len)) = p.range {
                why.push_str(&format!(" in {net}/{len}"));
            }
            Ok((**e, why))
        }
        None => Err(format!(
            "{dev} port {port} has no {want} GID{}{}; it holds {}",
            match p.family {
                Some(Family::V4) => " of family AF_INET",
                Some(Family::V6) => " of family AF_INET6",
                None => "",
            },
            p.range
                .map_or(String::new(), |(n, l)| format!(" in {n}/{l}")),
            held()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_lists_follow_ncclsyntax() {
        let f = HcaFilter::parse("mlx5").unwrap();
        assert!(f.admits("mlx5_0", 1) && f.admits("mlx5_1", 2) && !f.admits("rxe0", 1));
        let f = HcaFilter::parse("=mlx5_1").unwrap();
        assert!(f.admits("mlx5_1", 1) && !f.admits("mlx5_10", 1));
        let f = HcaFilter::parse("mlx5_0:1,rxe").unwrap();
        assert!(f.admits("mlx5_0", 1) && !f.admits("mlx5_0", 2) && f.admits("rxe0", 3));
        let f = HcaFilter::parse("^mlx5_1").unwrap();
        assert!(f.admits("mlx5_0", 1) && !f.admits("mlx5_1", 1) && !f.admits("mlx5_10", 1));
        let f = HcaFilter::parse("^=mlx5_1").unwrap();
        assert!(!f.admits("mlx5_1", 1) && f.admits("mlx5_10", 1));
        let f = HcaFilter::parse("^rxe0:1").unwrap();
        assert!(!f.admits("rxe0", 1) && f.admits("rxe0", 2));
        for bad in ["", "^", "mlx5:0", "mlx5:x", "ml x", "=,"] {
            assert!(HcaFilter::parse(bad).is_err(), "{bad:?}");
        }
    }

    fn slot(index: u16, ip: &str, kind: GidKind) -> GidSlot {
        GidSlot {
            index,
            gid: Gid::from_ip(ip.parse().unwrap()),
            kind,
        }
    }

    /// A table as rxe and ConnectX fill it: the link-local GID, then each address as RoCE v1
    /// and v2, IPv6 after IPv4.
    fn table() -> Vec<GidSlot> {
        vec![
            slot(0, "fe80::5054:ff:fe4d:2", GidKind::RoceV1),
            slot(1, "fe80::5054:ff:fe4d:2", GidKind::RoceV2),
            slot(2, "10.77.0.2", GidKind::RoceV1),
            slot(3, "10.77.0.2", GidKind::RoceV2),
            slot(4, "fd00::2", GidKind::RoceV1),
            slot(5, "fd00::2", GidKind::RoceV2),
        ]
    }

    #[test]
    fn the_automatic_gid_is_roce_v2_ipv4_first_and_each_setting_moves_it() {
        let auto = GidPolicy::default();
        let (e, why) = choose_gid("rxe0", 1, &table(), &auto).unwrap();
        assert_eq!(e.index, 3, "{why}");
        assert!(why.contains("RoCE v2 IPv4"), "{why}");
        let v6 = GidPolicy {
            family: Some(Family::V6),
            ..GidPolicy::default()
        };
        assert_eq!(choose_gid("rxe0", 1, &table(), &v6).unwrap().0.index, 5);
        let v1 = GidPolicy {
            roce_version: Some(1),
            ..GidPolicy::default()
        };
        assert_eq!(choose_gid("rxe0", 1, &table(), &v1).unwrap().0.index, 2);
        let range = GidPolicy {
            range: Some(("fd00::".parse().unwrap(), 16)),
            ..GidPolicy::default()
        };
        assert_eq!(choose_gid("rxe0", 1, &table(), &range).unwrap().0.index, 5);
        // Only IPv6 GIDs: the global one, before link-local.
        let v6only: Vec<GidSlot> = table()
            .into_iter()
            .filter(|e| family_of(e.gid) == Family::V6)
            .collect();
        let (e, why) = choose_gid("rxe0", 1, &v6only, &auto).unwrap();
        assert_eq!(e.index, 5);
        assert!(why.contains("no IPv4 one"), "{why}");
        // A fixed index: taken if it holds the right kind; a typed error otherwise.
        let fixed = |i| GidPolicy {
            index: Some(i),
            ..GidPolicy::default()
        };
        assert_eq!(
            choose_gid("rxe0", 1, &table(), &fixed(1)).unwrap().0.index,
            1
        );
        let e = choose_gid("rxe0", 1, &table(), &fixed(2)).unwrap_err();
        assert!(
            e.contains("rxe0 port 1 GID 2 is RoCE v1, not RoCE v2"),
            "{e}"
        );
        assert!(e.contains("3: RoCE v2 10.77.0.2"), "{e}");
        let e = choose_gid("rxe0", 1, &table(), &fixed(9)).unwrap_err();
        assert!(e.contains("no GID at index 9"), "{e}");
        // No GID yet (no carrier, a tentative address).
        let e = choose_gid("rxe0", 1, &[], &auto).unwrap_err();
        assert!(e.contains("no GID yet"), "{e}");
    }

    #[test]
    fn variables_and_their_nccl_aliases() {
        let env = |k: &str| match k {
            "NCCL_IB_GID_INDEX" => Some("3".to_string()),
            "MONEL_IB_ADDR_FAMILY" => Some("AF_INET6".to_string()),
            "NCCL_IB_ADDR_RANGE" => Some("10.0.0.0/8".to_string()),
            _ => None,
        };
        let (p, notes) = GidPolicy::from_vars(&env).unwrap();
        assert_eq!(p.index, Some(3));
        assert_eq!(p.family, Some(Family::V6));
        assert_eq!(p.range, Some(("10.0.0.0".parse().unwrap(), 8)));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("NCCL_IB_GID_INDEX=3 read as MONEL_IB_GID_INDEX"));
        for (k, v) in [
            ("MONEL_IB_GID_INDEX", "x"),
            ("MONEL_IB_ROCE_VERSION_NUM", "3"),
            ("MONEL_IB_ADDR_FAMILY", "inet"),
            ("MONEL_IB_ADDR_RANGE", "10.0.0.0/33"),
        ] {
            let e = GidPolicy::from_vars(&|q: &str| (q == k).then(|| v.to_string())).unwrap_err();
            assert!(e.contains(k), "{e}");
        }
        let (p, _) =
            GidPolicy::from_vars(&|q: &str| (q == "MONEL_IB_GID_INDEX").then(|| "-1".to_string()))
                .unwrap();
        assert_eq!(p.index, None);
    }
}
