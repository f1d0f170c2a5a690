//! The TCP link: agents that reach each other over TCP move exact bytes both ways with the
//! notification after the data, fail bad descriptors alone, refuse a peer without the job
//! secret, and an agent that cannot use RDMA with its peer falls back to TCP.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{desc, pattern};
use monel_verbs::Device;
use monel_xfer::{Agent, AgentConfig, Op, Transport};

const SECRET: &[u8] = b"job secret for the tcp tests";
const T: Duration = Duration::from_secs(20);

fn agent(name: &str, ip: &str, secret: Option<&[u8]>, transport: Transport) -> Agent {
    let dev = Device::bind(ip.parse().unwrap()).unwrap();
    let listen: SocketAddr = format!("{ip}:0").parse().unwrap();
    let mut cfg = AgentConfig::new(name, dev, listen, secret.map(<[u8]>::to_vec));
    cfg.transport = transport;
    cfg.udp_port = 0;
    Agent::new(cfg).unwrap()
}

#[test]
fn tcp_peers_move_exact_bytes_and_the_notification_follows_the_data() {
    let decode = agent("decode-t", "127.0.3.31", Some(SECRET), Transport::Tcp);
    let prefill = agent("prefill-t", "127.0.3.32", Some(SECRET), Transport::Tcp);
    decode.register("kv", 16 << 20).unwrap();
    prefill.register("blocks", 16 << 20).unwrap();
    let src = pattern(16 << 20, 0x11);
    prefill.write_local("blocks", 0, &src).unwrap();
    let kv = pattern(16 << 20, 0x22);
    decode.write_local("kv", 0, &kv).unwrap();
    assert_eq!(prefill.connect(decode.address()).unwrap(), "decode-t");
    assert_eq!(prefill.transport("decode-t").unwrap(), "tcp");
    // Two connections, slices spread over both; the target sees both too.
    assert_eq!(prefill.lanes("decode-t").unwrap(), 2);
    let t0 = Instant::now();
    while decode.lanes("prefill-t").unwrap_or(0) != 2 {
        assert!(t0.elapsed() < T, "the target never saw the second lane");
        std::thread::sleep(Duration::from_millis(5));
    }
    common::a_batch_moves_exact_bytes(&decode, &prefill, "decode-t", "prefill-t", &src, &kv);
}

#[test]
fn bad_descriptors_fail_alone_over_tcp() {
    let decode = agent("decode-u", "127.0.3.33", Some(SECRET), Transport::Tcp);
    let prefill = agent("prefill-u", "127.0.3.34", Some(SECRET), Transport::Tcp);
    decode.register("kv", 4096).unwrap();
    prefill.register("src", 4096).unwrap();
    prefill.write_local("src", 0, &[7u8; 4096]).unwrap();
    prefill.connect(decode.address()).unwrap();
    common::bad_descriptors_fail_alone(&decode, &prefill, "decode-u");
}

#[test]
fn a_tcp_peer_without_the_secret_is_refused_and_the_listener_goes_on() {
    let decode = agent("decode-v", "127.0.3.35", Some(SECRET), Transport::Tcp);
    let intruder = agent("intruder-v", "127.0.3.36", Some(b"guess"), Transport::Tcp);
    let e = intruder.connect(decode.address()).unwrap_err();
    assert!(e.to_string().contains("authentication failed"), "{e}");
    let bare = agent("bare-v", "127.0.3.36", None, Transport::Tcp);
    let e = bare.connect(decode.address()).unwrap_err();
    assert!(e.to_string().contains("requires the job secret"), "{e}");
    let friend = agent("friend-v", "127.0.3.37", Some(SECRET), Transport::Tcp);
    assert_eq!(friend.connect(decode.address()).unwrap(), "decode-v");
    // The friend's introduction reaches the decode side in its own time.
    let t0 = Instant::now();
    while decode.peers() != ["friend-v"] {
        assert!(t0.elapsed() < T, "{:?}", decode.peers());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_agent_falls_back_to_tcp_where_rdma_is_refused() {
    let decode = agent("decode-w", "127.0.3.38", Some(SECRET), Transport::Tcp);
    let auto = agent("auto-w", "127.0.3.39", Some(SECRET), Transport::Auto);
    let rdma = agent("rdma-w", "127.0.3.40", Some(SECRET), Transport::Rdma);
    assert!(
        rdma.connect(decode.address()).is_err(),
        "an RDMA-only peer is refused"
    );
    assert_eq!(auto.connect(decode.address()).unwrap(), "decode-w");
    assert_eq!(auto.transport("decode-w").unwrap(), "tcp");
    // With a peer that takes RDMA and not shared memory, Auto picks RDMA.
    let other = agent("other-w", "127.0.3.41", Some(SECRET), Transport::Rdma);
    assert_eq!(auto.connect(other.address()).unwrap(), "other-w");
    assert_eq!(auto.transport("other-w").unwrap(), "rdma");
}

/// An agent that goes right after its last batch still delivers that batch's notification
/// (dropping it flushes what was sent), over either link.
#[test]
fn the_last_notification_arrives_when_the_sender_goes_at_once() {
    for (k, t) in [Transport::Tcp, Transport::Rdma].into_iter().enumerate() {
        let decode = agent(
            "decode-x",
            &format!("127.0.3.{}", 42 + 2 * k),
            Some(SECRET),
            t,
        );
        decode.register("kv", 1 << 20).unwrap();
        for round in 0..5u8 {
            let prefill = agent(
                "prefill-x",
                &format!("127.0.3.{}", 43 + 2 * k),
                Some(SECRET),
                t,
            );
            prefill.register("src", 1 << 20).unwrap();
            prefill.connect(decode.address()).unwrap();
            let d = [desc(Op::Write, "src", 0, "kv", 0, 1 << 20)];
            let id = prefill
                .transfer("decode-x", &d, Some(vec![round; 100]))
                .unwrap();
            prefill.wait(id, T).unwrap();
            let id = prefill
                .transfer("decode-x", &[], Some(vec![round; 10]))
                .unwrap();
            prefill.wait(id, T).unwrap();
            drop(prefill);
            let mut got = Vec::new();
            let t0 = Instant::now();
            while got.len() < 2 {
                got.extend(decode.wait_notifications(Duration::from_millis(100)));
                assert!(
                    t0.elapsed() < T,
                    "{t:?} round {round}: {} of 2 notifications",
                    got.len()
                );
            }
            assert_eq!(got[0].payload, vec![round; 100], "{t:?}");
            assert_eq!(got[1].payload, vec![round; 10], "{t:?}");
        }
    }
}
