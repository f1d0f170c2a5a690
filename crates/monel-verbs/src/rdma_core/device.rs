//! The kernel's RDMA devices as Monel [`Device`]s: one per port with an Ethernet link layer
//! (RoCE), its GID table read with `ibv_query_gid` and typed from sysfs, its MTUs and state
//! from `ibv_query_port`.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::path::Path;

use monel_rc::Mtu;

use super::ffi;
use super::loader::Libibverbs;
use super::sysfs::{self, SYSFS_ROOT, SysPort};
use crate::device::{Device, GidEntry, Provider};
use monel_peer::gid::{Gid, GidKind};
use monel_peer::hca::{GidPolicy, HcaFilter, choose_gid};

/// Most GID entries a port's table is read to.
const MAX_GID_TBL: usize = 1024;

/// An open `ibv_context` of the device called `name`, or why not.
pub(crate) fn open_by_name(lib: &Libibverbs, name: &str) -> Result<*mut ffi::ibv_context, String> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below, once; the context opened
    // from one of its devices holds its own reference and outlives the list.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(format!(
            "ibv_get_device_list: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut out = Err(format!("libibverbs has no device {name}"));
    for i in 0..usize::try_from(n).unwrap_or(0).min(256) {
        // SAFETY: the list holds `n` device pointers; `i < n`.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: a device of the live list; its name is a NUL-terminated string it owns.
        let dn = unsafe { CStr::from_ptr((lib.get_device_name)(dev)) };
        if dn.to_bytes() == name.as_bytes() {
            // SAFETY: `dev` is a device of the live list.
            let ctx = unsafe { (lib.open_device)(dev) };
            out = if ctx.is_null() {
                Err(format!(
                    "ibv_open_device({name}): {}",
                    std::io::Error::last_os_error()
                ))
            } else {
                Ok(ctx)
            };
            break;
        }
    }
    // SAFETY: the list came from `ibv_get_device_list` and is freed once.
    unsafe { (lib.free_device_list)(list) };
    out
}

/// `IBV_MTU_*` to an MTU (256 for anything unknown).
pub(crate) fn mtu_of(code: u32) -> Mtu {
    match code {
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => Mtu::Mtu256,
    }
}

/// `ibv_query_port` on an open context.
pub(crate) fn query_port(
    lib: &Libibverbs,
    ctx: *mut ffi::ibv_context,
    port: u8,
) -> Result<ffi::ibv_port_attr, String> {
    let mut attr = ffi::ibv_port_attr::default();
    // SAFETY: `ctx` is open; `attr` is a complete, zeroed `ibv_port_attr` (the exported
    // symbol fills a prefix of it at most).
    let rc = unsafe { (lib.query_port)(ctx, port, &mut attr) };
    if rc != 0 {
        return Err(format!(
            "ibv_query_port(port {port}): {}",
            std::io::Error::from_raw_os_error(rc.abs())
        ));
    }
    Ok(attr)
}

/// Reads GID `index` of `port`.
pub(crate) fn query_gid(
    lib: &Libibverbs,
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: usize,
) -> Option<Gid> {
    let mut g = ffi::ibv_gid::default();
    // SAFETY: `ctx` is open and `g` is a valid `ibv_gid`.
    let rc = unsafe { (lib.query_gid)(ctx, port, index as i32, &mut g) };
    (rc == 0).then_some(Gid(g.raw))
}

fn ifindex(name: &str) -> u32 {
    nix::net::if_::if_nametoindex(name).unwrap_or(0)
}

fn node_guid(name: &str) -> u64 {
    std::fs::read_to_string(Path::new(SYSFS_ROOT).join(name).join("node_guid"))
        .ok()
        .and_then(|s| u64::from_str_radix(&s.trim().replace(':', ""), 16).ok())
        .unwrap_or(0)
}

