//! Monel's connection manager: TCP listen/connect that exchanges QPN, PSN, GID, MTU and,
//! optionally, one buffer (address, R_Key, length), brings both QPs to RTS, and — when a
//! shared secret is configured — authenticates both sides with HMAC-SHA256 over fresh nonces.
//!
//! ```text
//! server -> client  HELLO   "MONELCM1" flags nonce_s[16]
//! client -> server  REQUEST "MONELREQ" qpn psn gid mtu buf port auth nonce_c[16] mac_c[32]
//! server            (verifies mac_c, brings its QP to RTS)
//! server -> client  REPLY   "MONELREP" status qpn psn gid mtu buf port auth mac_s[32]
//! client            (verifies mac_s, brings its QP to RTS)
//! client -> server  READY   "MONELRDY" mac_r[32]
//! ```
//! With K the key the secret stands for ([`monel_peer::auth::Key::from_secret`]),
//! mac_c = HMAC(K, "client" | nonce_s | request), mac_s = HMAC(K, "server" | nonce_c |
//! request | reply), mac_r = HMAC(K, "ready" | nonce_s | nonce_c). A side without the
//! secret sends zero MACs and is refused with a clear error; a peer that speaks anything else
//! gets a typed error, never a hang (every read has a timeout). `port` is the UDP port the
//! side's soft RNIC listens on, so several processes can share one address, each on its own
//! port (real RoCE peers always use 4791). `auth` is the packet protection each side asks
//! for ([`crate::protect`]); the QPs take the stronger, keyed by
//! derive(K, "cm packets", nonce_s, nonce_c), and protect before either leaves INIT.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::device::Gid;
use crate::error::{ErrorKind, Result, VerbsError};
use crate::protect::{PacketAuth, Protection};
use crate::qp::{ConnectParams, QueuePair, RemoteQp, random_psn};
use crate::{Mtu, Psn, Qpn, RKey};
use monel_peer::auth::{Key, nonce};
use monel_peer::greeter::Greeter;

const V: &str = "monel_cm";
const HELLO: &[u8; 8] = b"MONELCM1";
const REQ: &[u8; 8] = b"MONELREQ";
const REP: &[u8; 8] = b"MONELREP";
const RDY: &[u8; 8] = b"MONELRDY";
const MAX_MSG: usize = 512;

/// A buffer one side offers the other for RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferInfo {
    /// Address.
    pub addr: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Length.
    pub len: u64,
}

/// Connection-manager settings.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// Shared secret; when set, the peer must prove it has the same one.
    pub secret: Option<Vec<u8>>,
    /// Largest path MTU this side accepts (the smaller of the two is used).
    pub mtu: Mtu,
    /// Local GID index.
    pub gid_index: u8,
    /// Limit on every network wait of the setup.
    pub timeout: Duration,
    /// QP attributes besides the exchanged ones.
    pub params: ConnectParams,
    /// Packet protection this side asks for; the connection takes the stronger of the two
    /// sides' (anything but `None` needs the shared secret, from which the keys come).
    pub auth: PacketAuth,
}

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            secret: None,
            mtu: Mtu::Mtu4096,
            gid_index: 0,
            timeout: Duration::from_secs(10),
            params: ConnectParams::default(),
            auth: PacketAuth::None,
        }
    }
}

/// A connected pair's view of the other side, plus the TCP stream (usable as a barrier).
#[derive(Debug)]
pub struct Connection {
    /// The peer's QP.
    pub remote: RemoteQp,
    /// The buffer the peer offered, if any.
    pub remote_buf: Option<BufferInfo>,
    /// The negotiated path MTU.
    pub mtu: Mtu,
    /// The negotiated packet protection.
    pub auth: PacketAuth,
    /// The setup stream, left open for the application's own synchronisation.
    pub stream: TcpStream,
}

impl Connection {
    /// Waits until both sides call this (one byte each way).
    pub fn barrier(&mut self) -> Result<()> {
        self.stream.write_all(&[0xb7]).map_err(io)?;
        let mut b = [0u8; 1];
        self.stream.read_exact(&mut b).map_err(io)?;
        if b[0] != 0xb7 {
            return Err(peer("barrier byte wrong"));
        }
        Ok(())
    }
}

fn io(e: std::io::Error) -> VerbsError {
    if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        VerbsError::new(V, ErrorKind::Timeout(format!("peer did not answer: {e}")))
    } else {
        VerbsError::io(V, e)
    }
}
fn peer(why: impl Into<String>) -> VerbsError {
    VerbsError::new(V, ErrorKind::Peer(why.into()))
}

