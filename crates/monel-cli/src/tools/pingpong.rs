//! `ibv_rc_pingpong`, wire- and exchange-compatible with rdma-core's (v44): the 52-byte
//! `LID:QPN:PSN:GID` messages over TCP (default port 18515), the 5-byte `"done\0"`, the same
//! QP attributes, and the same traffic pattern (each side sends its next message once its
//! last SEND completed and the peer's message arrived). With [`Options::ud`] it is
//! `ibv_ud_pingpong` instead: UD QPs with Q_Key 0x11111111, an address handle to the peer,
//! and receive buffers 40 bytes longer for the GRH.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use monel_peer::greeter::Greeter;
use monel_verbs::Gid;
use monel_verbs::{
    AccessFlags, AddressHandle, AhAttr, GRH_LEN, Mtu, Psn, QKey, Qpn, RecvWr, SendFlags, SendOp,
    SendWr, WcStatus,
};
use monel_verbs::{ConnectParams, Context, QpCap, QpInitAttr, QpType, RemoteQp, random_psn};
use monel_verbs::{ErrorKind, Result, VerbsError};

/// rdma-core's default out-of-band port.
pub(crate) const DEFAULT_PORT: u16 = 18515;
/// Bytes of one exchange message, NUL included.
pub(crate) const MSG_LEN: usize = 52;
pub(crate) const DONE: &[u8; 5] = b"done\0";

/// What one side tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dest {
    /// LID (0 on RoCE).
    pub(crate) lid: u16,
    /// QP number.
    pub(crate) qpn: Qpn,
    /// First PSN.
    pub(crate) psn: Psn,
    /// GID.
    pub(crate) gid: Gid,
}

impl Dest {
    /// The 52-byte message: `"%04x:%06x:%06x:%s\0"`.
    pub(crate) fn encode(&self) -> [u8; MSG_LEN] {
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            self.gid.to_wire_hex()
        );
        let mut m = [0u8; MSG_LEN];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }
    /// Parses a message as rdma-core's `sscanf("%x:%x:%x:%s")` would, strictly.
    pub(crate) fn parse(m: &[u8]) -> Result<Self> {
        let bad = |why: &str| {
            VerbsError::new(
                "pingpong exchange",
                ErrorKind::Peer(format!("{why}: {:?}", String::from_utf8_lossy(m))),
            )
        };
        let text = m.split(|&b| b == 0).next().unwrap_or_default();
        let text = std::str::from_utf8(text).map_err(|_| bad("not ASCII"))?;
        let parts: Vec<&str> = text.split(':').collect();
        if parts.len() != 4 {
            return Err(bad("expected LID:QPN:PSN:GID"));
        }
        let hex = |s: &str, max: u32| {
            u32::from_str_radix(s, 16)
                .ok()
                .filter(|&v| v <= max && !s.is_empty() && s.len() <= 8)
        };
        let lid = hex(parts[0], 0xffff).ok_or_else(|| bad("bad LID"))? as u16;
        let qpn = hex(parts[1], 0xff_ffff).ok_or_else(|| bad("bad QPN"))?;
        let psn = hex(parts[2], 0xff_ffff).ok_or_else(|| bad("bad PSN"))?;
        let gid = Gid::from_wire_hex(parts[3]).ok_or_else(|| bad("bad GID"))?;
        if qpn == 0 || qpn == 1 {
            return Err(bad("QPN 0 and 1 are reserved"));
        }
        Ok(Self {
            lid,
            qpn: Qpn::new(qpn),
            psn: Psn::new(psn),
            gid,
        })
    }
}

/// Options, named after rc_pingpong's flags.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `-p`: TCP port.
    pub(crate) port: u16,
    /// `-s`: message size.
    pub(crate) size: usize,
    /// `-m`: path MTU.
    pub(crate) mtu: Mtu,
    /// `-r`: receives kept posted.
    pub(crate) rx_depth: u32,
    /// `-n`: iterations.
    pub(crate) iters: u32,
    /// `-g`: local GID index.
    pub(crate) gid_index: u8,
    /// `-c`: check received data.
    pub(crate) validate: bool,
    /// Give up connecting, or waiting for a completion, after this long.
    pub(crate) timeout: Duration,
    /// Unreliable datagrams, as `ibv_ud_pingpong` (messages of at most the port MTU).
    pub(crate) ud: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            size: 4096,
            mtu: Mtu::Mtu1024,
            rx_depth: 500,
            iters: 1000,
            gid_index: 0,
            validate: false,
            timeout: Duration::from_secs(30),
            ud: false,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Report {
    /// Bytes moved both ways (size x iters x 2, as rc_pingpong counts).
    pub(crate) bytes: u64,
    /// Seconds from the first post to the last completion.
    pub(crate) seconds: f64,
    /// Iterations.
    pub(crate) iters: u32,
}

