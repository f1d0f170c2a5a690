//! Pre-flight checks of this host before a job: the RDMA providers and devices, the GID each
//! port would use, the soft RNIC, locked memory and /dev/shm against what the ranks will
//! register and map, and the bootstrap's route. `monel doctor` runs them all; a communicator
//! runs the brief set ([`at_init`]) when `MONEL_DOCTOR=1`. Each check ends in a verdict in
//! words and, where something is wrong, the fix.

use std::path::Path;

use monel_peer::hca::{GidPolicy, HcaFilter, choose_gid, lookup};
use monel_verbs::rdma_core::{library_devices, sysfs};
use monel_verbs::{Context, ContextConfig, soft_devices};
use serde::Serialize;

use crate::error::{CclError, ErrorKind, Result};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing to do.
    Ok,
    /// A job runs, worse than it could.
    Warn,
    /// A job would not run.
    Fail,
}

impl Verdict {
    /// As the report prints it.
    pub fn word(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// One check.
#[derive(Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub check: &'static str,
    /// How it came out.
    pub verdict: Verdict,
    /// What was found, in words.
    pub detail: String,
    /// What to do about it, where something is wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// A check's outcome.
pub fn check(check: &'static str, verdict: Verdict, detail: String, fix: Option<&str>) -> Check {
    Check {
        check,
        verdict,
        detail,
        fix: fix.map(str::to_string),
    }
}

/// A set, non-empty environment variable.
pub fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
}

/// Whether libibverbs loads and lists the kernel's RDMA devices (`devs`, from sysfs).
pub fn providers(out: &mut Vec<Check>, devs: &[sysfs::SysDevice]) {
    match library_devices() {
        Ok(listed) => {
            let (verdict, detail) = match (&listed, devs.is_empty()) {
                (Ok(n), _) if !n.is_empty() => (
                    Verdict::Ok,
                    format!("libibverbs loaded; it lists {}", n.join(", ")),
                ),
                (Ok(_), true) | (Err(_), true) => (
                    Verdict::Ok,
                    format!(
                        "libibverbs loaded, no RDMA device ({}): the soft RNIC carries RDMA between hosts",
                        listed.err().unwrap_or_else(|| "none listed".into())
                    ),
                ),
                (r, false) => (
                    Verdict::Warn,
                    format!(
                        "the kernel has RDMA devices but libibverbs lists none ({}): a user-space provider is missing",
                        r.as_ref().err().cloned().unwrap_or_default()
                    ),
                ),
            };
            let fix = (verdict == Verdict::Warn)
                .then_some("install rdma-core's providers (Debian: ibverbs-providers)");
            out.push(check("providers", verdict, detail, fix));
        }
        Err(why) => {
            let verdict = if devs.is_empty() {
                Verdict::Ok
            } else {
                Verdict::Warn
            };
            out.push(check(
                "providers",
                verdict,
                format!("{why}; the soft RNIC carries RDMA between hosts"),
                (verdict == Verdict::Warn).then_some("install libibverbs1 (rdma-core)"),
            ));
        }
    }
    if !devs.is_empty() {
        out.push(open_check());
    }
}

/// Opens the first kernel RDMA port through libibverbs (context, PD, CQ), as a job would.
pub fn open_check() -> Check {
    let listed = match monel_verbs::rdma_core::device::list() {
        Ok(l) => l,
        Err(e) => {
            return check(
                "rdma-core",
                Verdict::Warn,
                format!("the kernel's RDMA devices cannot be listed: {e}"),
                Some("install rdma-core's libibverbs1 and ibverbs-providers"),
            );
        }
    };
    let Some(d) = listed.first() else {
        return check(
            "rdma-core",
            Verdict::Warn,
            "no RoCE port among the kernel's RDMA devices (InfiniBand ports are not driven yet)"
                .into(),
            None,
        );
    };
    let opened = Context::open(d, ContextConfig::default()).and_then(|c| {
        let _pd = c.alloc_pd();
        c.create_cq(16).map(|_| ())
    });
    match opened {
        Ok(()) => check(
            "rdma-core",
            Verdict::Ok,
            format!(
                "Monel opens {} through libibverbs (context, PD, CQ); collectives between hosts use it",
                d.name
            ),
            None,
        ),
        Err(e) => check(
            "rdma-core",
            Verdict::Fail,
            format!("{} does not open through libibverbs: {e}", d.name),
            Some("check /dev/infiniband permissions and the device's driver (ibv_devinfo)"),
        ),
    }
}

/// Each RDMA device's ports, the GID Monel would pick and why.
pub fn rdma_devices(out: &mut Vec<Check>, devs: &[sysfs::SysDevice]) {
    let hca = match lookup(&env, "IB_HCA") {
        Some((v, from)) => match HcaFilter::parse(&v) {
            Ok(f) => Some(f),
            Err(e) => {
                out.push(check(
                    "devices",
                    Verdict::Fail,
                    format!("{from}_IB_HCA: {e}"),
                    Some("write it as NCCL does: mlx5_0:1,mlx5_1 or ^mlx5_2 or =mlx5_0"),
                ));
                return;
            }
        },
        None => None,
    };
    let (policy, notes) = match GidPolicy::from_vars(&env) {
        Ok(p) => p,
        Err(e) => {
            out.push(check(
                "devices",
                Verdict::Fail,
                e,
                Some("fix or unset the variable"),
            ));
            return;
        }
    };
    if devs.is_empty() {
        out.push(check(
            "devices",
            Verdict::Ok,
            "no RDMA device in this kernel (nothing under /sys/class/infiniband)".into(),
            None,
        ));
        return;
    }
    for d in devs {
        for p in &d.ports {
            let name = format!("{} port {}", d.name, p.num);
            if hca.as_ref().is_some_and(|f| !f.admits(&d.name, p.num)) {
                out.push(check(
                    "devices",
                    Verdict::Ok,
                    format!("{name}: left out by MONEL_IB_HCA"),
                    None,
                ));
                continue;
            }
            let state = format!("{}, {}, {}", p.state, p.phys_state, p.link_layer);
            match choose_gid(&d.name, p.num, &p.gids, &policy) {
                Ok((g, why)) => {
                    let ndev = p
                        .ndevs
                        .iter()
                        .find(|(i, _)| *i == g.index)
                        .map_or(String::new(), |(_, n)| format!(" on {n}"));
                    let mut detail = format!(
                        "{name} ({state}): GID {} {} {}{ndev}, {why}",
                        g.index,
                        g.kind,
                        g.gid.to_ip()
                    );
                    for n in &notes {
                        detail.push_str(&format!("; {n}"));
                    }
                    let up = p.state == "ACTIVE";
                    out.push(check(
                        "devices",
                        if up { Verdict::Ok } else { Verdict::Warn },
                        detail,
                        (!up).then_some("bring the port's link up (ip link set DEV up)"),
                    ));
                }
                Err(e) => out.push(check(
                    "devices",
                    Verdict::Warn,
                    format!("{name} ({state}): {e}"),
                    Some("give the interface an address, or set MONEL_IB_GID_INDEX"),
                )),
            }
        }
    }
}

/// The soft RNIC's devices: interfaces that are up with an address.
pub fn soft_rnic(out: &mut Vec<Check>) {
    match soft_devices() {
        Ok(ds) => {
            let up: Vec<String> = ds
                .iter()
                .filter(|d| d.up && !d.gids.is_empty())
                .map(|d| {
                    format!(
                        "{} ({} GIDs, MTU {})",
                        d.name,
                        d.gids.len(),
                        d.port_attr().active_mtu.bytes()
                    )
                })
                .collect();
            let verdict = if up.is_empty() {
                Verdict::Fail
            } else {
                Verdict::Ok
            };
            out.push(check(
                "soft RNIC",
                verdict,
                if up.is_empty() {
                    "no interface is up with an address".into()
                } else {
                    format!("devices: {}", up.join(", "))
                },
                up.is_empty()
                    .then_some("bring an interface up with an IP address"),
            ));
        }
        Err(e) => out.push(check(
            "soft RNIC",
            Verdict::Fail,
            e.to_string(),
            Some("check the interfaces (ip addr)"),
        )),
    }
}

/// Locked memory against what a rank registers: a receive ring and a staging ring of
/// `ring` bytes per peer on another host (`remote`). `pins`: a hardware RDMA port will
/// carry them (it pins what it registers; the soft RNIC does not), so too low a limit
/// fails the job.
pub fn locked_memory(out: &mut Vec<Check>, ring: u64, remote: u64, pins: bool) {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};
    let c = match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) => {
            memlock_verdict((soft != RLIM_INFINITY).then_some(soft), ring, remote, pins)
        }
        Err(e) => check(
            "locked memory",
            Verdict::Warn,
            format!("getrlimit: {e}"),
            None,
        ),
    };
    out.push(c);
}

