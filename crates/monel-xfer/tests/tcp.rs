//! The TCP link: agents that reach each other over TCP move exact bytes both ways with the
//! notification after the data, fail bad descriptors alone, refuse a peer without the job
//! secret, and an agent that cannot use RDMA with its peer falls back to TCP. Bytes land
//! straight from the socket in the target's memory, so a withdrawn segment is written no
//! more once `deregister` returns, even with a peer that stalls in the middle of a put.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{desc, pattern};
use monel_verbs::Device;
use monel_xfer::stream::{self, Frame, HEADER};
use monel_xfer::{Agent, AgentConfig, DescState, Msg, Op, Transport, TransportKind, XferError};

const SECRET: &[u8] = b"job secret for the tcp tests";
const T: Duration = Duration::from_secs(20);

fn config(name: &str, ip: &str, secret: Option<&[u8]>, transport: Transport) -> AgentConfig {
    let dev = Device::bind(ip.parse().unwrap()).unwrap();
    let listen: SocketAddr = format!("{ip}:0").parse().unwrap();
    let mut cfg = AgentConfig::new(name, dev, listen, secret.map(<[u8]>::to_vec));
    cfg.transport = transport;
    cfg.udp_port = 0;
    cfg
}

fn agent(name: &str, ip: &str, secret: Option<&[u8]>, transport: Transport) -> Agent {
    Agent::new(config(name, ip, secret, transport)).unwrap()
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
    assert_eq!(prefill.transport("decode-t").unwrap(), TransportKind::Tcp);
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
    assert_eq!(auto.transport("decode-w").unwrap(), TransportKind::Tcp);
    // With a peer that takes RDMA and not shared memory, Auto picks RDMA.
    let other = agent("other-w", "127.0.3.41", Some(SECRET), Transport::Rdma);
    assert_eq!(auto.connect(other.address()).unwrap(), "other-w");
    assert_eq!(auto.transport("other-w").unwrap(), TransportKind::Roce);
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

/// A target deregisters memory it registered in place while a peer keeps writing into it
/// over TCP: once `deregister` returns, not one more byte lands there (the slices still
/// coming fail with a remote access error), and the initiator's batches all end.
#[test]
fn a_withdrawn_segment_takes_no_bytes_once_deregister_returns() {
    let decode = agent("decode-y", "127.0.3.46", Some(SECRET), Transport::Tcp);
    let prefill = agent("prefill-y", "127.0.3.47", Some(SECRET), Transport::Tcp);
    const LEN: usize = 32 << 20;
    let mut kv = vec![0u8; LEN];
    // SAFETY: `kv` outlives the segment (deregistered below, before `kv` is touched or
    // dropped), and the test reads it only after the deregistration.
    #[allow(unsafe_code)]
    unsafe {
        decode
            .register_in_place("kv", kv.as_mut_ptr(), LEN)
            .unwrap();
    }
    prefill.register("src", LEN).unwrap();
    prefill.write_local("src", 0, &[0x5a; LEN]).unwrap();
    prefill.connect(decode.address()).unwrap();
    let (done, refused) =
        common::writes_stop_at_the_withdrawal(&decode, &prefill, "decode-y", &mut kv);
    eprintln!("{done} WRITEs landed before the withdrawal, {refused} refused after");
}

/// A peer that sends the head of a 1 MiB put into a segment and then stalls holds that
/// segment only until the agent's timeout: `deregister` then cuts it off and returns, and
/// the agent keeps serving its other peers.
#[test]
fn a_peer_stalled_in_a_put_is_cut_off_when_its_segment_is_withdrawn() {
    let mut cfg = config("decode-z", "127.0.3.48", None, Transport::Tcp);
    cfg.timeout = Duration::from_secs(1);
    let decode = Agent::new(cfg).unwrap();
    decode.register("kv", 4 << 20).unwrap();
    decode.register("other", 1 << 20).unwrap();

    let (mut c, addr, key) = hand_client(&decode, "kv");
    // The head of a 1 MiB put, 1000 of its bytes, then nothing.
    let mut put = Frame::put_head(1, key, addr, 1 << 20);
    put.extend_from_slice(&[0xee; 1000]);
    c.write_all(&put).unwrap();
    std::thread::sleep(Duration::from_millis(200));

    let t0 = Instant::now();
    decode.deregister("kv").unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "deregister took {took:?} (the agent's timeout is 1 s)"
    );
    // The stalled client's connection is ended (an end or a reset, not silence).
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    if let Err(e) = c.read_to_end(&mut rest) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the stalled peer's connection stays open: {e}"
        );
    }

    // The agent goes on serving: another peer writes into "other".
    let friend = agent("friend-z", "127.0.3.49", None, Transport::Tcp);
    friend.register("src", 1 << 20).unwrap();
    friend.write_local("src", 0, &[3u8; 1 << 20]).unwrap();
    assert_eq!(friend.connect(decode.address()).unwrap(), "decode-z");
    let id = friend
        .transfer(
            "decode-z",
            &[desc(Op::Write, "src", 0, "other", 0, 1 << 20)],
            None,
        )
        .unwrap();
    assert_eq!(friend.wait(id, T).unwrap(), [DescState::Done]);
    let mut got = vec![0u8; 1 << 20];
    decode.read_local("other", 0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 3));
    let e = friend.transfer("decode-z", &[desc(Op::Write, "src", 0, "kv", 0, 8)], None);
    let refused = match e {
        Err(e) => matches!(e, XferError::UnknownSegment(_)),
        Ok(id) => matches!(
            &friend.wait(id, T).unwrap()[0],
            DescState::Failed(XferError::UnknownSegment(_))
        ),
    };
    assert!(refused, "a withdrawn segment is unknown to a new peer");
}