fn send(s: &mut TcpStream, body: &[u8]) -> Result<()> {
    let mut m = Vec::with_capacity(body.len() + 2);
    m.extend_from_slice(&(body.len() as u16).to_be_bytes());
    m.extend_from_slice(body);
    s.write_all(&m).map_err(io)
}

fn recv(s: &mut impl Read, magic: &[u8; 8]) -> Result<Vec<u8>> {
    let mut l = [0u8; 2];
    s.read_exact(&mut l).map_err(io)?;
    let n = usize::from(u16::from_be_bytes(l));
    if !(8..=MAX_MSG).contains(&n) {
        return Err(peer(format!("message length {n} out of range")));
    }
    let mut m = vec![0u8; n];
    s.read_exact(&mut m).map_err(io)?;
    if &m[..8] != magic {
        return Err(peer(format!(
            "expected {}, got {:?}",
            String::from_utf8_lossy(magic),
            String::from_utf8_lossy(&m[..8])
        )));
    }
    Ok(m)
}

fn mac(secret: Option<&[u8]>, parts: &[&[u8]]) -> [u8; 32] {
    secret.map_or([0; 32], |k| Key::from_secret(k).prove(parts))
}

fn verify(secret: Option<&[u8]>, parts: &[&[u8]], got: &[u8], who: &str) -> Result<()> {
    match secret {
        Some(k) if !Key::from_secret(k).verify(parts, got) => Err(peer(format!(
            "{who} could not prove the shared secret (authentication failed)"
        ))),
        _ => Ok(()),
    }
}

/// The fields both REQUEST and REPLY carry.
#[derive(Debug, Clone, Copy)]
struct Params {
    qpn: u32,
    psn: u32,
    gid: Gid,
    mtu: u8,
    buf: Option<BufferInfo>,
    /// The UDP port the side's RNIC listens on.
    port: u16,
    /// The packet protection the side asks for.
    auth: PacketAuth,
}

const PARAMS_LEN: usize = 4 + 4 + 16 + 1 + 1 + 8 + 4 + 8 + 2 + 1;

