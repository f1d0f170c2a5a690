//! `monel pingpong`: rdma-core's `ibv_rc_pingpong`, same flags, same wire and exchange
//! (`--ud`: `ibv_ud_pingpong`; `--srq`: `ibv_srq_pingpong`).

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::time::Duration;

use crate::tools::pingpong::{self, Options, Role};
use crate::tools::srq_pingpong;
use anyhow::{Context as _, bail};
use clap::Args;
use monel_verbs::{Context, ContextConfig, Device, Mtu, devices};

/// Arguments of `monel pingpong` (rc_pingpong's flags).
#[derive(Debug, Args)]
pub(crate) struct PingpongArgs {
    /// Server to connect to; without it, act as the server.
    server: Option<String>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = pingpong::DEFAULT_PORT)]
    port: u16,
    /// Device (`monel_eth0`, `eth0`, or an IP address to bind to); default: the first with an IPv4 GID, not loopback.
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Message size.
    #[arg(short = 's', long, default_value_t = 4096)]
    size: usize,
    /// Path MTU in bytes (256..4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Iterations.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Local GID index; default: the device's first IPv4 GID.
    #[arg(short = 'g', long = "gid-idx")]
    gid_index: Option<u8>,
    /// Check the received data.
    #[arg(short = 'c', long = "chk")]
    validate: bool,
    /// IB port (only 1 exists; accepted for compatibility).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// UDP port of the RNIC.
    #[arg(long = "udp-port", default_value_t = 4791)]
    udp_port: u16,
    /// Seconds to wait for the peer.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Print device counters at the end.
    #[arg(long)]
    counters: bool,
    /// Unreliable datagrams: `ibv_ud_pingpong`'s QPs and exchange (size at most the port MTU).
    #[arg(long, conflicts_with = "srq")]
    ud: bool,
    /// Several RC QPs sharing one receive queue: `ibv_srq_pingpong`'s QPs and exchange.
    #[arg(long)]
    srq: bool,
    /// QPs with `--srq` (`ibv_srq_pingpong -q`).
    #[arg(short = 'q', long = "num-qp", default_value_t = 16, requires = "srq")]
    num_qp: usize,
}

fn pick_device(name: Option<&str>, port: u8) -> anyhow::Result<Device> {
    if let Some(n) = name {
        if port != 1 && !n.contains(':') {
            return Ok(Device::by_name(&format!("{n}:{port}"))?);
        }
        return Ok(Device::from_arg(n)?);
    }
    devices()?
        .into_iter()
        .find(|d| d.ifname != "lo" && d.ipv4_gid_index().is_some())
        .context("no device with an IPv4 address; name one with -d")
}

pub(crate) fn run(a: &PingpongArgs) -> anyhow::Result<()> {
    let mtu = Mtu::from_bytes(a.mtu).with_context(|| format!("-m {}: not an IB MTU", a.mtu))?;
    let dev = pick_device(a.device.as_deref(), a.ib_port)?;
    if !dev.is_rdma_core() && a.ib_port != 1 {
        bail!(
            "ib port {} does not exist (soft devices have port 1)",
            a.ib_port
        );
    }
    let gid_index = match a.gid_index {
        Some(g) => g,
        None => dev
            .ipv4_gid_index()
            .context("device has no IPv4 GID; give -g")?,
    };
    let local_ip = dev.gid(gid_index)?.gid.to_ip();
    let cfg = ContextConfig {
        udp_port: a.udp_port,
        ..ContextConfig::default()
    };
    let ctx = Context::open(&dev, cfg)?;
    let role = match &a.server {
        Some(s) => {
            let server = (s.as_str(), a.port)
                .to_socket_addrs()
                .with_context(|| format!("resolve {s}"))?
                .map(|x| x.ip())
                .find(|ip| ip.is_ipv4() == local_ip.is_ipv4())
                .with_context(|| format!("{s} has no address of the GID's family"))?;
            Role::Client { server }
        }
        None => Role::Server {
            bind: if local_ip.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            },
        },
    };
    let o = Options {
        port: a.port,
        size: a.size,
        mtu,
        rx_depth: a.rx_depth,
        iters: a.iters,
        gid_index,
        validate: a.validate,
        timeout: Duration::from_secs(a.timeout),
        ud: a.ud,
    };
    let r = if a.srq {
        srq_pingpong::run(&ctx, &role, &o, a.num_qp)?
    } else {
        pingpong::run(&ctx, &role, &o)?
    };
    println!("{}", r.lines());
    if a.counters {
        print!("{}", ctx.counters());
    }
    Ok(())
}