/// The locked-memory verdict for a limit (`None`: unlimited).
fn memlock_verdict(limit: Option<u64>, ring: u64, remote: u64, pins: bool) -> Check {
    let need = ring.saturating_mul(2).saturating_mul(remote);
    let whose = if pins {
        "a hardware RDMA port pins it"
    } else {
        "hardware NICs pin it; the soft RNIC, used here, does not"
    };
    let Some(limit) = limit else {
        return check(
            "locked memory",
            Verdict::Ok,
            format!(
                "unlimited (a rank registers about {} for {remote} peers on other hosts)",
                mib(need)
            ),
            None,
        );
    };
    let verdict = match (limit >= need, pins) {
        (true, _) => Verdict::Ok,
        (false, true) => Verdict::Fail,
        (false, false) => Verdict::Warn,
    };
    check(
        "locked memory",
        verdict,
        format!(
            "ulimit -l is {}; a rank registers about {} for {remote} peers on other hosts ({whose})",
            mib(limit),
            mib(need)
        ),
        (verdict != Verdict::Ok).then_some(
            "raise the limit: ulimit -l unlimited, or memlock in /etc/security/limits.conf",
        ),
    )
}

/// /dev/shm against the rings `local` ranks on this host map: a segment per pair, a ring
/// of `ring` bytes each way and a page of control.
pub fn shared_memory(out: &mut Vec<Check>, ring: u64, local: u64) {
    let l = local;
    // A segment per pair of local ranks: a ring each way and a page of control.
    let need =
        (l * l.saturating_sub(1) / 2).saturating_mul(ring.saturating_mul(2).saturating_add(8192));
    match nix::sys::statvfs::statvfs(Path::new("/dev/shm")) {
        Ok(s) => {
            let free = s.blocks_available() * s.fragment_size();
            let ok = free >= need;
            out.push(check(
                "/dev/shm",
                if ok { Verdict::Ok } else { Verdict::Fail },
                format!(
                    "{} free; {l} ranks on this host need {} of rings",
                    mib(free),
                    mib(need)
                ),
                (!ok).then_some(
                    "enlarge it (mount -o remount,size=2G /dev/shm; docker --shm-size) or lower MONEL_SHM_RING",
                ),
            ));
        }
        Err(e) => out.push(check(
            "/dev/shm",
            Verdict::Warn,
            format!("/dev/shm: {e}; ranks on one host will use TCP or the soft RNIC"),
            Some("mount a tmpfs at /dev/shm"),
        )),
    }
}

