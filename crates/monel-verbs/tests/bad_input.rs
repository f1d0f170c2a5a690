//! Hostile datagrams at a live device: each is dropped and counted, nothing is written, and
//! the connection keeps working.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::*;
use monel_verbs::*;
use monel_wire::{FrameRepr, IpAddress};

const PORT: u16 = 24850;

/// A RoCE packet (BTH SEND_ONLY + payload + ICRC) from `src` to `dst`, ICRC computed.
fn send_only(
    src: SocketAddr,
    dst: SocketAddr,
    qpn: u32,
    psn: u32,
    pkey: u16,
    payload: &[u8],
) -> Vec<u8> {
    let pad = (4 - payload.len() % 4) % 4;
    let roce_len = 12 + payload.len() + pad + 4;
    let mut buf = vec![0u8; 28 + roce_len];
    let b = &mut buf[28..];
    b[0] = 0x04;
    b[1] = (pad as u8) << 4;
    b[2..4].copy_from_slice(&pkey.to_be_bytes());
    b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    b[8] = 0x80;
    b[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
    b[12..12 + payload.len()].copy_from_slice(payload);
    let ip = |a: SocketAddr| IpAddress::from(a.ip());
    FrameRepr {
        src: ip(src),
        dst: ip(dst),
        src_port: src.port(),
        dst_port: dst.port(),
        traffic_class: 0,
        hop_limit: 64,
        ident: 0,
        flow_label: 0,
    }
    .emit(&mut buf, roce_len)
    .unwrap();
    buf[28..].to_vec()
}

fn until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn hostile_datagrams_are_dropped_counted_and_harmless() {
    let (a, b) = pair(90, PORT, Mtu::Mtu1024);
    let bmr =
        b.pd.reg_mr(
            vec![0u8; 4096],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    b.qp.post_recv(RecvWr {
        wr_id: 77,
        sg_list: vec![bmr.sge(0, 4096)],
    })
    .unwrap();
    let bq = b.qp.qp_num().value();
    let dst: SocketAddr = format!("127.0.0.91:{PORT}").parse().unwrap();
    // From a's address (another port: receivers do not check the source port).
    let from_a = UdpSocket::bind("127.0.0.90:0").unwrap();
    let src = from_a.local_addr().unwrap();
    let stranger = UdpSocket::bind("127.0.0.99:0").unwrap();
    let before = b.ctx.counters();

    // 1. Right everything but a flipped ICRC byte.
    let mut p = send_only(src, dst, bq, 0, 0xffff, b"evil");
    let n = p.len();
    p[n - 1] ^= 1;
    from_a.send_to(&p, dst).unwrap();
    // 2. Unknown QPN.
    from_a
        .send_to(&send_only(src, dst, bq ^ 0x5a5a5a, 0, 0xffff, b"evil"), dst)
        .unwrap();
    // 3. A source that is not the connected peer (valid ICRC for its own address).
    let s2 = stranger.local_addr().unwrap();
    stranger
        .send_to(&send_only(s2, dst, bq, 0, 0xffff, b"evil"), dst)
        .unwrap();
    // 4. Truncated and 5. oversized datagrams.
    from_a.send_to(&[0x04, 0, 0xff], dst).unwrap();
    from_a.send_to(&vec![0u8; 6000], dst).unwrap();
    // 6. Wrong P_Key, valid ICRC.
    from_a
        .send_to(&send_only(src, dst, bq, 0, 0x1234, b"evil"), dst)
        .unwrap();
    // 7. A PSN far outside the window, valid ICRC.
    from_a
        .send_to(&send_only(src, dst, bq, 0x7f_0000, 0xffff, b"evil"), dst)
        .unwrap();

    until("every hostile datagram to be counted", || {
        let c = b.ctx.counters();
        c.icrc_errors > before.icrc_errors
            && c.unknown_qpn > before.unknown_qpn
            && c.bad_source > before.bad_source
            && c.malformed >= before.malformed + 2
            && c.qp.dropped + c.qp.out_of_sequence + c.qp.seq_naks_sent + c.qp.duplicate_requests
                >= before.qp.dropped + 2
    });
    assert!(
        b.cq.poll(8).is_empty(),
        "a hostile packet completed a receive"
    );
    assert!(
        bmr.lock().unwrap().iter().all(|&x| x == 0),
        "a hostile packet wrote memory"
    );
    assert_eq!(b.qp.query().unwrap().0, QpState::Rts);

    // The real peer's traffic still goes through.
    let amr =
        a.pd.reg_mr(b"hello, monel".to_vec(), AccessFlags::LOCAL_WRITE)
            .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: vec![amr.sge(0, 12)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let wc = one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (77, WcStatus::Success, 12)
    );
    let mut got = [0u8; 12];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello, monel");
}

#[test]
fn a_thousand_connected_qps_on_one_device() {
    let (ctx_a, pd_a, cq_a) = open("127.0.0.95", PORT + 1);
    let (ctx_b, pd_b, cq_b) = open("127.0.0.96", PORT + 1);
    let mk = |pd: &ProtectionDomain, cq: &CompletionQueue| {
        pd.create_qp(&QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap()
    };
    let n = 1000;
    let rss = || {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap();
        s.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
    };
    let r0 = rss();
    let qa: Vec<QueuePair> = (0..n).map(|_| mk(&pd_a, &cq_a)).collect();
    let qb: Vec<QueuePair> = (0..n).map(|_| mk(&pd_b, &cq_b)).collect();
    // Reported, not asserted: memory per QP (both sides' QPs, 4-deep queues, 64 B inline).
    eprintln!(
        "bytes per QP (RSS delta / {}): {}",
        2 * n,
        (rss() - r0) / (2 * n as u64)
    );
    let rb = pd_b
        .reg_mr(vec![0u8; 8 * n], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let ga = ctx_a.device().gid(0).unwrap().gid;
    let gb = ctx_b.device().gid(0).unwrap().gid;
    for (i, (x, y)) in qa.iter().zip(&qb).enumerate() {
        let (px, py) = (random_psn(), random_psn());
        x.connect(
            &RemoteQp {
                qpn: y.qp_num(),
                psn: py,
                gid: gb,
            },
            &ConnectParams {
                local_psn: px,
                ..ConnectParams::default()
            },
        )
        .unwrap();
        y.connect(
            &RemoteQp {
                qpn: x.qp_num(),
                psn: px,
                gid: ga,
            },
            &ConnectParams {
                local_psn: py,
                ..ConnectParams::default()
            },
        )
        .unwrap();
        y.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: vec![rb.sge(8 * i, 8)],
        })
        .unwrap();
    }
    for (i, x) in qa.iter().enumerate() {
        x.post_send_inline(
            i as u64,
            SendOp::Send,
            &(i as u64).to_le_bytes(),
            SendFlags::default(),
        )
        .unwrap();
    }
    let got = cq_b.poll_n(n, Duration::from_secs(30));
    assert_eq!(got.len(), n);
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(cq_a.poll_n(n, Duration::from_secs(30)).len(), n);
    let buf = rb.lock().unwrap();
    for i in 0..n {
        assert_eq!(
            u64::from_le_bytes(buf[8 * i..8 * i + 8].try_into().unwrap()),
            i as u64
        );
    }
    assert_eq!(ctx_b.counters().qps, n as u64);
}

/// The real peer `a` SENDs `b"real"` to `b`; returns `b`'s completion once `a`'s succeeded.
fn real_send(a: &Side, b: &Side) -> WorkCompletion {
    let amr =
        a.pd.reg_mr(b"real".to_vec(), AccessFlags::LOCAL_WRITE)
            .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: vec![amr.sge(0, 4)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    one(&b.cq)
}

/// Both sides of a pair protect their QPs with `mode` under one made-up key.
fn protect(a: &Side, b: &Side, mode: protect::PacketAuth) {
    let key = monel_peer::Key::from_secret(b"made-up link key");
    let (aq, bq) = (a.qp.qp_num().value(), b.qp.qp_num().value());
    a.qp.protect(&protect::Protection::between(&key, mode, aq, bq))
        .unwrap();
    b.qp.protect(&protect::Protection::between(&key, mode, bq, aq))
        .unwrap();
}

/// Protected QPs (a tag on every packet; with `Encrypt`, ciphertext payloads) move SENDs,
/// multi-packet WRITEs and READs, and atomics, with nothing dropped.
#[test]
fn protected_qps_carry_every_operation() {
    for (x, mode) in [
        (110, protect::PacketAuth::Mac),
        (112, protect::PacketAuth::Encrypt),
    ] {
        let a = side(&format!("127.0.0.{x}"), PORT + 3);
        let b = side(&format!("127.0.0.{}", x + 1), PORT + 3);
        protect(&a, &b, mode);
        connect(&a, &b, Mtu::Mtu1024);
        let rw = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 13 % 251) as u8).collect();
        let amr = a.pd.reg_mr(data.clone(), rw).unwrap();
        let bmr = b.pd.reg_mr(vec![0u8; 70_000], rw).unwrap();
        let remote = RemoteAddr {
            addr: bmr.addr(),
            rkey: bmr.rkey(),
        };
        b.qp.post_recv(RecvWr {
            wr_id: 5,
            sg_list: vec![bmr.sge(69_000, 1000)],
        })
        .unwrap();
        for (id, op, sge) in [
            (1, SendOp::Write(remote), amr.sge(0, 65_536)),
            (2, SendOp::Send, amr.sge(100, 1000)),
        ] {
            a.qp.post_send(SendWr {
                wr_id: id,
                op,
                sg_list: vec![sge],
                flags: signaled(),
            })
            .unwrap();
            assert_eq!(one(&a.cq).status, WcStatus::Success, "{mode} op {id}");
        }
        assert_eq!(one(&b.cq).status, WcStatus::Success);
        let mut got = vec![0u8; 70_000];
        bmr.read(0, &mut got).unwrap();
        assert_eq!(got[..65_536], data[..65_536], "{mode}: WRITE");
        assert_eq!(got[69_000..], data[100..1100], "{mode}: SEND");
        // READ it back; FETCH_ADD a word.
        let back = a.pd.reg_mr(vec![0u8; 65_536], rw).unwrap();
        a.qp.post_send(SendWr {
            wr_id: 3,
            op: SendOp::Read(remote),
            sg_list: vec![back.sge(0, 65_536)],
            flags: signaled(),
        })
        .unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success, "{mode}: READ");
        let mut r = vec![0u8; 65_536];
        back.read(0, &mut r).unwrap();
        assert_eq!(r, data[..65_536], "{mode}: READ");
        bmr.write(66_000, &40u64.to_le_bytes()).unwrap();
        a.qp.post_send(SendWr {
            wr_id: 4,
            op: SendOp::FetchAdd {
                remote: RemoteAddr {
                    addr: bmr.addr() + 66_000,
                    rkey: bmr.rkey(),
                },
                add: 2,
            },
            sg_list: vec![back.sge(0, 8)],
            flags: signaled(),
        })
        .unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success, "{mode}: FETCH_ADD");
        let mut w = [0u8; 8];
        bmr.read(66_000, &mut w).unwrap();
        assert_eq!(u64::from_le_bytes(w), 42);
        for s in [&a, &b] {
            let c = s.ctx.counters();
            assert_eq!((c.auth_failed, c.replayed), (0, 0), "{mode}");
        }
    }
}