/// A client that speaks the protocol by hand to `target` (which has no secret): opening,
/// hello, proof, token and lane 0; then it reads the target's segment table and returns
/// the connection with the address and key of segment `seg`.
fn hand_client(target: &Agent, seg: &str) -> (TcpStream, u64, u32) {
    let mut c = TcpStream::connect(target.address()).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    c.write_all(stream::OPEN_TCP).unwrap();
    let mut hello = [0u8; 17];
    c.read_exact(&mut hello).unwrap();
    c.write_all(&[0u8; 48]).unwrap();
    let mut rep = [0u8; 33];
    c.read_exact(&mut rep).unwrap();
    assert_eq!(rep[0], stream::OK);
    c.write_all(&[[9u8; 16].as_slice(), &[0]].concat()).unwrap();
    loop {
        let f = read_frame(&mut c);
        if let Frame::Msg(m) = f {
            if let Msg::Segments(segs) = Msg::decode(&m).unwrap() {
                let s = segs.iter().find(|s| s.name == seg).unwrap();
                return (c, s.buffers[0].addr, s.buffers[0].key);
            }
        }
    }
}

fn read_frame(c: &mut TcpStream) -> Frame {
    let mut h = [0u8; HEADER];
    c.read_exact(&mut h).unwrap();
    let mut body = vec![0u8; Frame::body_len(&h).unwrap()];
    c.read_exact(&mut body).unwrap();
    Frame::decode(h[4], body).unwrap()
}

/// A put whose bytes come in two parts with a pause between them, and nothing after: the
/// target takes the first part, waits for the rest (it does not wait for more than the put
/// holds), writes every byte where the put named and acknowledges it.
#[test]
fn a_put_that_arrives_in_parts_lands_whole() {
    let decode = agent("decode-p", "127.0.3.50", None, Transport::Tcp);
    decode.register("kv", 4 << 20).unwrap();
    let (mut c, addr, key) = hand_client(&decode, "kv");
    let data = pattern(1 << 20, 0x33);
    let mut put = Frame::put_head(7, key, addr + 4096, data.len());
    put.extend_from_slice(&data[..300 << 10]);
    c.write_all(&put).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.write_all(&data[300 << 10..]).unwrap();
    let ack = loop {
        if let f @ Frame::Ack { .. } = read_frame(&mut c) {
            break f;
        }
    };
    assert_eq!(
        ack,
        Frame::Ack {
            tag: 7,
            status: stream::OK
        }
    );
    let mut got = vec![0u8; 4 << 20];
    decode.read_local("kv", 0, &mut got).unwrap();
    assert!(got[..4096].iter().all(|&b| b == 0));
    assert!(got[4096..4096 + data.len()] == data[..]);
    assert!(got[4096 + data.len()..].iter().all(|&b| b == 0));
}

