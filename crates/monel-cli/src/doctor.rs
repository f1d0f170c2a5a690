//! `monel doctor`: a pre-flight check before a job. Each check ends in a verdict in words
//! and, where something is wrong, the fix; the exit status says whether a job would run.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use monel_ccl::doctor::{self, Check, Verdict, check, env};
use monel_peer::hca::{GidPolicy, HcaFilter, choose_gid, lookup};
use monel_verbs::rdma_core::sysfs;
use monel_verbs::{Context, ContextConfig, Device, Mtu, soft_devices};

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

/// Bytes from a `MONEL_*` size variable, or `default`.
fn size_var(name: &str, default: u64) -> u64 {
    env(name).and_then(|v| v.parse().ok()).unwrap_or(default)
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
    let (hca, policy) = job_choice();
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

/// The device and GID choice a job reads from `MONEL_IB_HCA` and `MONEL_IB_*` (malformed
/// values are the devices check's to report).
fn job_choice() -> (Option<HcaFilter>, GidPolicy) {
    let hca = lookup(&env, "IB_HCA").and_then(|(v, _)| HcaFilter::parse(&v).ok());
    let policy = GidPolicy::from_vars(&env)
        .map(|(p, _)| p)
        .unwrap_or_default();
    (hca, policy)
}

/// A hardware RDMA port would carry the job (the port a job opens).
fn pins() -> bool {
    let (hca, policy) = job_choice();
    monel_verbs::rdma_core::device::first_usable(hca.as_ref(), &policy).is_ok()
}

pub(crate) fn run(a: &DoctorArgs) -> anyhow::Result<()> {
    if let Some(count) = a.serve {
        return serve(a, count);
    }
    let devs = sysfs::scan(Path::new(&a.sysfs)).unwrap_or_default();
    let mut out = Vec::new();
    doctor::providers(&mut out, &devs);
    doctor::rdma_devices(&mut out, &devs);
    doctor::soft_rnic(&mut out);
    doctor::locked_memory(
        &mut out,
        size_var("MONEL_RDMA_RING", 2 << 20),
        a.nranks.saturating_sub(1),
        pins(),
    );
    doctor::shared_memory(&mut out, size_var("MONEL_SHM_RING", 1 << 20), a.local_ranks);
    doctor::bootstrap(&mut out);
    for &peer in &a.peers {
        out.push(ping(a, peer));
    }
    let fails = out.iter().filter(|c| c.verdict == Verdict::Fail).count();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for c in &out {
            println!("{:<4}  {:<14} {}", c.verdict.word(), c.check, c.detail);
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