/// The interface the bootstrap would use: the route's source towards the rendezvous.
pub fn bootstrap(out: &mut Vec<Check>) {
    let root = env("MASTER_ADDR").map(|h| (h, env("MASTER_PORT").unwrap_or_else(|| "0".into())));
    let Some((host, port)) = root else {
        out.push(check(
            "bootstrap",
            Verdict::Ok,
            "MASTER_ADDR is not set: set it (or run under torchrun, Slurm, mpirun) to see which interface the ranks would use".into(),
            None,
        ));
        return;
    };
    let addr =
        std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port.parse().unwrap_or(0)))
            .ok()
            .and_then(|mut a| a.next());
    let Some(addr) = addr else {
        out.push(check(
            "bootstrap",
            Verdict::Fail,
            format!("MASTER_ADDR {host:?} does not resolve"),
            Some("set MASTER_ADDR to the rank-0 host's address"),
        ));
        return;
    };
    match monel_verbs::route_source(addr).ok() {
        Some(ip) => {
            let ifname = soft_devices()
                .ok()
                .and_then(|ds| {
                    ds.into_iter()
                        .find(|d| d.gids.iter().any(|g| g.gid.to_ip() == ip))
                })
                .map_or_else(|| "?".into(), |d| d.ifname);
            out.push(check(
                "bootstrap",
                Verdict::Ok,
                format!(
                    "ranks reach the rendezvous at {addr} from {ip} on {ifname} (the route to it)"
                ),
                None,
            ));
        }
        None => out.push(check(
            "bootstrap",
            Verdict::Fail,
            format!("no route to the rendezvous at {addr}"),
            Some("check MASTER_ADDR and the routes (ip route get ADDR)"),
        )),
    }
}