impl Params {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.qpn.to_be_bytes());
        out.extend_from_slice(&self.psn.to_be_bytes());
        out.extend_from_slice(&self.gid.0);
        out.push(self.mtu);
        let b = self.buf.unwrap_or_default();
        out.push(u8::from(self.buf.is_some()));
        out.extend_from_slice(&b.addr.to_be_bytes());
        out.extend_from_slice(&b.rkey.0.to_be_bytes());
        out.extend_from_slice(&b.len.to_be_bytes());
        out.extend_from_slice(&self.port.to_be_bytes());
        out.push(self.auth.code());
    }
    fn get(m: &[u8]) -> Result<Self> {
        if m.len() < PARAMS_LEN {
            return Err(peer("message too short"));
        }
        let u32_at = |i: usize| u32::from_be_bytes(m[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(m[i..i + 8].try_into().expect("8 bytes"));
        let qpn = u32_at(0);
        let psn = u32_at(4);
        if !(2..=0xff_fffe).contains(&qpn) || psn > 0xff_ffff {
            return Err(peer(format!("QPN {qpn:#x} or PSN {psn:#x} out of range")));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&m[8..24]);
        let mtu = m[24];
        if !(1..=5).contains(&mtu) {
            return Err(peer(format!("MTU code {mtu} invalid")));
        }
        let buf = match m[25] {
            0 => None,
            1 => Some(BufferInfo {
                addr: u64_at(26),
                rkey: RKey(u32_at(34)),
                len: u64_at(38),
            }),
            x => return Err(peer(format!("buffer flag {x} invalid"))),
        };
        let port = u16::from_be_bytes([m[46], m[47]]);
        if port == 0 {
            return Err(peer("UDP port 0 invalid"));
        }
        let auth = PacketAuth::from_code(m[48])
            .ok_or_else(|| peer(format!("packet protection code {} invalid", m[48])))?;
        Ok(Self {
            qpn,
            psn,
            gid: Gid(gid),
            mtu,
            buf,
            port,
            auth,
        })
    }
}

fn mtu_code(m: Mtu) -> u8 {
    m as u8
}
fn mtu_of(code: u8) -> Mtu {
    Mtu::from_bytes(1 << (u32::from(code) + 7)).unwrap_or(Mtu::Mtu1024)
}

fn local_params(
    qp: &QueuePair,
    cfg: &CmConfig,
    buf: Option<BufferInfo>,
    gid: Gid,
    psn: Psn,
) -> Result<Params> {
    Ok(Params {
        qpn: qp.qp_num().value(),
        psn: psn.value(),
        gid,
        mtu: mtu_code(cfg.mtu),
        buf,
        port: qp.local_udp_port(cfg.gid_index)?,
        auth: cfg.auth,
    })
}

/// Protects `qp` as both sides asked (the stronger of the two), with keys from the secret
/// and both nonces. Returns the mode.
fn protect_qp(
    qp: &QueuePair,
    cfg: &CmConfig,
    theirs: &Params,
    (ns, nc): (&[u8], &[u8]),
) -> Result<PacketAuth> {
    let mode = cfg.auth.max(theirs.auth);
    if mode == PacketAuth::None {
        return Ok(mode);
    }
    let Some(secret) = cfg.secret.as_deref() else {
        return Err(peer(format!(
            "packet protection ({mode}) needs a shared secret, and none is configured here"
        )));
    };
    let key = Key::from_secret(secret).derive("cm packets", &[ns, nc]);
    qp.protect(&Protection::between(
        &key,
        mode,
        qp.qp_num().value(),
        theirs.qpn,
    ))?;
    Ok(mode)
}

/// Brings `qp` up towards the peer that sent `p`: protected as both sides asked (keys from
/// the nonces), then to RTS at the smaller of the two MTUs. Returns the peer's QP, the
/// MTU and the protection.
fn bring_up(
    qp: &QueuePair,
    cfg: &CmConfig,
    p: &Params,
    psn: Psn,
    nonces: (&[u8], &[u8]),
) -> Result<(RemoteQp, Mtu, PacketAuth)> {
    let auth = protect_qp(qp, cfg, p, nonces)?;
    let mtu = mtu_of(p.mtu.min(mtu_code(cfg.mtu)));
    let remote = RemoteQp {
        qpn: Qpn::new(p.qpn),
        psn: Psn::new(p.psn),
        gid: p.gid,
    };
    let params = ConnectParams {
        sgid_index: cfg.gid_index,
        local_psn: psn,
        mtu,
        udp_port: Some(p.port),
        ..cfg.params
    };
    qp.connect(&remote, &params)?;
    Ok((remote, mtu, auth))
}

/// The server's side of the exchange on one accepted connection (one that a protocol of
/// the caller's own accepted and handed over), for `qp` (in RESET or INIT), offering `buf`.
/// The QP goes back to RESET if the exchange fails after it was brought up.
pub fn accept_stream(
    mut s: TcpStream,
    qp: &QueuePair,
    buf: Option<BufferInfo>,
    cfg: &CmConfig,
) -> Result<Connection> {
    let g = greet(&mut s, cfg)?;
    finish(s, g, qp, buf, cfg).inspect_err(|_| {
        let _ = reset(qp);
    })
}

/// Takes `qp` back to RESET after a failed exchange, for the next client.
fn reset(qp: &QueuePair) -> Result<()> {
    qp.modify(
        &crate::QpAttr {
            qp_state: crate::QpState::Reset,
            ..crate::QpAttr::default()
        },
        crate::AttrMask::STATE,
    )
}

/// A listening connection manager.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    dropped: AtomicUsize,
}

