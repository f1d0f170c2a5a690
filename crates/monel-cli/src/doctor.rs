//! `monel doctor`: a pre-flight check before a job. Each check ends in a verdict in words
//! and, where something is wrong, the fix; the exit status says whether a job would run.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use monel_verbs::hca::{GidPolicy, HcaFilter, choose_gid, lookup};
use monel_verbs::rdma_core::{loader::Libibverbs, sysfs};
use monel_verbs::{Context, ContextConfig, Device, Mtu, soft_devices};
use serde::Serialize;

use crate::tools::pingpong::{self, Options, Role};

/// Arguments of `monel doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Ranks the job will run on this host (sizes the shared-memory and locked-memory
    /// checks).
    #[arg(long, default_value_t = 8)]
    local_ranks: u64,
    /// Ranks in the whole job (sizes the RDMA rings each rank registers).
    #[arg(long, default_value_t = 16)]
    nranks: u64,
    /// The kernel's RDMA devices are read from here.
    #[arg(long, default_value = sysfs::SYSFS_ROOT, hide = true)]
    sysfs: String,
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
    /// Peers to RDMA-ping through the path a job would take (comma list of addresses);
    /// each must run `monel doctor --serve`.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    peers: Vec<IpAddr>,
    /// Answer other hosts' `--peers` pings (this many, then exit; 0: until stopped) instead
    /// of checking this host.
    #[arg(long, value_name = "COUNT", num_args = 0..=1, default_missing_value = "0")]
    serve: Option<u32>,
    /// The device to ping from or serve on (an address or a device name); default: the
    /// first kernel RDMA port that is up, else the soft RNIC on the address towards the peer.
    #[arg(short = 'd', long)]
    device: Option<String>,
    /// TCP port of the pings' exchange.
    #[arg(long, default_value_t = 18515)]
    port: u16,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One check.