/// An attacker on the peer's address who knows the QPN and the next PSN (as one who reads
/// the wire does) sends a SEND with a valid ICRC. On a plain QP it lands: the receive
/// completes with the attacker's bytes. On a protected QP it is dropped and counted as
/// forged, nothing is written, and the real peer's SEND then goes through.
#[test]
fn a_psn_correct_injection_lands_only_on_a_plain_qp() {
    for (x, protected) in [(114, false), (116, true)] {
        let a = side(&format!("127.0.0.{x}"), PORT + 4);
        let b = side(&format!("127.0.0.{}", x + 1), PORT + 4);
        if protected {
            protect(&a, &b, protect::PacketAuth::Mac);
        }
        connect(&a, &b, Mtu::Mtu1024);
        let bmr =
            b.pd.reg_mr(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
                .unwrap();
        b.qp.post_recv(RecvWr {
            wr_id: 7,
            sg_list: vec![bmr.sge(0, 64)],
        })
        .unwrap();
        let dst: SocketAddr = format!("127.0.0.{}:{}", x + 1, PORT + 4).parse().unwrap();
        let attacker = UdpSocket::bind(format!("127.0.0.{x}:0")).unwrap();
        let src = attacker.local_addr().unwrap();
        let before = b.ctx.counters();
        let bq = b.qp.qp_num().value();
        attacker
            .send_to(
                &send_only(src, dst, bq, a.psn.value(), 0xffff, b"evil"),
                dst,
            )
            .unwrap();
        if !protected {
            let wc = one(&b.cq);
            assert_eq!((wc.wr_id, wc.byte_len), (7, 4));
            let mut got = [0u8; 4];
            bmr.read(0, &mut got).unwrap();
            assert_eq!(&got, b"evil", "the injection landed on the plain QP");
            continue;
        }
        until("the forged packet to be counted", || {
            b.ctx.counters().auth_failed > before.auth_failed
        });
        assert!(
            b.cq.poll(4).is_empty(),
            "a forged packet completed a receive"
        );
        assert!(bmr.lock().unwrap().iter().all(|&x| x == 0));
        assert_eq!(real_send(&a, &b).byte_len, 4);
        let mut got = [0u8; 4];
        bmr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"real");
    }
}