impl Report {
    /// rc_pingpong's two lines.
    pub(crate) fn lines(&self) -> String {
        format!(
            "{} bytes in {:.2} seconds = {:.2} Mbit/sec\n{} iters in {:.2} seconds = {:.2} usec/iter",
            self.bytes,
            self.seconds,
            self.bytes as f64 * 8.0 / self.seconds / 1e6,
            self.iters,
            self.seconds,
            self.seconds * 1e6 / f64::from(self.iters)
        )
    }
}

/// Where to meet the peer.
#[derive(Debug, Clone)]
pub(crate) enum Role {
    /// Listen on the port (all addresses of the family of `bind`).
    Server {
        /// Address to listen on.
        bind: IpAddr,
    },
    /// Connect to this server.
    Client {
        /// The server's address.
        server: IpAddr,
    },
}

pub(crate) fn io(e: std::io::Error) -> VerbsError {
    VerbsError::io("pingpong exchange", e)
}

pub(crate) fn read_exact_once(s: &mut TcpStream, n: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

const SEND_ID: u64 = 2;
/// The Q_Key `ibv_ud_pingpong` uses.
pub(crate) const UD_QKEY: QKey = QKey(0x1111_1111);
const RECV_ID: u64 = 1;

/// Connects to the exchange at `addr`, retrying until `timeout` (the server may start
/// later); every read on the stream is bounded by `timeout` too.
pub(crate) fn dial(addr: SocketAddr, timeout: Duration, verb: &'static str) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    let s = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(VerbsError::new(
                    verb,
                    ErrorKind::Timeout(format!("connect to {addr}: {e}")),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    Ok(s)
}

/// Listens at `at` until a connection's first message passes `read`; returns it and what
/// `read` made of it. Every connection is read on its own: a silent, slow or garbled one
/// is dropped and logged, never the end of the server.
pub(crate) fn serve_first<T: Send + 'static>(
    at: SocketAddr,
    read: impl Fn(&mut TcpStream) -> Result<T> + Send + Sync + 'static,
    timeout: Duration,
    what: &'static str,
) -> Result<(TcpStream, T)> {
    let l = TcpListener::bind(at).map_err(io)?;
    let mut greeter = Greeter::new(l, read, timeout, what).map_err(io)?;
    loop {
        if let Some((s, _, t)) = greeter.next(Duration::from_secs(1)).map_err(io)? {
            s.set_read_timeout(Some(timeout)).map_err(io)?;
            return Ok((s, t));
        }
    }
}

