//! An RDMA WRITE with immediate between two processes through the verbs API, as rdma-core's
//! examples do it: each side opens a soft RoCE device, registers memory and creates an RC QP;
//! the connection manager exchanges QP numbers, GIDs and the target buffer's address and
//! R_Key over TCP; the client writes into the server's memory, and the immediate tells the
//! server the data is there.
//!
//!   cargo run --release -p monel-verbs --example rdma_write          # both sides
//!   ... --example rdma_write -- server 127.0.0.2:18600                # or one each
//!   ... --example rdma_write -- client 127.0.0.3 127.0.0.2:18600

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use monel_verbs::cm::{self, BufferInfo, CmConfig};
use monel_verbs::{
    AccessFlags, CompletionQueue, Context, ContextConfig, Device, ProtectionDomain, QpCap,
    QpInitAttr, QpType, QueuePair, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, WcStatus,
};

const LEN: usize = 1 << 20;
const IMM: u32 = 0x600d;
/// Each process's soft RNIC gets its own UDP port, so both fit on one address.
const SERVER_UDP: u16 = 24891;
const CLIENT_UDP: u16 = 24892;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A soft device on `ip`, with one PD, one CQ and one RC QP.
fn open(ip: IpAddr, udp_port: u16) -> Res<(Context, ProtectionDomain, CompletionQueue, QueuePair)> {
    let dev = Device::bind(ip)?;
    let cfg = ContextConfig {
        udp_port,
        ..ContextConfig::default()
    };
    let ctx = Context::open(&dev, cfg)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap::default(),
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })?;
    Ok((ctx, pd, cq, qp))
}

/// Byte `i` of what the client writes.
fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(29).wrapping_add(3)
}

fn server(addr: SocketAddr) -> Res<()> {
    let (_ctx, pd, cq, qp) = open(addr.ip(), SERVER_UDP)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.reg_mr(vec![0u8; LEN], access)?;
    let offer = BufferInfo {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: LEN as u64,
    };
    let listener = cm::Listener::bind(addr)?;
    let _conn = listener.accept(&qp, Some(offer), &CmConfig::default())?;
    // WRITE with immediate consumes a receive (with no buffer: the data goes where the
    // writer says). Should the WRITE arrive first, the server answers RNR and the client
    // retries.
    qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![],
    })?;
    let wc = cq
        .poll_n(1, Duration::from_secs(10))
        .pop()
        .ok_or("no completion within 10 s")?;
    if wc.status != WcStatus::Success || wc.imm != Some(IMM) {
        return Err(format!("server: unexpected completion {wc:?}").into());
    }
    let mut got = vec![0u8; LEN];
    mr.read(0, &mut got)?;
    if let Some(i) = (0..LEN).find(|&i| got[i] != pattern(i)) {
        return Err(format!("server: byte {i} is {:#x}, want {:#x}", got[i], pattern(i)).into());
    }
    println!(
        "server: {LEN} bytes landed with immediate {:#x}, every byte checked",
        IMM
    );
    Ok(())
}

fn client(ip: IpAddr, server: SocketAddr) -> Res<()> {
    let (_ctx, pd, cq, qp) = open(ip, CLIENT_UDP)?;
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    let mr = pd.reg_mr(data, AccessFlags::NONE)?;
    let conn = cm::connect(server, &qp, None, &CmConfig::default())?;
    let target = conn.remote_buf.ok_or("the server offered no buffer")?;
    let remote = RemoteAddr {
        addr: target.addr,
        rkey: target.rkey,
    };
    qp.post_send(SendWr {
        wr_id: 7,
        op: SendOp::WriteImm(remote, IMM),
        sg_list: vec![mr.sge(0, LEN)],
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    })?;
    let wc = cq
        .poll_n(1, Duration::from_secs(10))
        .pop()
        .ok_or("no completion within 10 s")?;
    if wc.status != WcStatus::Success {
        return Err(format!("client: {:?}", wc.status).into());
    }
    println!("client: RDMA WRITE with immediate of {LEN} bytes completed");
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server", addr] => server(addr.parse()?),
        ["client", ip, addr] => client(ip.parse()?, addr.parse()?),
        [] => {
            // Both sides, as two processes of this program on two loopback addresses.
            let me = std::env::current_exe()?;
            let addr = "127.0.0.2:18600";
            let mut srv = Command::new(&me).args(["server", addr]).spawn()?;
            let cli = Command::new(&me)
                .args(["client", "127.0.0.3", addr])
                .status()?;
            let srv = srv.wait()?;
            if !cli.success() || !srv.success() {
                return Err(format!("client {cli}, server {srv}").into());
            }
            Ok(())
        }
        _ => Err("usage: rdma_write [server ADDR:PORT | client IP ADDR:PORT]".into()),
    }
}
