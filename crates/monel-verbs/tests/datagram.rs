//! UD queue pairs over real UDP sockets on loopback: one QP sending to several, GRH in the
//! receive buffer, Q_Key checks, and the verbs' refusals.

mod common;

use std::net::Ipv4Addr;

use common::*;
use monel_verbs::*;

const QKEY: QKey = QKey(0x1111_1111);
const PORT: u16 = 24860;

struct UdSide {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn ud_side(ip: &str) -> UdSide {
    let (ctx, pd, cq) = open(ip, PORT);
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap::default(),
            qp_type: QpType::Ud,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    qp.ready_ud(QKEY, random_psn()).unwrap();
    let mr = pd
        .reg_mr(vec![0u8; 64 * 1024], AccessFlags::LOCAL_WRITE)
        .unwrap();
    UdSide {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

fn gid(s: &UdSide) -> Gid {
    s.ctx.device().gid(0).unwrap().gid
}

fn ah_to(from: &UdSide, to: &UdSide) -> AddressHandle {
    from.pd
        .create_ah(&AhAttr {
            dgid: gid(to),
            sgid_index: 0,
            hop_limit: 64,
        })
        .unwrap()
}

fn send_wr(mr: &MemoryRegion, off: usize, len: usize, imm: Option<u32>) -> SendWr {
    SendWr {
        wr_id: off as u64,
        op: imm.map_or(SendOp::Send, SendOp::SendImm),
        sg_list: vec![mr.sge(off, len)],
        flags: signaled(),
    }
}

#[test]
fn one_ud_qp_sends_to_two_peers_and_receivers_see_grh_and_sender() {
    let a = ud_side("127.0.0.130");
    let b = ud_side("127.0.0.131");
    let c = ud_side("127.0.0.132");
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    a.mr.write(0, &data).unwrap();
    for (i, r) in [&b, &c].into_iter().enumerate() {
        r.qp.post_recv(RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![r.mr.sge(0, 40 + 4096)],
        })
        .unwrap();
    }
    // 4096 bytes (the port MTU) to b with an immediate, 100 bytes to c.
    a.qp.post_send_ud(
        send_wr(&a.mr, 0, 4096, Some(0xfeed)),
        &ah_to(&a, &b),
        b.qp.qp_num(),
        QKEY,
    )
    .unwrap();
    a.qp.post_send_ud(
        send_wr(&a.mr, 1, 100, None),
        &ah_to(&a, &c),
        c.qp.qp_num(),
        QKEY,
    )
    .unwrap();
    let sends = a.cq.poll_n(2, T);
    assert_eq!(sends.len(), 2);
    assert!(sends.iter().all(|w| w.status == WcStatus::Success));

    let wc = one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm),
        (
            100,
            WcStatus::Success,
            WcOpcode::Recv,
            40 + 4096,
            Some(0xfeed)
        )
    );
    assert_eq!(wc.src_qp, a.qp.qp_num());
    assert!(wc.grh);
    let mut got = vec![0u8; 40 + 4096];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got[40..], &data[..]);
    // IPv4: 20 bytes of zeros, then the IPv4 header with the sender's and our address.
    assert_eq!(&got[..20], &[0u8; 20]);
    assert_eq!(got[20] >> 4, 4);
    assert_eq!(got[29], 17, "protocol UDP");
    assert_eq!(
        Ipv4Addr::from(<[u8; 4]>::try_from(&got[32..36]).unwrap()),
        Ipv4Addr::new(127, 0, 0, 130)
    );
    assert_eq!(
        Ipv4Addr::from(<[u8; 4]>::try_from(&got[36..40]).unwrap()),
        Ipv4Addr::new(127, 0, 0, 131)
    );

    let wc = one(&c.cq);
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (101, 140, None));
    let mut got = vec![0u8; 100];
    c.mr.read(40, &mut got).unwrap();
    assert_eq!(got, data[1..101]);
}

#[test]
fn wrong_qkey_and_missing_receive_drop_the_datagram_and_count_it() {
    let a = ud_side("127.0.0.133");
    let b = ud_side("127.0.0.134");
    let ah = ah_to(&a, &b);
    // No receive posted yet: dropped, counted.
    a.qp.post_send_ud(send_wr(&a.mr, 0, 10, None), &ah, b.qp.qp_num(), QKEY)
        .unwrap();
    one(&a.cq);
    // Datagrams are processed asynchronously: wait until b's NIC has seen it.
    let deadline = std::time::Instant::now() + T;
    while b.qp.stats().unwrap().no_recv_drops == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "datagram never processed"
        );
        b.cq.poll(1);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![b.mr.sge(0, 1000)],
    })
    .unwrap();
    // Wrong Q_Key: dropped, counted; the receive stays posted.
    a.qp.post_send_ud(send_wr(&a.mr, 0, 10, None), &ah, b.qp.qp_num(), QKey(7))
        .unwrap();
    one(&a.cq);
    // The right one arrives.
    a.qp.post_send_ud(send_wr(&a.mr, 0, 20, None), &ah, b.qp.qp_num(), QKEY)
        .unwrap();
    one(&a.cq);
    let wc = one(&b.cq);
    assert_eq!((wc.wr_id, wc.byte_len), (1, 60));
    let st = b.qp.stats().unwrap();
    assert_eq!(st.no_recv_drops, 1);
    assert_eq!(st.qkey_violations, 1);
    assert!(b.cq.poll(1).is_empty());
}

#[test]
fn ud_refusals_name_the_verb_and_the_reason() {
    let a = ud_side("127.0.0.135");
    let b = ud_side("127.0.0.136");
    let ah = ah_to(&a, &b);
    // Longer than the port MTU.
    let e =
        a.qp.post_send_ud(send_wr(&a.mr, 0, 4097, None), &ah, b.qp.qp_num(), QKEY)
            .unwrap_err();
    assert_eq!(e.verb, "ibv_post_send");
    // No RDMA WRITE on UD, and no connected-mode post.
    let mut w = send_wr(&a.mr, 0, 8, None);
    w.op = SendOp::Write(RemoteAddr {
        addr: 0,
        rkey: RKey(1),
    });
    assert!(a.qp.post_send_ud(w, &ah, b.qp.qp_num(), QKEY).is_err());
    let e = a.qp.post_send(send_wr(&a.mr, 0, 8, None)).unwrap_err();
    assert!(e.to_string().contains("UD"), "{e}");
    // An address handle of another PD.
    let other = a.ctx.alloc_pd();
    let foreign = other
        .create_ah(&AhAttr {
            dgid: gid(&b),
            sgid_index: 0,
            hop_limit: 64,
        })
        .unwrap();
    let e =
        a.qp.post_send_ud(send_wr(&a.mr, 0, 8, None), &foreign, b.qp.qp_num(), QKEY)
            .unwrap_err();
    assert!(e.to_string().contains("protection domain"), "{e}");
    // Address handles: unknown source GID, family mismatch.
    assert!(
        a.pd.create_ah(&AhAttr {
            dgid: gid(&b),
            sgid_index: 9,
            hop_limit: 64,
        })
        .is_err()
    );
    assert!(
        a.pd.create_ah(&AhAttr {
            dgid: Gid::from_ip("fd00::1".parse().unwrap()),
            sgid_index: 0,
            hop_limit: 64,
        })
        .is_err()
    );
    // RC attributes on a UD QP.
    let e = b.qp.init(AccessFlags::REMOTE_WRITE).unwrap_err();
    assert_eq!(e.verb, "ibv_modify_qp");
    assert!(a.qp.congestion().is_err());
}
