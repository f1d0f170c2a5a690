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
