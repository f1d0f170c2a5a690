//! The shared-memory link: agents on one host move exact bytes both ways by copies between
//! their processes, with the notification after the data; bad descriptors fail alone; a
//! revoked segment's memory is left alone once `deregister` returns; a peer process killed
//! mid-batch fails that batch alone; Auto takes shared memory on one host.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{desc, pattern};
use monel_verbs::Device;
use monel_xfer::{Agent, AgentConfig, DescState, Op, Transport, TransportKind};

const SECRET: &[u8] = b"job secret for the shared-memory tests";
const T: Duration = Duration::from_secs(20);

fn agent(name: &str, ip: &str, transport: Transport) -> Agent {
    let dev = Device::bind(ip.parse().unwrap()).unwrap();
    let listen: SocketAddr = format!("{ip}:0").parse().unwrap();
    let mut cfg = AgentConfig::new(name, dev, listen, Some(SECRET.to_vec()));
    cfg.transport = transport;
    cfg.udp_port = 0;
    Agent::new(cfg).unwrap()
}

#[test]
fn shared_memory_peers_move_exact_bytes_and_the_notification_follows_the_data() {
    let decode = agent("decode-s", "127.0.3.61", Transport::Shm);
    let prefill = agent("prefill-s", "127.0.3.62", Transport::Auto);
    decode.register("kv", 16 << 20).unwrap();
    prefill.register("blocks", 16 << 20).unwrap();
    let src = pattern(16 << 20, 0x31);
    prefill.write_local("blocks", 0, &src).unwrap();
    let kv = pattern(16 << 20, 0x42);
    decode.write_local("kv", 0, &kv).unwrap();
    assert_eq!(prefill.connect(decode.address()).unwrap(), "decode-s");
    assert_eq!(prefill.transport("decode-s").unwrap(), TransportKind::Shm);
    assert_eq!(prefill.lanes("decode-s").unwrap(), 2); // two copying threads
    common::a_batch_moves_exact_bytes(&decode, &prefill, "decode-s", "prefill-s", &src, &kv);
    let mut back = vec![0u8; 4096];
    // The other way too: the target was told of the link and writes back.
    assert_eq!(decode.transport("prefill-s").unwrap(), TransportKind::Shm);
    let id = decode
        .transfer(
            "prefill-s",
            &[desc(Op::Write, "kv", 0, "blocks", 0, 4096)],
            None,
        )
        .unwrap();
    assert_eq!(decode.wait(id, T).unwrap(), [DescState::Done]);
    prefill.read_local("blocks", 0, &mut back).unwrap();
    assert!(back[..] == kv[..4096]);
}

#[test]
fn bad_descriptors_fail_alone_over_shared_memory() {
    let decode = agent("decode-b", "127.0.3.63", Transport::Shm);
    let prefill = agent("prefill-b", "127.0.3.64", Transport::Shm);
    decode.register("kv", 4096).unwrap();
    prefill.register("src", 4096).unwrap();
    prefill.write_local("src", 0, &[7u8; 4096]).unwrap();
    prefill.connect(decode.address()).unwrap();
    assert_eq!(prefill.transport("decode-b").unwrap(), TransportKind::Shm);
    common::bad_descriptors_fail_alone(&decode, &prefill, "decode-b");
}

/// The peer copies into the target's memory itself, so `deregister` must not return while
/// a copy into the segment may still come: the caller frees the memory right after.
#[test]
fn a_revoked_segment_is_left_alone_once_deregister_returns() {
    let decode = agent("decode-r", "127.0.3.65", Transport::Shm);
    let prefill = agent("prefill-r", "127.0.3.66", Transport::Shm);
    let mut mem = vec![0u8; 8 << 20];
    // SAFETY: `mem` outlives the segment (deregistered below, before it is read or dropped).
    #[allow(unsafe_code)]
    unsafe {
        decode
            .register_in_place("kv", mem.as_mut_ptr(), mem.len())
            .unwrap();
    }
    prefill.register("src", 8 << 20).unwrap();
    prefill.write_local("src", 0, &[0xAB; 8 << 20]).unwrap();
    prefill.connect(decode.address()).unwrap();
    common::writes_stop_at_the_withdrawal(&decode, &prefill, "decode-r", &mut mem);
    // The link goes on: the peer was not cut off.
    assert_eq!(prefill.peers(), ["decode-r"]);
    decode.register("kv2", 4096).unwrap();
    let t0 = Instant::now();
    while prefill.remote_segments("decode-r").unwrap().len() != 1 {
        assert!(t0.elapsed() < T);
        std::thread::sleep(Duration::from_millis(2));
    }
    let id = prefill
        .transfer(
            "decode-r",
            &[desc(Op::Write, "src", 0, "kv2", 0, 4096)],
            None,
        )
        .unwrap();
    assert_eq!(prefill.wait(id, T).unwrap(), [DescState::Done]);
}

/// The victim of [`a_shared_memory_peer_killed_mid_batch_fails_that_batch_alone`].
#[test]
#[ignore = "not a test alone: the child process that a_shared_memory_peer_killed_mid_batch_fails_that_batch_alone (in the default suite) starts and kills"]
fn shm_victim_process() {
    let ip = std::env::var("XFER_VICTIM_IP").expect("XFER_VICTIM_IP: run by the killing test");
    let a = agent("a", &ip, Transport::Shm);
    a.register("dst", 64 << 20).unwrap();
    println!("ADDR {}", a.address());
    std::thread::sleep(T);
}

#[test]
fn a_shared_memory_peer_killed_mid_batch_fails_that_batch_alone() {
    let (victim, addr) = common::spawn_victim("shm_victim_process", "127.0.3.67");
    let c = agent("c", "127.0.3.68", Transport::Shm);
    let b = agent("b", "127.0.3.69", Transport::Shm);
    c.register("dst", 1 << 20).unwrap();
    b.register("src", 64 << 20).unwrap();
    assert_eq!(b.connect(addr).unwrap(), "a");
    assert_eq!(b.transport("a").unwrap(), TransportKind::Shm);
    b.connect(c.address()).unwrap();
    // Many rounds over 64 MiB, so the kill lands mid-batch.
    common::a_killed_peer_fails_its_batch_alone(&b, victim, 1024);
    assert_eq!(b.peers(), ["c"]);
}