impl Listener {
    /// Listens on `addr` (`rdma_listen`).
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        Ok(Self {
            tcp: TcpListener::bind(addr).map_err(io)?,
            dropped: AtomicUsize::new(0),
        })
    }
    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.tcp.local_addr().map_err(io)
    }

    /// Accepts one connection for `qp` (in RESET or INIT), offering `buf`. The first
    /// connection decides: if it fails its handshake, so does this call (see
    /// [`Self::serve`] for a server that keeps serving).
    pub fn accept(
        &self,
        qp: &QueuePair,
        buf: Option<BufferInfo>,
        cfg: &CmConfig,
    ) -> Result<Connection> {
        let (mut s, _) = self.tcp.accept().map_err(io)?;
        let g = greet(&mut s, cfg)?;
        finish(s, g, qp, buf, cfg)
    }

    /// Serves connections until one completes the handshake for `qp` (in RESET or INIT),
    /// offering `buf`, or `wait` passes (`None`: no limit). Every connection is read on a
    /// thread of its own until it has sent a valid request (within `cfg.timeout`; see
    /// [`monel_peer::greeter`]), so a silent, slow or garbled one holds up nobody; one that
    /// fails is dropped, logged with its reason and counted ([`Self::dropped`]), and the QP
    /// goes back to RESET if the failure came after it was brought up. Connections still
    /// being read when `wait` passes are closed: a server that calls again and again keeps
    /// them with [`Self::server`].
    pub fn serve(
        &self,
        qp: &QueuePair,
        buf: Option<BufferInfo>,
        cfg: &CmConfig,
        wait: Option<Duration>,
    ) -> Result<Connection> {
        self.server(cfg)?.serve(qp, buf, wait)
    }

    /// A server for `cfg` that keeps connections across its calls: one still being read
    /// when a call's wait passes is finished by the next call.
    pub fn server(&self, cfg: &CmConfig) -> Result<Server<'_>> {
        let tcp = self.tcp.try_clone().map_err(io)?;
        let greet_cfg = cfg.clone();
        let greeter =
            Greeter::new(tcp, move |s| greet(s, &greet_cfg), cfg.timeout, "cm").map_err(io)?;
        Ok(Server {
            listener: self,
            greeter,
            cfg: cfg.clone(),
        })
    }

    /// Connections [`Self::serve`] dropped so far.
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// A listener's server side ([`Listener::server`]): connections being read live across
/// calls to [`Self::serve`].
pub struct Server<'a> {
    listener: &'a Listener,
    greeter: Greeter<Greeted, VerbsError>,
    cfg: CmConfig,
}

impl Server<'_> {
    /// Serves connections until one completes the handshake for `qp` (in RESET or INIT),
    /// offering `buf`, or `wait` passes (`None`: no limit); see [`Listener::serve`].
    pub fn serve(
        &mut self,
        qp: &QueuePair,
        buf: Option<BufferInfo>,
        wait: Option<Duration>,
    ) -> Result<Connection> {
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            let left = deadline.map_or(Duration::from_secs(1), |d| {
                d.saturating_duration_since(Instant::now())
            });
            match self.greeter.next(left).map_err(io)? {
                Some((s, from, g)) => match finish(s, g, qp, buf, &self.cfg) {
                    Ok(c) => return Ok(c),
                    Err(e) => {
                        self.greeter.drop_one(from, &e);
                        reset(qp)?;
                    }
                },
                None if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Err(VerbsError::new(
                        V,
                        ErrorKind::Timeout("no client completed the handshake".into()),
                    ));
                }
                None => {}
            }
        }
    }
}

impl Drop for Server<'_> {
    fn drop(&mut self) {
        self.listener
            .dropped
            .fetch_add(self.greeter.dropped(), Ordering::Relaxed);
        let _ = self.listener.tcp.set_nonblocking(false);
    }
}

/// A request the server read and checked, before any QP was touched.
struct Greeted {
    /// The server's nonce.
    ns: [u8; 16],
    req: Vec<u8>,
}

/// The server's first half: HELLO out, the client's REQUEST in, its length checked and,
/// with a secret, its MAC verified. Touches no QP.
fn greet(s: &mut TcpStream, cfg: &CmConfig) -> Result<Greeted> {
    s.set_read_timeout(Some(cfg.timeout)).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let secret = cfg.secret.as_deref();
    let ns = nonce();
    let mut hello = HELLO.to_vec();
    hello.push(u8::from(secret.is_some()));
    hello.extend_from_slice(&ns);
    send(s, &hello)?;
    let req = recv(s, REQ)?;
    if req.len() != 8 + PARAMS_LEN + 16 + 32 {
        return Err(peer("request has the wrong length"));
    }
    let body = &req[..8 + PARAMS_LEN + 16];
    if let Err(e) = verify(
        secret,
        &[b"client", &ns, body],
        &req[body.len()..],
        "client",
    ) {
        let mut rep = REP.to_vec();
        rep.push(1);
        let _ = send(s, &rep);
        return Err(e);
    }
    Params::get(&req[8..])?;
    Ok(Greeted { ns, req })
}