/// Once a plain QP has taken its peer's first packet, it takes packets from that UDP source
/// port only: another process on the peer's address is dropped as a bad source, even with
/// the right PSN.
#[test]
fn the_peers_source_port_is_pinned_at_its_first_packet() {
    let (a, b) = pair(118, PORT + 5, Mtu::Mtu1024);
    let bmr =
        b.pd.reg_mr(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
            .unwrap();
    for id in [1, 2] {
        b.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![bmr.sge(0, 64)],
        })
        .unwrap();
    }
    assert_eq!(real_send(&a, &b).wr_id, 1);
    let dst: SocketAddr = format!("127.0.0.119:{}", PORT + 5).parse().unwrap();
    let attacker = UdpSocket::bind("127.0.0.118:0").unwrap();
    let src = attacker.local_addr().unwrap();
    let before = b.ctx.counters();
    let next = (a.psn.value() + 1) & 0xff_ffff;
    attacker
        .send_to(
            &send_only(src, dst, b.qp.qp_num().value(), next, 0xffff, b"evil"),
            dst,
        )
        .unwrap();
    until("the other port to be counted", || {
        b.ctx.counters().bad_source > before.bad_source
    });
    assert!(b.cq.poll(4).is_empty());
}

/// 512 forged packets aimed at a protected QP before its peer's first packet (so from a
/// port it has not pinned yet), with the right QPN and PSNs around the expected one, are all
/// dropped as forged; then a 1 MiB WRITE lands intact, and a second flood from that port is
/// dropped as a bad source.
#[test]
fn a_flood_of_forged_packets_neither_lands_nor_breaks_a_protected_qp() {
    let x = 120;
    let a = side(&format!("127.0.0.{x}"), PORT + 6);
    let b = side(&format!("127.0.0.{}", x + 1), PORT + 6);
    protect(&a, &b, protect::PacketAuth::Mac);
    connect(&a, &b, Mtu::Mtu4096);
    let dst: SocketAddr = format!("127.0.0.{}:{}", x + 1, PORT + 6).parse().unwrap();
    let attacker = UdpSocket::bind(format!("127.0.0.{x}:0")).unwrap();
    let src = attacker.local_addr().unwrap();
    let bq = b.qp.qp_num().value();
    let flood = |n: u32| {
        for i in 0..n {
            let psn = (a.psn.value() + i % 64) & 0xff_ffff;
            attacker
                .send_to(&send_only(src, dst, bq, psn, 0xffff, &[0xee; 256]), dst)
                .unwrap();
        }
    };
    flood(512);
    until("512 forged packets to be counted", || {
        b.ctx.counters().auth_failed >= 512
    });
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 253) as u8).collect();
    let amr = a.pd.reg_mr(data.clone(), rw).unwrap();
    let bmr = b.pd.reg_mr(vec![0u8; 1 << 20], rw).unwrap();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write(RemoteAddr {
            addr: bmr.addr(),
            rkey: bmr.rkey(),
        }),
        sg_list: vec![amr.sge(0, 1 << 20)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut got = vec![0u8; 1 << 20];
    bmr.read(0, &mut got).unwrap();
    assert!(got == data, "the WRITE did not land intact");
    let before = b.ctx.counters();
    flood(64);
    until("the second flood to be dropped as a bad source", || {
        b.ctx.counters().bad_source >= before.bad_source + 64
    });
    assert_eq!(b.ctx.counters().auth_failed, before.auth_failed);
    assert!(
        b.cq.poll(4).is_empty(),
        "a forged packet completed something"
    );
}