/// Runs one rc_pingpong side on `ctx`.
pub(crate) fn run(ctx: &Context, role: &Role, o: &Options) -> Result<Report> {
    const V: &str = "pingpong";
    if o.size == 0 || o.iters == 0 || o.rx_depth == 0 {
        return Err(VerbsError::invalid(
            V,
            "size, iters and rx_depth must be positive",
        ));
    }
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(o.rx_depth as usize + 1)?;
    // rdma-core fills its buffer with 0x7b; so do we, so either side can check the other.
    let mr = pd.reg_mr(vec![0x7b; o.size], AccessFlags::LOCAL_WRITE)?;
    // UD receives start with the 40-byte GRH.
    let grh = if o.ud { GRH_LEN } else { 0 };
    let rx = pd.reg_mr(vec![0; grh + o.size], AccessFlags::LOCAL_WRITE)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: o.rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: if o.ud { QpType::Ud } else { QpType::Rc },
        sq_sig_all: false,
        srq: None,
    })?;
    let post_recv = |n: u32| -> Result<u32> {
        for _ in 0..n {
            qp.post_recv(RecvWr {
                wr_id: RECV_ID,
                sg_list: vec![rx.sge(0, grh + o.size)],
            })?;
        }
        Ok(n)
    };
    let gid = ctx.query_gid(o.gid_index)?.gid;
    let me = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid,
    };
    if o.ud {
        qp.ready_ud(UD_QKEY, me.psn)?;
    } else {
        qp.init(AccessFlags::NONE)?;
    }
    let mut routs = post_recv(o.rx_depth)?;
    let params = ConnectParams {
        sgid_index: o.gid_index,
        local_psn: me.psn,
        mtu: o.mtu,
        access: AccessFlags::NONE,
        rd_atomic: 1,
        hop_limit: 1,
        ..ConnectParams::default()
    };
    // UD: where the peer is (an address handle and its QPN), set at the exchange.
    let ud_peer: std::cell::RefCell<Option<(AddressHandle, Qpn)>> = Default::default();
    let connect = |peer: &Dest| {
        if o.ud {
            let ah = pd.create_ah(&AhAttr {
                dgid: peer.gid,
                sgid_index: o.gid_index,
                hop_limit: 1,
            })?;
            *ud_peer.borrow_mut() = Some((ah, peer.qpn));
            return Ok(());
        }
        qp.connect(
            &RemoteQp {
                qpn: peer.qpn,
                psn: peer.psn,
                gid: peer.gid,
            },
            &params,
        )
    };
    let is_client = match role {
        Role::Client { server } => {
            let mut s = dial(SocketAddr::new(*server, o.port), o.timeout, V)?;
            s.write_all(&me.encode()).map_err(io)?;
            let peer = Dest::parse(&read_exact_once(&mut s, MSG_LEN)?)?;
            s.write_all(DONE).map_err(io)?;
            connect(&peer)?;
            true
        }
        Role::Server { bind } => {
            let (mut s, peer) = serve_first(
                SocketAddr::new(*bind, o.port),
                |s: &mut TcpStream| Dest::parse(&read_exact_once(s, MSG_LEN)?),
                o.timeout,
                "pingpong",
            )?;
            // Like rdma-core: our QP is ready before the client learns where it is.
            connect(&peer)?;
            s.write_all(&me.encode()).map_err(io)?;
            let done = read_exact_once(&mut s, DONE.len())?;
            if done != DONE {
                return Err(VerbsError::new(
                    V,
                    ErrorKind::Peer("expected \"done\"".into()),
                ));
            }
            false
        }
    };
    let post_send = || {
        let wr = SendWr {
            wr_id: SEND_ID,
            op: SendOp::Send,
            sg_list: vec![mr.sge(0, o.size)],
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        match &*ud_peer.borrow() {
            Some((ah, qpn)) => qp.post_send_ud(wr, ah, *qpn, UD_QKEY),
            None => qp.post_send(wr),
        }
    };
    let start = Instant::now();
    let mut pending = RECV_ID;
    if is_client {
        post_send()?;
        pending |= SEND_ID;
    }
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    while scnt < o.iters || rcnt < o.iters {
        if !cq.wait(o.timeout) {
            return Err(VerbsError::new(
                V,
                ErrorKind::Timeout(format!("no completion after {scnt} sends, {rcnt} receives")),
            ));
        }
        for wc in cq.poll(16) {
            if wc.status != WcStatus::Success {
                return Err(VerbsError::invalid(
                    V,
                    format!(
                        "failed status {:?} ({}) for wr_id {}",
                        wc.status, wc.status as u32, wc.wr_id
                    ),
                ));
            }
            match wc.wr_id {
                SEND_ID => scnt += 1,
                RECV_ID => {
                    if o.validate {
                        // Check, then clear: the next message must rewrite every byte.
                        let ok = wc.byte_len as usize == grh + o.size
                            && rx.with(|b| {
                                let ok = b[grh..].iter().all(|&x| x == 0x7b);
                                b.fill(0);
                                ok
                            });
                        if !ok {
                            return Err(VerbsError::invalid(
                                V,
                                format!(
                                    "message {rcnt}: {} bytes, not {} bytes of 0x7b",
                                    wc.byte_len - grh as u32,
                                    o.size
                                ),
                            ));
                        }
                    }
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recv(o.rx_depth - routs)?;
                    }
                    rcnt += 1;
                }
                other => {
                    return Err(VerbsError::invalid(
                        V,
                        format!("completion for unknown wr_id {other}"),
                    ));
                }
            }
            pending &= !wc.wr_id;
            if scnt < o.iters && pending == 0 {
                post_send()?;
                pending = RECV_ID | SEND_ID;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Report {
        bytes: o.size as u64 * u64::from(o.iters) * 2,
        seconds,
        iters: o.iters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_matches_rdma_core_format() {
        let d = Dest {
            lid: 0,
            qpn: Qpn::new(0x11),
            psn: Psn::new(0x6a48fb),
            gid: Gid::from_ip("10.77.0.3".parse().unwrap()),
        };
        let m = d.encode();
        assert_eq!(
            &m[..51],
            b"0000:000011:6a48fb:00000000000000000000ffff0a4d0003"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::parse(&m).unwrap(), d);
    }

    #[test]
    fn garbage_is_a_typed_error() {
        for bad in [
            &b"hello"[..],
            b"0000:000000:000001:00000000000000000000ffff0a4d0003\0",
            b"0000:1000000:000001:00000000000000000000ffff0a4d0003",
            b"0000:000011:000001:zz000000000000000000ffff0a4d0003",
            b"0000:000011:000001",
            &[0xff; 52],
        ] {
            let e = Dest::parse(bad).unwrap_err();
            assert!(matches!(e.kind, ErrorKind::Peer(_)), "{e}");
        }
    }
}