/// The device for one port of an open context.
fn port_device(
    lib: &Libibverbs,
    ctx: *mut ffi::ibv_context,
    name: &str,
    sys: &SysPort,
) -> Option<Device> {
    let attr = query_port(lib, ctx, sys.num).ok()?;
    let len = usize::try_from(attr.gid_tbl_len)
        .unwrap_or(0)
        .min(MAX_GID_TBL);
    // The table up to its last filled entry (from sysfs, which also types them).
    let last = sys
        .gids
        .iter()
        .map(|g| usize::from(g.index) + 1)
        .max()
        .unwrap_or(0)
        .min(len);
    let ifname = sys
        .ndevs
        .iter()
        .find(|(i, _)| {
            sys.gids
                .iter()
                .any(|g| g.index == *i && g.kind == GidKind::RoceV2)
        })
        .or(sys.ndevs.first())
        .map(|(_, n)| n.clone())
        .unwrap_or_default();
    let gids = (0..last)
        .map(|i| {
            let slot = sys.gids.iter().find(|g| usize::from(g.index) == i);
            let nd = sys.ndevs.iter().find(|(j, _)| usize::from(*j) == i);
            match (slot, query_gid(lib, ctx, sys.num, i)) {
                (Some(s), Some(gid)) => GidEntry {
                    gid,
                    ifindex: nd.map_or(0, |(_, n)| ifindex(n)),
                    kind: s.kind,
                },
                _ => GidEntry {
                    gid: Gid::default(),
                    ifindex: 0,
                    kind: GidKind::RoceV2,
                },
            }
        })
        .collect();
    let link_mtu = std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(attr.active_mtu_bytes());
    Some(Device {
        name: if sys.num == 1 {
            name.to_string()
        } else {
            format!("{name}:{}", sys.num)
        },
        provider: Provider::RdmaCore {
            port: sys.num,
            max_mtu: mtu_of(attr.max_mtu),
            active_mtu: mtu_of(attr.active_mtu),
        },
        ifname,
        gids,
        link_mtu,
        up: attr.state == ffi::IBV_PORT_ACTIVE,
        node_guid: node_guid(name),
    })
}

impl ffi::ibv_port_attr {
    fn active_mtu_bytes(&self) -> u32 {
        mtu_of(self.active_mtu).bytes()
    }
}

/// Every RoCE port of every device libibverbs can open; the error says why there are none
/// (rdma-core not installed, no kernel RDMA).
pub fn list() -> Result<Vec<Device>, String> {
    let lib = Libibverbs::shared()?;
    let names = lib.device_names()?;
    let sys = sysfs::scan(Path::new(SYSFS_ROOT)).map_err(|e| format!("{SYSFS_ROOT}: {e}"))?;
    let mut out = Vec::new();
    for name in names {
        let Some(sd) = sys.iter().find(|d| d.name == name) else {
            continue;
        };
        let Ok(ctx) = open_by_name(lib, &name) else {
            continue;
        };
        for p in sd
            .ports
            .iter()
            .filter(|p| p.link_layer.eq_ignore_ascii_case("ethernet"))
        {
            out.extend(port_device(lib, ctx, &name, p));
        }
        // SAFETY: opened above and closed once; nothing made from it.
        unsafe { (lib.close_device)(ctx) };
    }
    Ok(out)
}

/// The first RoCE port `hca` admits (any, without a filter) that is up and holds a GID
/// `policy` takes, with why it was chosen: the device a job opens between hosts. The error
/// says why there is none.
pub fn first_usable(
    hca: Option<&HcaFilter>,
    policy: &GidPolicy,
) -> Result<(Device, String), String> {
    let mut skipped = Vec::new();
    for d in list()? {
        let Provider::RdmaCore { port, .. } = d.provider else {
            continue;
        };
        let base = d.name.split(':').next().unwrap_or(&d.name);
        if hca.is_some_and(|f| !f.admits(base, port)) {
            skipped.push(format!("{} (MONEL_IB_HCA)", d.name));
            continue;
        }
        if !d.up {
            skipped.push(format!("{} (port down)", d.name));
            continue;
        }
        if let Err(e) = choose_gid(&d.name, port, &d.gid_slots(), policy) {
            skipped.push(format!("{} ({e})", d.name));
            continue;
        }
        let why = match hca {
            Some(_) => format!("{} is the first MONEL_IB_HCA admits that is up", d.name),
            None => format!("{} is the first kernel RDMA device that is up", d.name),
        };
        return Ok((d, why));
    }
    Err(if skipped.is_empty() {
        "no kernel RDMA device".into()
    } else {
        format!("no usable kernel RDMA device: {}", skipped.join(", "))
    })
}
