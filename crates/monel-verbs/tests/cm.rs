//! The connection manager: exchange, RTS on both sides, shared-secret authentication, and
//! garbage from the peer.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use common::*;
use monel_verbs::cm::{self, BufferInfo, CmConfig, Listener};
use monel_verbs::*;

fn cfg(secret: Option<&str>) -> CmConfig {
    CmConfig {
        secret: secret.map(|s| s.as_bytes().to_vec()),
        timeout: Duration::from_secs(5),
        ..CmConfig::default()
    }
}

type Met = Result<(cm::Connection, Side)>;

/// READs the 4 KiB buffer `b` the peer offered, through side `c`'s QP; checks that the READ
/// completed and returns the bytes.
fn read_remote(c: &Side, b: BufferInfo) -> Vec<u8> {
    let dst =
        c.pd.reg_mr(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
            .unwrap();
    c.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Read(RemoteAddr {
            addr: b.addr,
            rkey: b.rkey,
        }),
        sg_list: vec![dst.sge(0, 4096)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&c.cq).status, WcStatus::Success);
    let mut got = vec![0u8; 4096];
    dst.read(0, &mut got).unwrap();
    got
}

/// Runs a server with `server_secret` and a client with `client_secret`; returns both results.
fn meet(
    x: u8,
    port: u16,
    server_secret: Option<&'static str>,
    client_secret: Option<&'static str>,
) -> (Met, Met) {
    meet_with(x, port, cfg(server_secret), cfg(client_secret))
}

/// [`meet`] with whole configurations.
fn meet_with(x: u8, port: u16, server: CmConfig, client: CmConfig) -> (Met, Met) {
    let l = Listener::bind(format!("127.0.0.{x}:0").parse().unwrap()).unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let srv = thread::spawn(move || {
        let s = side(&format!("127.0.0.{x}"), port);
        let mr =
            s.pd.reg_mr(
                vec![7u8; 4096],
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        let buf = BufferInfo {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: 4096,
        };
        let r = l.accept(&s.qp, Some(buf), &server);
        std::mem::forget(mr);
        r.map(|c| (c, s))
    });
    let c = side(&format!("127.0.0.{}", x + 1), port);
    let r = cm::connect(addr, &c.qp, None, &client).map(|conn| (conn, c));
    (srv.join().unwrap(), r)
}

#[test]
fn exchange_brings_both_to_rts_and_read_works() {
    let (s, c) = meet(70, 24801, Some("k3y"), Some("k3y"));
    let (mut sc, s) = s.unwrap();
    let (mut cc, c) = c.unwrap();
    assert_eq!(s.qp.query().unwrap().0, QpState::Rts);
    assert_eq!(c.qp.query().unwrap().0, QpState::Rts);
    assert_eq!(cc.remote.qpn, s.qp.qp_num());
    assert_eq!(sc.remote.qpn, c.qp.qp_num());
    assert_eq!(cc.mtu, Mtu::Mtu4096);
    assert!(sc.remote_buf.is_none());
    let b = cc.remote_buf.expect("server offered a buffer");
    assert!(read_remote(&c, b).iter().all(|&x| x == 7));
    let t = thread::spawn(move || sc.barrier().map(|()| sc));
    cc.barrier().unwrap();
    t.join().unwrap().unwrap();
}

/// The connection takes the stronger side's packet protection, keyed from the secret: a
/// client asking for encryption gets it from a server that asks for none, and a READ
/// crosses. Protection without a secret is refused, naming the secret.
#[test]
fn packet_protection_is_negotiated_and_needs_the_secret() {
    let with = |auth| CmConfig {
        auth,
        ..cfg(Some("k3y"))
    };
    let (s, c) = meet_with(
        78,
        24806,
        with(protect::PacketAuth::None),
        with(protect::PacketAuth::Encrypt),
    );
    let (sc, s) = s.unwrap();
    let (cc, c) = c.unwrap();
    assert_eq!(
        (sc.auth, cc.auth),
        (protect::PacketAuth::Encrypt, protect::PacketAuth::Encrypt)
    );
    let b = cc.remote_buf.expect("server offered a buffer");
    assert!(read_remote(&c, b).iter().all(|&x| x == 7));
    assert_eq!(
        s.ctx.counters().auth_failed + c.ctx.counters().auth_failed,
        0
    );
    let bare = CmConfig {
        auth: protect::PacketAuth::Mac,
        ..cfg(None)
    };
    let (s, c) = meet_with(80, 24807, bare, cfg(None));
    let se = s.unwrap_err().to_string();
    assert!(se.contains("needs a shared secret"), "{se}");
    assert!(c.is_err());
}

#[test]
fn wrong_secret_is_refused_on_both_sides() {
    let (s, c) = meet(72, 24802, Some("right"), Some("wrong"));
    let se = s.unwrap_err();
    let ce = c.unwrap_err();
    assert!(
        se.to_string()
            .contains("client could not prove the shared secret"),
        "{se}"
    );
    assert!(ce.to_string().contains("authentication failed"), "{ce}");
}

#[test]
fn missing_secret_is_refused() {
    let (s, c) = meet(74, 24803, Some("right"), None);
    assert!(
        c.unwrap_err()
            .to_string()
            .contains("requires a shared secret")
    );
    assert!(s.is_err());
    // A client that insists on a secret refuses a server that cannot prove one.
    let (s, c) = meet(76, 24804, None, Some("right"));
    let ce = c.unwrap_err();
    assert!(ce.to_string().contains("server could not prove"), "{ce}");
    let _ = s;
}

#[test]
fn garbage_peer_gets_a_typed_error_not_a_hang() {
    let s = side("127.0.0.78", 24805);
    let l = Listener::bind("127.0.0.78:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let mut g = TcpStream::connect(addr).unwrap();
        let _ = g.write_all(b"\x00\x30GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdefghijk");
        thread::sleep(Duration::from_millis(200));
    });
    let e = l.accept(&s.qp, None, &cfg(None)).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Peer(_)), "{e}");
    t.join().unwrap();
    // A peer that says nothing: the accept times out.
    let t = thread::spawn(move || {
        let _g = TcpStream::connect(addr).unwrap();
        thread::sleep(Duration::from_secs(7));
    });
    let e = l.accept(&s.qp, None, &cfg(None)).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Timeout(_)), "{e}");
    t.join().unwrap();
}

