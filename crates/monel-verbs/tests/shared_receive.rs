//! Shared receive queues over real UDP sockets on loopback: two RC QPs drawing from one SRQ,
//! the limit event, RNR when it runs dry, and WRITE with immediate taking a WQE.

mod common;

use common::*;
use monel_verbs::*;

const PORT: u16 = 24870;

struct Server {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    srq: SharedReceiveQueue,
    mr: MemoryRegion,
}

/// A server device whose QPs share one SRQ, and a connected client QP per call.
fn server(ip: &str) -> Server {
    let (ctx, pd, cq) = open(ip, PORT);
    let srq = pd
        .create_srq(&SrqAttr {
            max_wr: 16,
            max_sge: 2,
            srq_limit: 0,
        })
        .unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.reg_mr(vec![0u8; 16 * 4096], rw).unwrap();
    Server {
        ctx,
        pd,
        cq,
        srq,
        mr,
    }
}

fn attach(s: &Server, client: &Side) -> QueuePair {
    let qp =
        s.pd.create_qp(&QpInitAttr {
            send_cq: &s.cq,
            recv_cq: &s.cq,
            cap: QpCap::default(),
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: Some(&s.srq),
        })
        .unwrap();
    let psn = random_psn();
    let p = |psn| ConnectParams {
        local_psn: psn,
        mtu: Mtu::Mtu1024,
        min_rnr_timer: 1,
        ..ConnectParams::default()
    };
    qp.connect(&remote(client), &p(psn)).unwrap();
    let me = RemoteQp {
        qpn: qp.qp_num(),
        psn,
        gid: s.ctx.device().gid(0).unwrap().gid,
    };
    client.qp.connect(&me, &p(client.psn)).unwrap();
    qp
}

fn send(c: &Side, mr: &MemoryRegion, id: u64, len: usize) {
    c.qp.post_send(SendWr {
        wr_id: id,
        op: SendOp::Send,
        sg_list: vec![mr.sge(0, len)],
        flags: signaled(),
    })
    .unwrap();
}

#[test]
fn two_qps_draw_from_one_srq_and_the_limit_event_fires_once() {
    let s = server("127.0.0.140");
    let c1 = side("127.0.0.141", PORT);
    let c2 = side("127.0.0.142", PORT);
    let q1 = attach(&s, &c1);
    let q2 = attach(&s, &c2);
    let m1 = c1.pd.reg_mr(vec![1u8; 3000], AccessFlags::NONE).unwrap();
    let m2 = c2.pd.reg_mr(vec![2u8; 3000], AccessFlags::NONE).unwrap();
    for i in 0..4 {
        s.srq
            .post_recv(RecvWr {
                wr_id: i,
                sg_list: vec![s.mr.sge(i as usize * 4096, 4096)],
            })
            .unwrap();
    }
    s.srq.set_limit(2).unwrap();
    // The QP's own receive queue is closed.
    let e = q1
        .post_recv(RecvWr {
            wr_id: 99,
            sg_list: vec![],
        })
        .unwrap_err();
    assert!(e.to_string().contains("SRQ"), "{e}");

    // A 3000-byte SEND (3 packets) from each client; WQEs are taken in order.
    send(&c1, &m1, 1, 3000);
    assert_eq!(one(&c1.cq).status, WcStatus::Success);
    let w1 = one(&s.cq);
    send(&c2, &m2, 2, 3000);
    assert_eq!(one(&c2.cq).status, WcStatus::Success);
    let w2 = one(&s.cq);
    assert_eq!((w1.wr_id, w1.qp_num, w1.byte_len), (0, q1.qp_num(), 3000));
    assert_eq!((w2.wr_id, w2.qp_num, w2.byte_len), (1, q2.qp_num(), 3000));
    let mut got = vec![0u8; 3000];
    s.mr.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 1));
    s.mr.read(4096, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 2));
    // 2 WQEs left: not below the limit yet; one more SEND takes it below.
    assert!(s.ctx.poll_async_event().is_none());
    send(&c1, &m1, 3, 10);
    one(&c1.cq);
    assert_eq!(one(&s.cq).wr_id, 2);
    let ev = std::iter::from_fn(|| s.ctx.poll_async_event()).collect::<Vec<_>>();
    assert_eq!(ev, vec![AsyncEvent::SrqLimitReached(s.srq.id())]);
    let (attr, queued) = s.srq.query().unwrap();
    assert_eq!((attr.srq_limit, queued), (0, 1), "limit disarmed");
    send(&c2, &m2, 4, 10);
    one(&c2.cq);
    assert_eq!(one(&s.cq).wr_id, 3);
    assert!(s.ctx.poll_async_event().is_none(), "fires once");

    // Empty: the next SEND draws RNR NAKs until a WQE is posted, then lands.
    send(&c1, &m1, 5, 100);
    let deadline = std::time::Instant::now() + T;
    while c1.qp.stats().unwrap().rnr_naks_received == 0 {
        assert!(std::time::Instant::now() < deadline, "no RNR NAK");
        c1.cq.poll(1);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    s.srq
        .post_recv(RecvWr {
            wr_id: 7,
            sg_list: vec![s.mr.sge(0, 4096)],
        })
        .unwrap();
    assert_eq!(one(&c1.cq).status, WcStatus::Success);
    let w = one(&s.cq);
    assert_eq!((w.wr_id, w.qp_num, w.byte_len), (7, q1.qp_num(), 100));
}