/// What one rank registers and maps, for the brief checks.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Ranks on this host (this one included) that share memory.
    pub local: u64,
    /// Peers on other hosts the RDMA transport may carry.
    pub remote: u64,
    /// Shared-memory ring per direction, bytes (0: shared memory is off).
    pub shm_ring: u64,
    /// RDMA receive ring per peer, bytes (0: the RDMA transport is off).
    pub rdma_ring: u64,
    /// A hardware RDMA port will carry the peers on other hosts.
    pub pins: bool,
}

/// The brief checks a communicator runs at init (`MONEL_DOCTOR=1`): providers, locked
/// memory and /dev/shm against `shape`. Each is logged (subsystem INIT: failures and warnings always, the rest at `MONEL_DEBUG=INFO`); a failing one
/// fails init with its detail and fix.
pub fn at_init(rank: usize, shape: Shape) -> Result<Vec<Check>> {
    let devs = sysfs::scan(Path::new(sysfs::SYSFS_ROOT)).unwrap_or_default();
    let mut out = Vec::new();
    providers(&mut out, &devs);
    if shape.rdma_ring > 0 && shape.remote > 0 {
        locked_memory(&mut out, shape.rdma_ring, shape.remote, shape.pins);
    }
    if shape.shm_ring > 0 && shape.local > 1 {
        shared_memory(&mut out, shape.shm_ring, shape.local);
    }
    for c in &out {
        let fix = c
            .fix
            .as_deref()
            .map_or(String::new(), |f| format!(" (fix: {f})"));
        match c.verdict {
            Verdict::Ok => {
                tracing::info!(target: "monel::init", "rank {rank}: ok {}: {}", c.check, c.detail);
            }
            Verdict::Warn | Verdict::Fail => {
                tracing::warn!(
                    target: "monel::init",
                    "rank {rank}: {} {}: {}{fix}",
                    c.verdict.word(),
                    c.check,
                    c.detail
                );
            }
        }
    }
    if let Some(c) = out.iter().find(|c| c.verdict == Verdict::Fail) {
        let fix = c
            .fix
            .as_deref()
            .map_or(String::new(), |f| format!("; fix: {f}"));
        return Err(CclError::new(
            ErrorKind::System,
            format!("rank {rank}: MONEL_DOCTOR: {}: {}{fix}", c.check, c.detail),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_memory_fails_only_where_a_nic_pins() {
        let ring = 2 << 20;
        // 3 remote peers need 12 MiB.
        assert_eq!(memlock_verdict(None, ring, 3, true).verdict, Verdict::Ok);
        assert_eq!(
            memlock_verdict(Some(16 << 20), ring, 3, true).verdict,
            Verdict::Ok
        );
        let short = memlock_verdict(Some(8 << 20), ring, 3, true);
        assert_eq!(short.verdict, Verdict::Fail);
        assert!(
            short.detail.contains("8.0 MiB") && short.detail.contains("12.0 MiB"),
            "{}",
            short.detail
        );
        assert!(short.fix.is_some());
        assert_eq!(
            memlock_verdict(Some(8 << 20), ring, 3, false).verdict,
            Verdict::Warn
        );
        // No overflow on absurd rings.
        assert_eq!(
            memlock_verdict(Some(1), u64::MAX, u64::MAX, true).verdict,
            Verdict::Fail
        );
    }

    #[test]
    fn a_failing_brief_check_fails_init_with_its_fix() {
        // Rings no /dev/shm holds: 2 ranks, 2^50 bytes each way.
        let shape = Shape {
            local: 2,
            remote: 0,
            shm_ring: 1 << 50,
            rdma_ring: 0,
            pins: false,
        };
        let e = at_init(0, shape).expect_err("a /dev/shm that cannot hold the rings");
        assert_eq!(e.kind, ErrorKind::System);
        assert!(
            e.message.contains("MONEL_DOCTOR: /dev/shm") && e.message.contains("fix:"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_brief_checks_pass_where_the_job_fits() {
        let shape = Shape {
            local: 2,
            remote: 0,
            shm_ring: 64 << 10,
            rdma_ring: 2 << 20,
            pins: false,
        };
        let checks = at_init(0, shape).expect("a small job fits");
        let names: Vec<&str> = checks.iter().map(|c| c.check).collect();
        assert_eq!(names.first(), Some(&"providers"), "{names:?}");
        assert!(names.contains(&"/dev/shm"), "{names:?}");
        // No peer on another host: nothing to register.
        assert!(!names.contains(&"locked memory"), "{names:?}");
    }
}