#[test]
fn two_devices_on_one_address_meet_through_their_own_ports() {
    // Both RNICs bind 127.0.0.80 on ephemeral UDP ports; only the exchange can tell each
    // side where the other listens.
    let l = Listener::bind("127.0.0.80:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let srv = thread::spawn(move || {
        let s = side("127.0.0.80", 0);
        let mr =
            s.pd.reg_mr(
                vec![0u8; 4096],
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        let buf = BufferInfo {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: 4096,
        };
        let mut conn = l.accept(&s.qp, Some(buf), &cfg(None)).unwrap();
        conn.barrier().unwrap();
        let got = mr.lock().unwrap().to_vec();
        drop(s);
        got
    });
    let c = side("127.0.0.80", 0);
    assert_ne!(c.qp.local_udp_port(0).unwrap(), 0);
    let mut conn = cm::connect(addr, &c.qp, None, &cfg(None)).unwrap();
    let b = conn.remote_buf.unwrap();
    let src =
        c.pd.reg_mr(
            (0..4096).map(|i| (i % 251) as u8).collect(),
            AccessFlags::NONE,
        )
        .unwrap();
    c.qp.post_send(SendWr {
        wr_id: 9,
        op: SendOp::Write(RemoteAddr {
            addr: b.addr,
            rkey: b.rkey,
        }),
        sg_list: vec![src.sge(0, 4096)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&c.cq).status, WcStatus::Success);
    conn.barrier().unwrap();
    let got = srv.join().unwrap();
    assert!(got.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
}

/// A serving listener outlives hostile connections: garbage, an oversized length prefix, a
/// client without the secret, and silent connections held open all the while are dropped
/// (and counted), and the real client that comes after them connects and reads the
/// server's memory.
#[test]
fn a_serving_listener_survives_hostile_connections_and_serves_the_real_client() {
    let (x, port) = (76u8, 24806);
    let l = Listener::bind(format!("127.0.0.{x}:0").parse().unwrap()).unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    // Silent connections, opened first and kept open until the end.
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(&[0x5a; 200]).unwrap();
    let mut huge = TcpStream::connect(addr).unwrap();
    huge.write_all(&[0xff, 0xff, 1, 2, 3]).unwrap();
    let intruder = thread::spawn(move || {
        let c = side(&format!("127.0.0.{}", x + 2), port);
        cm::connect(addr, &c.qp, None, &cfg(None)).err()
    });
    let srv = thread::spawn(move || {
        let s = side(&format!("127.0.0.{x}"), port);
        let mr =
            s.pd.reg_mr(vec![9u8; 4096], AccessFlags::REMOTE_READ)
                .unwrap();
        let buf = BufferInfo {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: 4096,
        };
        let wait = Some(Duration::from_secs(20));
        let r = l.serve(&s.qp, Some(buf), &cfg(Some("k3y")), wait);
        (r.map(|c| (c, s, mr)), l.dropped())
    });
    let e = intruder
        .join()
        .unwrap()
        .expect("the intruder without the secret is refused");
    assert!(e.to_string().contains("secret"), "{e}");
    // The real client comes last, after every hostile connection is in.
    thread::sleep(Duration::from_millis(200));
    let c = side(&format!("127.0.0.{}", x + 1), port);
    let cc = cm::connect(addr, &c.qp, None, &cfg(Some("k3y"))).unwrap();
    let b = cc.remote_buf.expect("the server offered its buffer");
    assert!(read_remote(&c, b).iter().all(|&v| v == 9));
    let (served, dropped) = srv.join().unwrap();
    served.expect("the server accepted the real client");
    // Garbage, the oversized prefix and the intruder; silent ones are still pending.
    assert!(dropped >= 3, "{dropped} dropped");
    drop(silent);
}

/// A server called again and again with a short wait (as a long-lived agent polls its
/// listener) keeps a connection whose handshake spans the end of one wait: a client whose
/// request crawls through a proxy for 600 ms still connects, though every wait is 50 ms.
#[test]
fn a_kept_server_finishes_a_handshake_that_spans_its_waits() {
    use std::io::Read;
    use std::net::TcpListener;
    let (x, port) = (82u8, 24808);
    let l = Listener::bind(format!("127.0.0.{x}:0").parse().unwrap()).unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    // The proxy: the server's bytes pass at once, the client's after a pause.
    let front = TcpListener::bind(format!("127.0.0.{}:0", x + 1)).unwrap();
    let front_addr = front.local_addr().unwrap();
    let proxy = thread::spawn(move || {
        let (mut client, _) = front.accept().unwrap();
        let mut server = TcpStream::connect(addr).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let down = thread::spawn(move || std::io::copy(&mut s2, &mut c2));
        let mut buf = [0u8; 4096];
        let mut first = true;
        loop {
            let n = client.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            if first {
                thread::sleep(Duration::from_millis(600));
                first = false;
            }
            if server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = server.shutdown(std::net::Shutdown::Both);
        let _ = down.join();
    });
    let srv = thread::spawn(move || {
        let s = side(&format!("127.0.0.{x}"), port);
        let mut server = l.server(&cfg(Some("k3y"))).unwrap();
        let mut waits = 0;
        let conn = loop {
            match server.serve(&s.qp, None, Some(Duration::from_millis(50))) {
                Ok(c) => break c,
                Err(e) if matches!(e.kind, ErrorKind::Timeout(_)) && waits < 200 => waits += 1,
                Err(e) => panic!("after {waits} waits: {e}"),
            }
        };
        (conn, s, waits)
    });
    let c = side(&format!("127.0.0.{}", x + 2), port);
    let cc = cm::connect(front_addr, &c.qp, None, &cfg(Some("k3y")));
    let (_sc, s, waits) = srv.join().unwrap();
    cc.expect("the slow client connects");
    assert!(
        waits >= 5,
        "the handshake spanned {waits} waits, expected several"
    );
    assert_eq!(s.qp.query().unwrap().0, QpState::Rts);
    assert_eq!(c.qp.query().unwrap().0, QpState::Rts);
    drop(c);
    proxy.join().unwrap();
}