#[test]
fn write_with_immediate_takes_a_wqe_from_the_srq() {
    let s = server("127.0.0.143");
    let c = side("127.0.0.144", PORT);
    let q = attach(&s, &c);
    let m = c.pd.reg_mr(vec![9u8; 2500], AccessFlags::NONE).unwrap();
    s.srq
        .post_recv(RecvWr {
            wr_id: 11,
            sg_list: vec![],
        })
        .unwrap();
    c.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::WriteImm(
            RemoteAddr {
                addr: s.mr.addr() + 8192,
                rkey: s.mr.rkey(),
            },
            0x1234,
        ),
        sg_list: vec![m.sge(0, 2500)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&c.cq).status, WcStatus::Success);
    let w = one(&s.cq);
    assert_eq!(
        (w.wr_id, w.opcode, w.imm, w.byte_len, w.qp_num),
        (
            11,
            WcOpcode::RecvRdmaWithImm,
            Some(0x1234),
            2500,
            q.qp_num()
        )
    );
    let mut got = vec![0u8; 2500];
    s.mr.read(8192, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 9));
    assert_eq!(s.srq.query().unwrap().1, 0);
}

#[test]
fn srq_refusals() {
    let s = server("127.0.0.145");
    let other = s.ctx.alloc_pd();
    let cq = &s.cq;
    let attr = |srq| QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap::default(),
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq,
    };
    let e = other.create_qp(&attr(Some(&s.srq))).unwrap_err();
    assert_eq!(e.verb, "ibv_create_qp");
    let mut ud = attr(Some(&s.srq));
    ud.qp_type = QpType::Ud;
    assert!(s.pd.create_qp(&ud).is_err());
    for bad in [
        SrqAttr {
            max_wr: 0,
            ..SrqAttr::default()
        },
        SrqAttr {
            max_sge: 0,
            ..SrqAttr::default()
        },
        SrqAttr {
            max_wr: 4,
            srq_limit: 5,
            ..SrqAttr::default()
        },
    ] {
        assert_eq!(s.pd.create_srq(&bad).unwrap_err().verb, "ibv_create_srq");
    }
    let e = s
        .srq
        .post_recv(RecvWr {
            wr_id: 0,
            sg_list: vec![s.mr.sge(0, 1); 3],
        })
        .unwrap_err();
    assert_eq!(e.verb, "ibv_post_srq_recv");
    for _ in 0..16 {
        s.srq
            .post_recv(RecvWr {
                wr_id: 0,
                sg_list: vec![s.mr.sge(0, 64)],
            })
            .unwrap();
    }
    assert!(
        s.srq
            .post_recv(RecvWr {
                wr_id: 0,
                sg_list: vec![],
            })
            .is_err(),
        "full"
    );
    assert!(s.srq.set_limit(17).is_err());
    // An SRQ dropped while a QP uses it lives on for that QP.
    let c = side("127.0.0.146", PORT);
    let q = attach(&s, &c);
    let Server { srq, .. } = s;
    drop(srq);
    let m = c.pd.reg_mr(vec![3u8; 10], AccessFlags::NONE).unwrap();
    send(&c, &m, 1, 10);
    assert_eq!(one(&c.cq).status, WcStatus::Success);
    drop(q);
}
