//! What `monel perf` and `monel transfer` share: the device and connection flags, and the
//! setup from device to a connected RC QP with a registered buffer on each side.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use monel_rc::congestion::{CongestionConfig, DcqcnParams};
use monel_verbs::cm::{self, BufferInfo, CmConfig, Connection, Listener};
use monel_verbs::protect::PacketAuth;
use monel_verbs::{
    CompletionQueue, Context, ContextConfig, Device, MemoryRegion, Mtu, ProtectionDomain, QpCap,
    QpInitAttr, QpType, QueuePair,
};

/// Device and connection flags.
#[derive(Debug, Args)]
pub(crate) struct ConnArgs {
    /// Device: an IP address to bind, or an interface (`eth0`).
    #[arg(short = 'd', long = "ib-dev", default_value = "127.0.0.1")]
    pub(crate) device: String,
    /// TCP port of the connection setup (UDP port for udp-*).
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub(crate) port: u16,
    /// Path MTU.
    #[arg(short = 'm', long, default_value_t = 4096)]
    pub(crate) mtu: u32,
    /// Busy-poll (progress thread and completion polling spin).
    #[arg(long)]
    pub(crate) busy: bool,
    /// File holding the shared secret for the connection setup (`MONEL_SECRET` otherwise;
    /// a secret on the command line would show in `ps`).
    #[arg(long = "secret-file", value_name = "FILE")]
    pub(crate) secret_file: Option<std::path::PathBuf>,
    /// Packet protection: none, mac (a tag on every packet) or encrypt (AES-GCM). Default:
    /// mac with a shared secret, none without. The connection takes the stronger side's.
    #[arg(long, value_name = "MODE", value_parser = parse_auth)]
    pub(crate) auth: Option<PacketAuth>,
    /// UDP port of the RNIC.
    #[arg(long = "udp-port", default_value_t = 4791)]
    pub(crate) udp_port: u16,
    /// DCQCN congestion control, with this line rate in Gb/s (reacts to ECN marks via CNPs).
    #[arg(long, value_name = "GBPS")]
    pub(crate) dcqcn: Option<f64>,
    /// Plain datagrams only: no UDP segmentation offload (GSO) or GRO.
    #[arg(long = "no-gso")]
    pub(crate) no_gso: bool,
    /// UDP source ports for QPs to send from (ECMP entropy); 0: send from the RNIC's port.
    #[arg(long = "source-ports", default_value_t = 8)]
    pub(crate) source_ports: usize,
    /// Copy every payload into a packet buffer (no zero-copy gather from the region).
    #[arg(long = "no-zero-copy")]
    pub(crate) no_zero_copy: bool,
}

/// A connected QP and everything it hangs off.
pub(crate) struct Session {
    pub(crate) dev: Device,
    pub(crate) ctx: Context,
    pub(crate) cq: CompletionQueue,
    pub(crate) mr: MemoryRegion,
    pub(crate) qp: QueuePair,
    pub(crate) conn: Connection,
    pub(crate) is_client: bool,
    // Declared last: dropped after the QP and MR that belong to it.
    _pd: ProtectionDomain,
}

/// Opens the device, registers the buffer `buffer` makes, creates an RC QP with `tx_depth`
/// send slots and connects it to `server`'s (or accepts one, without a server).
pub(crate) fn open(
    a: &ConnArgs,
    server: Option<&str>,
    tx_depth: u32,
    buffer: impl FnOnce(&ProtectionDomain) -> monel_verbs::Result<MemoryRegion>,
) -> anyhow::Result<Session> {
    let dev = Device::from_arg(&a.device)?;
    let mtu = Mtu::from_bytes(a.mtu).with_context(|| format!("-m {}: not an IB MTU", a.mtu))?;
    let congestion = match a.dcqcn {
        None => CongestionConfig::None,
        Some(g) if g > 0.0 && g.is_finite() => {
            CongestionConfig::Dcqcn(DcqcnParams::for_line_rate(g * 1e9))
        }
        Some(g) => anyhow::bail!("--dcqcn {g}: the line rate must be positive"),
    };
    let ctx = Context::open(
        &dev,
        ContextConfig {
            udp_port: a.udp_port,
            busy_poll: a.busy,
            congestion,
            gso: !a.no_gso,
            source_ports: a.source_ports,
            zero_copy: !a.no_zero_copy,
            ..ContextConfig::default()
        },
    )?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8192)?;
    let secret = secret(a)?;
    let auth = a.auth.unwrap_or(if secret.is_some() {
        PacketAuth::Mac
    } else {
        PacketAuth::None
    });
    if auth != PacketAuth::None && secret.is_none() {
        anyhow::bail!("--auth {auth} needs a shared secret (--secret-file or MONEL_SECRET)");
    }
    let cfg = CmConfig {
        secret,
        auth,
        mtu,
        // A kernel device's table starts with link-local and RoCE v1 entries.
        gid_index: dev.ipv4_gid_index().unwrap_or(0),
        timeout: Duration::from_secs(60),
        ..CmConfig::default()
    };
    let mr = buffer(&pd)?;
    let bi = BufferInfo {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: mr.len() as u64,
    };
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: tx_depth.max(1),
            max_recv_wr: 512,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })?;
    let conn = match server {
        Some(s) => {
            let ip: IpAddr = s
                .parse()
                .with_context(|| format!("server {s}: not an IP address"))?;
            cm::connect(SocketAddr::new(ip, a.port), &qp, Some(bi), &cfg)?
        }
        None => {
            // Listen on the device's own address only, and keep serving until a client
            // completes the handshake: a garbled, silent or unauthenticated connection is
            // dropped and logged, not the end of the server.
            let g = dev.gid(dev.ipv4_gid_index().unwrap_or(0))?;
            let at = match g.gid.to_ip() {
                IpAddr::V6(ip) => {
                    SocketAddr::V6(std::net::SocketAddrV6::new(ip, a.port, 0, g.ifindex))
                }
                ip => SocketAddr::new(ip, a.port),
            };
            let l = Listener::bind(at).with_context(|| format!("listen on {at}"))?;
            l.serve(&qp, Some(bi), &cfg, None)?
        }
    };
    Ok(Session {
        dev,
        ctx,
        cq,
        mr,
        qp,
        conn,
        is_client: server.is_some(),
        _pd: pd,
    })
}

fn parse_auth(s: &str) -> Result<PacketAuth, String> {
    PacketAuth::parse(s).ok_or_else(|| format!("{s:?}: want none, mac or encrypt"))
}

/// The shared secret: the file `--secret-file` names (trailing newline ignored), else
/// `MONEL_SECRET`, else none.
pub(crate) fn secret(a: &ConnArgs) -> anyhow::Result<Option<Vec<u8>>> {
    let s = match &a.secret_file {
        Some(p) => monel_peer::auth::secret_from_file(p)
            .with_context(|| format!("--secret-file {}", p.display()))?,
        None => match std::env::var_os("MONEL_SECRET") {
            Some(v) => v.into_encoded_bytes(),
            None => return Ok(None),
        },
    };
    if s.is_empty() {
        anyhow::bail!("the shared secret is empty");
    }
    Ok(Some(s))
}
