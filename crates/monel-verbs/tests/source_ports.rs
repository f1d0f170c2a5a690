//! Each QP sends from its own UDP source port, as RoCE NICs and rxe do, so switches that hash
//! the 5-tuple (ECMP) spread QPs over paths: the port is stable for the QP's life, differs
//! between QPs, is not the RoCE port, and the ICRC covers it. With the feature off, every
//! packet leaves from the RoCE port. A plain UDP socket plays the peer and reads the wire.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::*;
use monel_verbs::*;
use monel_wire::FrameRepr;

const PORT: u16 = 24880;
const PEER_PORT: u16 = 24881;
const QPS: u32 = 16;

/// Whether `roce`'s ICRC is right for a datagram from `src` to `dst` (IPv4 ID 0 to 63, as a
/// receiver tries for GSO segments).
fn icrc_ok(src: SocketAddr, dst: SocketAddr, roce: &[u8]) -> bool {
    (0..64u16).any(|ident| {
        let mut buf = vec![0u8; 28 + roce.len()];
        buf[28..].copy_from_slice(roce);
        FrameRepr {
            src: src.ip().into(),
            dst: dst.ip().into(),
            src_port: src.port(),
            dst_port: dst.port(),
            traffic_class: 0,
            hop_limit: 64,
            ident,
            flow_label: 0,
        }
        .emit(&mut buf, roce.len())
        .unwrap();
        buf[28..] == *roce
    })
}

/// Source ports seen per destination QPN when `QPS` QPs on `ip` each SEND to the listener
/// (which never answers, so each retransmits) until every QP was seen `times` times.
fn ports_seen(ip: &str, peer_ip: &str, source_ports: usize) -> HashMap<u32, BTreeSet<u16>> {
    let listener = UdpSocket::bind(format!("{peer_ip}:{PEER_PORT}")).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let dst = listener.local_addr().unwrap();
    let dev = Device::bind(ip.parse().unwrap()).unwrap();
    let ctx = Context::open(
        &dev,
        ContextConfig {
            udp_port: PORT,
            source_ports,
            ..ContextConfig::default()
        },
    )
    .unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256).unwrap();
    let mr = pd.reg_mr(vec![7u8; 64], AccessFlags::LOCAL_WRITE).unwrap();
    let peer_gid = Gid::from_ip(peer_ip.parse().unwrap());
    let mut qps = Vec::new();
    for i in 0..QPS {
        let qp = rc_qp(&pd, &cq);
        let remote = RemoteQp {
            qpn: Qpn::new(0x1000 + i),
            psn: Psn::new(0),
            gid: peer_gid,
        };
        let params = ConnectParams {
            local_psn: Psn::new(0),
            // 4.096 us x 2^8 = 1 ms between retransmissions.
            timeout: 8,
            udp_port: Some(PEER_PORT),
            ..ConnectParams::default()
        };
        qp.connect(&remote, &params).unwrap();
        qp.post_send(SendWr {
            wr_id: u64::from(i),
            op: SendOp::Send,
            sg_list: vec![mr.sge(0, 8)],
            flags: signaled(),
        })
        .unwrap();
        qps.push(qp);
    }
    let mut seen: HashMap<u32, BTreeSet<u16>> = HashMap::new();
    let mut count: HashMap<u32, usize> = HashMap::new();
    let t0 = Instant::now();
    let mut buf = [0u8; 2048];
    while count.len() < QPS as usize || count.values().any(|&c| c < 3) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "saw only {count:?} after 10 s"
        );
        let Ok((n, src)) = listener.recv_from(&mut buf) else {
            continue;
        };
        let roce = &buf[..n];
        assert_eq!(src.ip(), ip.parse::<IpAddr>().unwrap());
        assert!(icrc_ok(src, dst, roce), "bad ICRC from {src}");
        let qpn = u32::from_be_bytes([0, roce[5], roce[6], roce[7]]);
        assert!(
            (0x1000..0x1000 + QPS).contains(&qpn),
            "unexpected QPN {qpn:#x}"
        );
        seen.entry(qpn).or_default().insert(src.port());
        *count.entry(qpn).or_default() += 1;
    }
    seen
}

#[test]
fn each_qp_sends_from_its_own_stable_source_port() {
    let seen = ports_seen("127.0.0.130", "127.0.0.131", 8);
    for (qpn, ports) in &seen {
        assert_eq!(
            ports.len(),
            1,
            "QP {qpn:#x} changed its source port: {ports:?}"
        );
    }
    let ports: BTreeSet<u16> = seen.values().flatten().copied().collect();
    assert!(!ports.contains(&PORT), "{ports:?} includes the RoCE port");
    // 16 QPs hashed over 8 ports: fewer than 3 distinct has probability below 1e-5.
    assert!(ports.len() >= 3, "16 QPs share only {ports:?}");
    assert!(ports.len() <= 8, "more ports than lanes: {ports:?}");
}

#[test]
fn without_source_ports_everything_leaves_from_the_roce_port() {
    let seen = ports_seen("127.0.0.132", "127.0.0.133", 0);
    let ports: BTreeSet<u16> = seen.values().flatten().copied().collect();
    assert_eq!(ports, BTreeSet::from([PORT]));
}

#[test]
fn too_many_source_ports_is_a_named_error() {
    let dev = Device::bind("127.0.0.134".parse().unwrap()).unwrap();
    let err = Context::open(
        &dev,
        ContextConfig {
            udp_port: PORT,
            source_ports: 100_000,
            ..ContextConfig::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("source_ports 100000"), "{err}");
}