/// The server's second half: the QP brought up towards the client, REPLY, READY.
fn finish(
    mut s: TcpStream,
    g: Greeted,
    qp: &QueuePair,
    buf: Option<BufferInfo>,
    cfg: &CmConfig,
) -> Result<Connection> {
    let secret = cfg.secret.as_deref();
    let (ns, req) = (g.ns, g.req);
    let body = &req[..8 + PARAMS_LEN + 16];
    let nc = &req[8 + PARAMS_LEN..8 + PARAMS_LEN + 16];
    let theirs = Params::get(&req[8..])?;
    let gid = qp_gid(qp, cfg)?;
    let psn = random_psn();
    let (remote, mtu, auth) = bring_up(qp, cfg, &theirs, psn, (&ns, nc))?;
    let mut rep = REP.to_vec();
    rep.push(0);
    local_params(qp, cfg, buf, gid, psn)?.put(&mut rep);
    let m = mac(secret, &[b"server", nc, body, &rep]);
    rep.extend_from_slice(&m);
    send(&mut s, &rep)?;
    let rdy = recv(&mut s, RDY)?;
    verify(secret, &[b"ready", &ns, nc], &rdy[8..], "client")?;
    Ok(Connection {
        remote,
        remote_buf: theirs.buf,
        mtu,
        auth,
        stream: s,
    })
}

fn qp_gid(qp: &QueuePair, cfg: &CmConfig) -> Result<Gid> {
    Ok(qp.device().gid(cfg.gid_index)?.gid)
}

/// Connects `qp` to a listening peer (`rdma_connect`), offering `buf`. Retries the TCP
/// connect until `cfg.timeout`.
pub fn connect(
    addr: SocketAddr,
    qp: &QueuePair,
    buf: Option<BufferInfo>,
    cfg: &CmConfig,
) -> Result<Connection> {
    connect_stream(dial(addr, cfg.timeout)?, qp, buf, cfg)
}

/// A TCP connection to `addr`, dialled again while it is refused (the server not
/// listening yet) until `timeout` has passed.
pub fn dial(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(VerbsError::new(
                    V,
                    ErrorKind::Timeout(format!("connect {addr}: {e}")),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// [`connect`] over a connection already open to the server (one that a protocol of the
/// caller's own opened and handed over).
pub fn connect_stream(
    mut s: TcpStream,
    qp: &QueuePair,
    buf: Option<BufferInfo>,
    cfg: &CmConfig,
) -> Result<Connection> {
    s.set_read_timeout(Some(cfg.timeout)).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let secret = cfg.secret.as_deref();
    let hello = recv(&mut s, HELLO)?;
    if hello.len() != 8 + 1 + 16 {
        return Err(peer("hello has the wrong length"));
    }
    if hello[8] == 1 && secret.is_none() {
        return Err(peer(
            "server requires a shared secret and none is configured here",
        ));
    }
    let ns = hello[9..25].to_vec();
    let nc = nonce();
    let gid = qp_gid(qp, cfg)?;
    let psn = random_psn();
    let mut req = REQ.to_vec();
    local_params(qp, cfg, buf, gid, psn)?.put(&mut req);
    req.extend_from_slice(&nc);
    let m = mac(secret, &[b"client", &ns, &req]);
    let body_len = req.len();
    req.extend_from_slice(&m);
    send(&mut s, &req)?;
    let rep = recv(&mut s, REP)?;
    match rep.get(8) {
        Some(0) => {}
        Some(1) => return Err(peer("server rejected us: authentication failed")),
        _ => return Err(peer("malformed reply")),
    }
    if rep.len() != 9 + PARAMS_LEN + 32 {
        return Err(peer("reply has the wrong length"));
    }
    let (rbody, rmac) = rep.split_at(9 + PARAMS_LEN);
    verify(
        secret,
        &[b"server", &nc, &req[..body_len], rbody],
        rmac,
        "server",
    )?;
    let theirs = Params::get(&rep[9..])?;
    let (remote, mtu, auth) = bring_up(qp, cfg, &theirs, psn, (&ns, &nc))?;
    let mut rdy = RDY.to_vec();
    rdy.extend_from_slice(&mac(secret, &[b"ready", &ns, &nc]));
    send(&mut s, &rdy)?;
    Ok(Connection {
        remote,
        remote_buf: theirs.buf,
        mtu,
        auth,
        stream: s,
    })
}

/// The connection manager's parsers on arbitrary bytes, for the fuzzers (`fuzz/`).
#[doc(hidden)]
pub fn fuzz_messages(bytes: &[u8]) {
    for magic in [HELLO, REQ, REP, RDY] {
        if let Ok(m) = recv(&mut std::io::Cursor::new(bytes), magic) {
            let _ = Params::get(m.get(8..).unwrap_or_default());
        }
    }
    let _ = Params::get(bytes);
}