/// Puts, reads and answers of up to 128 KiB go out from the thread that sends them while the
/// connection's writer is idle, and through the writer otherwise: many threads' batches of
/// such blocks, WRITE and READ at once, all land exactly, in both directions.
#[test]
fn small_slices_sent_by_the_posting_thread_land_whole_and_in_order() {
    const BLOCK: u64 = 96 << 10;
    const N: u64 = 48;
    let target = agent("target-i", "127.0.3.41", Some(SECRET), Transport::Tcp);
    let init = agent("init-i", "127.0.3.42", Some(SECRET), Transport::Tcp);
    let len = (4 * N * BLOCK) as usize;
    target.register("kv", len).unwrap();
    init.register("blocks", len).unwrap();
    let src = pattern(len, 0x31);
    let theirs = pattern(len, 0x47);
    init.write_local("blocks", 0, &src).unwrap();
    target.write_local("kv", 0, &theirs).unwrap();
    assert_eq!(init.connect(target.address()).unwrap(), "target-i");
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let init = &init;
            sc.spawn(move || {
                // Thread t writes its even blocks and reads its odd ones, in rounds.
                for round in 0..3 {
                    let descs: Vec<_> = (0..N)
                        .map(|k| {
                            let at = (t * N + k) * BLOCK;
                            let op = if k % 2 == 0 { Op::Write } else { Op::Read };
                            desc(op, "blocks", at, "kv", at, BLOCK)
                        })
                        .collect();
                    let id = init.transfer("target-i", &descs, None).unwrap();
                    let st = init.wait(id, T).unwrap();
                    assert!(
                        st.iter().all(|s| *s == DescState::Done),
                        "thread {t} round {round}: {st:?}"
                    );
                }
            });
        }
    });
    let (mut kv, mut blocks) = (vec![0u8; len], vec![0u8; len]);
    target.read_local("kv", 0, &mut kv).unwrap();
    init.read_local("blocks", 0, &mut blocks).unwrap();
    for b in 0..4 * N {
        let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
        if b % 2 == 0 {
            assert!(kv[r.clone()] == src[r.clone()], "block {b} written");
            assert!(blocks[r.clone()] == src[r], "block {b} kept");
        } else {
            assert!(blocks[r.clone()] == theirs[r.clone()], "block {b} read");
            assert!(kv[r.clone()] == theirs[r], "block {b} untouched");
        }
    }
}

/// Answers to reads go out from the reader thread while the writer is idle; a peer that
/// asks for many and reads none fills the connection, so one answer goes out in part and
/// the rest of it, and every answer after it, through the writer's queue. The peer then
/// reads while it asks for more, and those answers wait behind the queue: every answer
/// comes whole, in order, with the right bytes.
#[test]
fn answers_the_socket_takes_in_part_come_whole_and_in_order() {
    const N: u64 = 96;
    const LEN: u64 = 100 << 10;
    let target = agent("target-g", "127.0.3.43", None, Transport::Tcp);
    let size = (N * LEN) as usize;
    target.register("kv", size).unwrap();
    let theirs = pattern(size, 0x5a);
    target.write_local("kv", 0, &theirs).unwrap();
    let (mut c, addr, key) = hand_client(&target, "kv");
    // Answer k reads backwards through the segment, so order and place are both checked.
    let at = move |k: u64| (N - 1 - k % N) * LEN;
    let get = move |k: u64| {
        let mut b = Vec::new();
        Frame::Get {
            tag: k,
            key,
            addr: addr + at(k),
            len: LEN as u32,
        }
        .write_to(&mut b)
        .unwrap();
        b
    };
    let first: Vec<u8> = (0..N).flat_map(get).collect();
    c.write_all(&first).unwrap();
    // Nearly 10 MB of answers: more than the connection holds while nobody reads.
    std::thread::sleep(Duration::from_millis(300));
    let mut more = c.try_clone().unwrap();
    let asker = std::thread::spawn(move || {
        for k in N..2 * N {
            more.write_all(&get(k)).unwrap();
            std::thread::sleep(Duration::from_micros(500));
        }
    });
    for k in 0..2 * N {
        let at = at(k) as usize;
        match read_frame(&mut c) {
            Frame::Data { tag, status, data } => {
                assert_eq!((tag, status), (k, stream::OK), "answer {k}");
                assert!(data == theirs[at..at + LEN as usize], "answer {k}'s bytes");
            }
            f => panic!("answer {k}: {f:?}"),
        }
    }
    asker.join().unwrap();
}