#[derive(Debug, Serialize)]
struct Check {
    check: &'static str,
    verdict: Verdict,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

fn check(check: &'static str, verdict: Verdict, detail: String, fix: Option<&str>) -> Check {
    Check {
        check,
        verdict,
        detail,
        fix: fix.map(str::to_string),
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
}

/// Bytes from a `MONEL_*` size variable, or `default`.
fn size_var(name: &str, default: u64) -> u64 {
    env(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn providers(out: &mut Vec<Check>, devs: &[sysfs::SysDevice]) {
    match Libibverbs::load() {
        Ok(l) => {
            let listed = l.device_names();
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
fn open_check() -> Check {
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
fn rdma_devices(out: &mut Vec<Check>, devs: &[sysfs::SysDevice]) {
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

fn soft_rnic(out: &mut Vec<Check>) {
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

fn locked_memory(out: &mut Vec<Check>, a: &DoctorArgs) {
    let ring = size_var("MONEL_RDMA_RING", 2 << 20);
    // Each rank registers a receive ring and a staging ring per remote peer.
    let need = 2 * ring * a.nranks.saturating_sub(1);
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft == nix::sys::resource::RLIM_INFINITY => out.push(check(
            "locked memory",
            Verdict::Ok,
            format!(
                "unlimited (a rank registers about {} for {} ranks)",
                mib(need),
                a.nranks
            ),
            None,
        )),
        Ok((soft, _)) => {
            let ok = soft >= need;
            out.push(check(
                "locked memory",
                if ok { Verdict::Ok } else { Verdict::Warn },
                format!(
                    "ulimit -l is {}; a rank registers about {} for {} ranks (hardware NICs pin it; the soft RNIC does not)",
                    mib(soft),
                    mib(need),
                    a.nranks
                ),
                (!ok).then_some("raise the limit: ulimit -l unlimited, or memlock in /etc/security/limits.conf"),
            ));
        }
        Err(e) => out.push(check(
            "locked memory",
            Verdict::Warn,
            format!("getrlimit: {e}"),
            None,
        )),
    }
}

fn shared_memory(out: &mut Vec<Check>, a: &DoctorArgs) {
    let ring = size_var("MONEL_SHM_RING", 1 << 20);
    let l = a.local_ranks;
    // A segment per pair of local ranks: a ring each way and a page of control.
    let need = l * l.saturating_sub(1) / 2 * (2 * ring + 8192);
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
fn bootstrap(out: &mut Vec<Check>) {
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

/// What an RDMA ping is: rc_pingpong's exchange, few small messages, a path MTU every
/// device has; both sides use the same.
fn ping_options(port: u16, gid_index: u8) -> Options {
    Options {
        port,
        size: 4096,
        mtu: Mtu::Mtu1024,
        rx_depth: 16,
        iters: 10,
        gid_index,
        validate: true,
        timeout: Duration::from_secs(5),
        ud: false,
    }
}

/// The device a job would use towards `peer` (or the one named), and its GID index: the
/// first RDMA port `MONEL_IB_HCA` admits with a GID the `MONEL_IB_*` policy takes, as the
/// collectives choose it; else the soft RNIC on the address towards the peer.
fn ping_device(named: Option<&str>, peer: Option<IpAddr>) -> anyhow::Result<(Device, u8)> {
    let hca = lookup(&env, "IB_HCA").and_then(|(v, _)| HcaFilter::parse(&v).ok());
    let policy = GidPolicy::from_vars(&env)
        .map(|(p, _)| p)
        .unwrap_or_default();
    let dev = match (named, peer) {
        (Some(n), _) => Device::from_arg(n)?,
        (None, peer) => {
            let hw = monel_verbs::rdma_core::device::first_usable(hca.as_ref(), &policy).ok();
            match (hw, peer) {
                (Some((d, _)), _) => d,
                (None, Some(p)) => Device::bind(monel_verbs::route_source(SocketAddr::new(p, 9))?)?,
                (None, None) => soft_devices()?
                    .into_iter()
                    .find(|d| d.ifname != "lo" && d.ipv4_gid_index().is_some())
                    .context("no device with an IPv4 address: name one with -d")?,
            }
        }
    };
    let port = match dev.provider {
        monel_verbs::Provider::RdmaCore { port, .. } => port,
        monel_verbs::Provider::Soft => 1,
    };
    let (g, _) =
        choose_gid(&dev.name, port, &dev.gid_slots(), &policy).map_err(anyhow::Error::msg)?;
    Ok((dev, u8::try_from(g.index).context("GID index above 255")?))
}

/// One RDMA ping of `peer`: ten 4 KiB round trips through the path a job would take.
fn ping(a: &DoctorArgs, peer: IpAddr) -> Check {
    let go = || -> anyhow::Result<String> {
        let (dev, g) = ping_device(a.device.as_deref(), Some(peer))?;
        let ctx = Context::open(&dev, ContextConfig::default())?;
        let r = pingpong::run(
            &ctx,
            &Role::Client { server: peer },
            &ping_options(a.port, g),
        )?;
        Ok(format!(
            "{peer}: {} RDMA round trips of 4 KiB, {:.0} us each, from {} GID {g} ({}), every byte checked",
            r.iters,
            r.seconds * 1e6 / f64::from(r.iters),
            dev.name,
            dev.gid(g)?.gid.to_ip()
        ))
    };
    match go() {
        Ok(detail) => check("peer", Verdict::Ok, detail, None),
        Err(e) => check(
            "peer",
            Verdict::Fail,
            format!("{peer}: {e:#}"),
            Some(
                "run `monel doctor --serve` there; TCP port --port (18515) and UDP 4791 must \
                 pass between the hosts",
            ),
        ),
    }
}

/// `--serve`: answers `count` pings (0: until stopped), each on a fresh QP.
fn serve(a: &DoctorArgs, count: u32) -> anyhow::Result<()> {
    let (dev, g) = ping_device(a.device.as_deref(), None)?;
    let ctx = Context::open(&dev, ContextConfig::default())?;
    let ip = dev.gid(g)?.gid.to_ip();
    println!(
        "answering RDMA pings on {} GID {g} ({ip}), TCP port {}",
        dev.name, a.port
    );
    let bind = if ip.is_ipv4() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        IpAddr::from([0u16; 8])
    };
    let o = Options {
        timeout: Duration::from_secs(3600),
        ..ping_options(a.port, g)
    };
    let mut served = 0;
    while count == 0 || served < count {
        match pingpong::run(&ctx, &Role::Server { bind }, &o) {
            Ok(r) => println!(
                "ping answered: {} round trips, {:.0} us each",
                r.iters,
                r.seconds * 1e6 / f64::from(r.iters)
            ),
            Err(e) => println!("ping failed: {e}"),
        }
        served += 1;
    }
    Ok(())
}

pub(crate) fn run(a: &DoctorArgs) -> anyhow::Result<()> {
    if let Some(count) = a.serve {
        return serve(a, count);
    }
    let devs = sysfs::scan(Path::new(&a.sysfs)).unwrap_or_default();
    let mut out = Vec::new();
    providers(&mut out, &devs);
    rdma_devices(&mut out, &devs);
    soft_rnic(&mut out);
    locked_memory(&mut out, a);
    shared_memory(&mut out, a);
    bootstrap(&mut out);
    for &peer in &a.peers {
        out.push(ping(a, peer));
    }
    let fails = out.iter().filter(|c| c.verdict == Verdict::Fail).count();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for c in &out {
            let v = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            println!("{v}  {:<14} {}", c.check, c.detail);
            if let Some(f) = &c.fix {
                println!("      {:<14} fix: {f}", "");
            }
        }
        println!(
            "{}",
            if fails == 0 {
                "a job would run here".to_string()
            } else {
                format!("{fails} check(s) failed: a job would not run here")
            }
        );
    }
    if fails > 0 {
        std::process::exit(1);
    }
    Ok(())
}
