//! The kernel's RDMA devices as `/sys/class/infiniband` shows them: ports, their state and
//! link layer, and GID tables with each entry's kind and network device (what NCCL and
//! rdma-core read to choose a GID). Read-only; every count is bounded.

use std::fs;
use std::io;
use std::path::Path;

use monel_peer::gid::{Gid, GidKind, GidSlot};

/// Where the kernel lists RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// Most devices, ports per device and GID entries per port read.
const MAX_DEVICES: usize = 256;
const MAX_PORTS: usize = 64;
const MAX_GIDS: usize = 4096;

/// One port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysPort {
    /// Its number (from 1).
    pub num: u8,
    /// `ACTIVE`, `DOWN`, ... (the kernel's word, without its number).
    pub state: String,
    /// `LinkUp`, `Disabled`, ...
    pub phys_state: String,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
    /// The GID table's filled entries.
    pub gids: Vec<GidSlot>,
    /// Each filled entry's network device (RoCE), by GID index.
    pub ndevs: Vec<(u16, String)>,
}

/// One device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysDevice {
    /// Its name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Its ports, by number.
    pub ports: Vec<SysPort>,
}

fn text(p: &Path) -> Option<String> {
    let s = fs::read_to_string(p).ok()?;
    Some(s.trim().to_string())
}

/// `"4: ACTIVE"` to `"ACTIVE"`.
fn word(s: Option<String>) -> String {
    s.map(|s| match s.split_once(": ") {
        Some((_, w)) => w.to_string(),
        None => s,
    })
    .unwrap_or_default()
}

fn parse_gid(s: &str) -> Option<Gid> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Gid(g))
}

/// Reads one port's directory.
fn read_port(dir: &Path, num: u8) -> SysPort {
    let link_layer = text(&dir.join("link_layer")).unwrap_or_default();
    let mut gids = Vec::new();
    let mut ndevs = Vec::new();
    let mut indices: Vec<u16> = fs::read_dir(dir.join("gids"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .take(MAX_GIDS)
                .collect()
        })
        .unwrap_or_default();
    indices.sort_unstable();
    for i in indices {
        let Some(gid) = text(&dir.join(format!("gids/{i}"))).and_then(|s| parse_gid(&s)) else {
            continue;
        };
        if gid.0 == [0; 16] {
            continue;
        }
        // An entry the kernel has no type for is not usable (it reads as an error).
        let Some(kind) = text(&dir.join(format!("gid_attrs/types/{i}")))
            .and_then(|t| GidKind::from_sysfs(&t, &link_layer))
        else {
            continue;
        };
        gids.push(GidSlot {
            index: i,
            gid,
            kind,
        });
        if let Some(nd) = text(&dir.join(format!("gid_attrs/ndevs/{i}"))) {
            ndevs.push((i, nd));
        }
    }
    SysPort {
        num,
        state: word(text(&dir.join("state"))),
        phys_state: word(text(&dir.join("phys_state"))),
        link_layer,
        gids,
        ndevs,
    }
}

/// GID entry `index` of port `port` of device `dev` under `root` now: its GID, kind and
/// network device (`None` for an unused or untyped entry).
pub fn read_gid(root: &Path, dev: &str, port: u8, index: u16) -> Option<(GidSlot, Option<String>)> {
    let dir = root.join(dev).join(format!("ports/{port}"));
    let link_layer = text(&dir.join("link_layer")).unwrap_or_default();
    let gid = text(&dir.join(format!("gids/{index}"))).and_then(|s| parse_gid(&s))?;
    if gid.0 == [0; 16] {
        return None;
    }
    let kind = text(&dir.join(format!("gid_attrs/types/{index}")))
        .and_then(|t| GidKind::from_sysfs(&t, &link_layer))?;
    let ndev = text(&dir.join(format!("gid_attrs/ndevs/{index}")));
    Some((GidSlot { index, gid, kind }, ndev))
}

/// Every device under `root` (normally [`SYSFS_ROOT`]), by name; an empty list when the
/// directory is missing (no RDMA in this kernel).
pub fn scan(root: &Path) -> io::Result<Vec<SysDevice>> {
    let rd = match fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .take(MAX_DEVICES)
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let pdir = root.join(&name).join("ports");
        let mut nums: Vec<u8> = fs::read_dir(&pdir)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .take(MAX_PORTS)
                    .collect()
            })
            .unwrap_or_default();
        nums.sort_unstable();
        let ports = nums
            .into_iter()
            .map(|n| read_port(&pdir.join(n.to_string()), n))
            .collect();
        out.push(SysDevice { name, ports });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_parse_as_the_kernel_prints_them() {
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:0a4d:0002").unwrap();
        assert_eq!(g.to_ip(), "10.77.0.2".parse::<std::net::IpAddr>().unwrap());
        assert!(parse_gid("fe80::1").is_none());
        assert!(parse_gid("zz00:0000:0000:0000:0000:ffff:0a4d:0002").is_none());
        assert_eq!(word(Some("4: ACTIVE".into())), "ACTIVE");
        assert!(
            scan(Path::new("/nonexistent/infiniband"))
                .unwrap()
                .is_empty()
        );
    }
}
