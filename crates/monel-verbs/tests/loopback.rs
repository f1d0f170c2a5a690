//! The verbs API over real UDP sockets on loopback: two devices, RC QPs, every operation.

mod common;

use common::*;
use monel_verbs::*;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn send_write_read_atomics_over_udp() {
    let (a, b) = pair(10, 24791, Mtu::Mtu1024);
    let rw = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let amr = a.pd.reg_mr(pattern(100_000, 7), rw).unwrap();
    let bmr = b.pd.reg_mr(vec![0u8; 100_000], rw).unwrap();

    // SEND of 10,000 bytes: 10 packets at MTU 1024.
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![bmr.sge(0, 20_000)],
    })
    .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::SendImm(0xabcd),
        sg_list: vec![amr.sge(0, 10_000)],
        flags: signaled(),
    })
    .unwrap();
    let wc = one(&a.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (2, WcStatus::Success, WcOpcode::Send)
    );
    let wc = one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm),
        (1, WcStatus::Success, 10_000, Some(0xabcd))
    );
    assert_eq!(wc.src_qp, a.qp.qp_num());
    let mut got = vec![0u8; 10_000];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(100_000, 7)[..10_000]);

    // WRITE 64 KiB at offset 20,000.
    let remote = RemoteAddr {
        addr: bmr.addr() + 20_000,
        rkey: bmr.rkey(),
    };
    a.qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Write(remote),
        sg_list: vec![amr.sge(1000, 65_536)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut got = vec![0u8; 65_536];
    bmr.read(20_000, &mut got).unwrap();
    assert_eq!(got, pattern(100_000, 7)[1000..1000 + 65_536]);

    // READ it back into a fresh region.
    let back = a.pd.reg_mr(vec![0u8; 65_536], rw).unwrap();
    a.qp.post_send(SendWr {
        wr_id: 4,
        op: SendOp::Read(remote),
        sg_list: vec![back.sge(0, 65_536)],
        flags: signaled(),
    })
    .unwrap();
    let wc = one(&a.cq);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 65_536)
    );
    let mut got2 = vec![0u8; 65_536];
    back.read(0, &mut got2).unwrap();
    assert_eq!(got2, got);

    // Atomics on an 8-byte word.
    bmr.write(96_000, &5u64.to_le_bytes()).unwrap();
    let word = RemoteAddr {
        addr: bmr.addr() + 96_000,
        rkey: bmr.rkey(),
    };
    a.qp.post_send(SendWr {
        wr_id: 5,
        op: SendOp::FetchAdd {
            remote: word,
            add: 10,
        },
        sg_list: vec![back.sge(0, 8)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    a.qp.post_send(SendWr {
        wr_id: 6,
        op: SendOp::CompareSwap {
            remote: word,
            compare: 15,
            swap: 99,
        },
        sg_list: vec![back.sge(8, 8)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut w = [0u8; 16];
    back.read(0, &mut w).unwrap();
    assert_eq!(u64::from_le_bytes(w[..8].try_into().unwrap()), 5);
    assert_eq!(u64::from_le_bytes(w[8..].try_into().unwrap()), 15);
    let mut w = [0u8; 8];
    bmr.read(96_000, &mut w).unwrap();
    assert_eq!(u64::from_le_bytes(w), 99);

    let ca = a.ctx.counters();
    assert_eq!(ca.icrc_errors, 0);
    // A single datagram carries IP ID 0 and the k-th segment of a GSO message ID k, which the
    // receiver guesses from its place in the coalesced buffer: nothing needs solving.
    assert_eq!(ca.icrc_ip_id_solved, 0, "{ca}");
    let cb = b.ctx.counters();
    assert!(
        cb.tx_segmented > 0 && ca.tx_segmented > 0,
        "64 KiB left in GSO messages: {ca}"
    );
    assert!(
        cb.rx_coalesced > 0 && ca.rx_coalesced > 0,
        "and arrived coalesced: {cb}"
    );
    assert_eq!(cb.icrc_errors + cb.icrc_ip_id_solved, 0, "{cb}");
    assert!(ca.tx_packets > 70 && ca.rx_packets > 10, "{ca}");
}

#[test]
fn inline_unsignaled_and_many_messages() {
    let (a, b) = pair(20, 24792, Mtu::Mtu4096);
    let bmr =
        b.pd.reg_mr(vec![0u8; 64 * 200], AccessFlags::LOCAL_WRITE)
            .unwrap();
    for i in 0..200u64 {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![bmr.sge(i as usize * 64, 64)],
        })
        .unwrap();
    }
    for i in 0..200u64 {
        let data = [i as u8; 40];
        // Every 50th is signaled; the rest complete silently.
        let flags = SendFlags {
            signaled: i % 50 == 49,
            ..SendFlags::default()
        };
        loop {
            match a.qp.post_send_inline(i, SendOp::Send, &data, flags) {
                Ok(()) => break,
                Err(VerbsError {
                    kind: ErrorKind::Post(_),
                    ..
                }) => std::thread::sleep(std::time::Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
    }
    let wcs = b.cq.poll_n(200, T);
    assert_eq!(wcs.len(), 200);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (i as u64, WcStatus::Success, 40)
        );
        let mut m = [0u8; 40];
        bmr.read(i * 64, &mut m).unwrap();
        assert_eq!(m, [i as u8; 40]);
    }
    let sent = a.cq.poll_n(4, T);
    assert_eq!(
        sent.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![49, 99, 149, 199]
    );
    assert!(a.cq.poll(10).is_empty());
    let too_big =
        a.qp.post_send_inline(9, SendOp::Send, &[0u8; 1000], signaled())
            .unwrap_err();
    assert!(too_big.to_string().contains("max_inline_data"), "{too_big}");
}

#[test]
fn remote_access_errors_are_completions_and_touch_nothing() {
    let (a, b) = pair(30, 24793, Mtu::Mtu1024);
    let amr =
        a.pd.reg_mr(vec![1u8; 4096], AccessFlags::LOCAL_WRITE)
            .unwrap();
    let ro =
        b.pd.reg_mr(vec![0u8; 4096], AccessFlags::REMOTE_READ)
            .unwrap();
    let remote = RemoteAddr {
        addr: ro.addr(),
        rkey: ro.rkey(),
    };
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write(remote),
        sg_list: vec![amr.sge(0, 100)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr);
    let mut z = vec![0u8; 4096];
    ro.read(0, &mut z).unwrap();
    assert!(z.iter().all(|&x| x == 0));
    assert_eq!(a.qp.query().unwrap().0, QpState::Err);
    assert!(matches!(a.ctx.poll_async_event(), Some(AsyncEvent::QpFatal(q)) if q == a.qp.qp_num()));
}

#[test]
fn stale_and_foreign_keys_fail() {
    let (a, b) = pair(40, 24794, Mtu::Mtu1024);
    let amr =
        a.pd.reg_mr(vec![1u8; 4096], AccessFlags::LOCAL_WRITE)
            .unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let gone = b.pd.reg_mr(vec![0u8; 4096], rw).unwrap();
    let remote = RemoteAddr {
        addr: gone.addr(),
        rkey: gone.rkey(),
    };
    drop(gone);
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write(remote),
        sg_list: vec![amr.sge(0, 64)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr);

    // A region of another PD on the same device is invisible to the QP.
    let (c, d) = pair(42, 24795, Mtu::Mtu1024);
    let other_pd = d.ctx.alloc_pd();
    let foreign = other_pd.reg_mr(vec![0u8; 4096], rw).unwrap();
    let cmr =
        c.pd.reg_mr(vec![1u8; 64], AccessFlags::LOCAL_WRITE)
            .unwrap();
    c.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::Write(RemoteAddr {
            addr: foreign.addr(),
            rkey: foreign.rkey(),
        }),
        sg_list: vec![cmr.sge(0, 64)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&c.cq).status, WcStatus::RemAccessErr);
    assert!(foreign.lock().unwrap().iter().all(|&x| x == 0));
}

#[test]
fn keys_are_random_and_distinct() {
    let (_ctx, pd, _cq) = open("127.0.0.50", 24796);
    let mrs: Vec<MemoryRegion> = (0..64)
        .map(|_| pd.reg_mr(vec![0; 8], AccessFlags::LOCAL_WRITE).unwrap())
        .collect();
    let mut keys: Vec<u32> = mrs.iter().flat_map(|m| [m.lkey().0, m.rkey().0]).collect();
    let sequential = keys
        .windows(2)
        .filter(|w| w[1].wrapping_sub(w[0]) < 256)
        .count();
    assert!(sequential < 4, "keys look sequential: {keys:x?}");
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 128);
}

#[test]
fn control_path_errors_name_verb_and_attribute() {
    let (ctx, pd, cq) = open("127.0.0.60", 24797);
    let e = pd
        .reg_mr(vec![0; 8], AccessFlags::REMOTE_WRITE)
        .unwrap_err();
    assert_eq!(e.verb, "ibv_reg_mr");
    assert!(e.to_string().contains("LOCAL_WRITE"), "{e}");
    let e = ctx.create_cq(0).unwrap_err();
    assert_eq!(e.verb, "ibv_create_cq");
    let init = QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_sge: 1000,
            ..QpCap::default()
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    };
    let e = pd.create_qp(&init).unwrap_err();
    assert!(e.to_string().contains("max_send_sge"), "{e}");
    let qp = pd
        .create_qp(&QpInitAttr {
            cap: QpCap::default(),
            ..init
        })
        .unwrap();
    // RESET -> RTR is not a transition.
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    let e = qp.modify(&attr, AttrMask::STATE).unwrap_err();
    assert_eq!(e.verb, "ibv_modify_qp");
    assert!(matches!(e.kind, ErrorKind::Modify(_)));
    // INIT without the required attributes names them.
    let attr = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    let e = qp.modify(&attr, AttrMask::STATE).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("port"), "{e}");
    // Posting a send in RESET is refused.
    let e = qp
        .post_send(SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sg_list: vec![],
            flags: signaled(),
        })
        .unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Post(_)), "{e}");
    // A bad GID index at RTR.
    let remote = RemoteQp {
        qpn: Qpn::new(0x99),
        psn: Psn::new(1),
        gid: Gid::from_ip("127.0.0.61".parse().unwrap()),
    };
    let e = qp
        .connect(
            &remote,
            &ConnectParams {
                sgid_index: 5,
                ..ConnectParams::default()
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("sgid_index"), "{e}");
}

#[test]
fn completion_channel_fd_becomes_readable_on_a_completion() {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let (a, b) = pair(110, 24820, Mtu::Mtu1024);
    let bmr =
        b.pd.reg_mr(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
            .unwrap();
    b.qp.post_recv(RecvWr {
        wr_id: 7,
        sg_list: vec![bmr.sge(0, 64)],
    })
    .unwrap();
    // Not armed: nothing to read yet.
    assert!(!b.cq.get_event());
    b.cq.req_notify();
    a.qp.post_send_inline(1, SendOp::Send, b"ring", signaled())
        .unwrap();
    // No thread waits on b's CQ, so b's progress thread delivers and writes the channel.
    let mut fds = [PollFd::new(b.cq.as_fd(), PollFlags::POLLIN)];
    let n = poll(&mut fds, PollTimeout::from(10_000u16)).unwrap();
    assert_eq!(n, 1, "channel not readable within 10 s");
    assert!(b.cq.get_event());
    assert!(!b.cq.get_event(), "one notification per arming");
    let wc = b.cq.poll(1);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (7, WcStatus::Success, 4)
    );
    assert_eq!(a.cq.poll_n(1, T).len(), 1);
}

#[test]
fn an_ack_deferred_by_a_waiting_thread_still_goes_out_when_its_qp_is_dropped() {
    let (a, b) = pair(120, 24821, Mtu::Mtu1024);
    let bmr =
        b.pd.reg_mr(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
            .unwrap();
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![bmr.sge(0, 64)],
    })
    .unwrap();
    a.qp.post_send_inline(2, SendOp::Send, b"last", signaled())
        .unwrap();
    // b's thread receives the SEND itself; its ACK waits for a post that never comes.
    assert_eq!(b.cq.poll_n(1, T).len(), 1);
    drop(b);
    // The ACK left before b's QP went away, so a's SEND completes (no retransmission).
    let wc = a.cq.poll_n(1, T);
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::Success));
    assert_eq!(a.qp.stats().unwrap().timeouts, 0);
}

#[test]
fn a_fenced_write_waits_for_the_read_before_it() {
    // READ 32 KiB of b's region, then a fenced WRITE over the same bytes: the READ must
    // return the old contents only. The responder reads memory as it sends each response
    // packet, so an unfenced WRITE arriving in the same receive batch lands in the middle of
    // the READ's responses (checked: with `fence: false` this test fails every time).
    let (a, b) = pair(150, 24822, Mtu::Mtu1024);
    const N: usize = 32 * 1024;
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let bmr = b.pd.reg_mr(pattern(N, 1), rw).unwrap();
    let amr = a.pd.reg_mr(vec![0u8; 2 * N], rw).unwrap();
    amr.write(N, &pattern(N, 2)).unwrap();
    let remote = RemoteAddr {
        addr: bmr.addr(),
        rkey: bmr.rkey(),
    };
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Read(remote),
        sg_list: vec![amr.sge(0, N)],
        flags: signaled(),
    })
    .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::Write(remote),
        sg_list: vec![amr.sge(N, N)],
        flags: SendFlags {
            signaled: true,
            fence: true,
            ..SendFlags::default()
        },
    })
    .unwrap();
    let wcs = a.cq.poll_n(2, T);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let mut got = vec![0u8; N];
    amr.read(0, &mut got).unwrap();
    assert!(
        got == pattern(N, 1),
        "the READ saw bytes of the fenced WRITE"
    );
    bmr.read(0, &mut got).unwrap();
    assert!(got == pattern(N, 2));
}

/// A 512 KiB WRITE at MTU 4096 is 128 packets, as many as may be unacknowledged: the send
/// batch takes them all, so they leave in GSO messages through one sendmmsg (two if a flush
/// falls between), not one call per 32 packets.
#[test]
fn a_512_kib_write_leaves_in_one_or_two_send_calls() {
    let (a, b) = pair(160, 24823, Mtu::Mtu4096);
    let amr =
        a.pd.reg_mr(pattern(512 << 10, 3), AccessFlags::LOCAL_WRITE)
            .unwrap();
    let bmr =
        b.pd.reg_mr(
            vec![0u8; 512 << 10],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let before = a.ctx.counters();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write(RemoteAddr {
            addr: bmr.addr(),
            rkey: bmr.rkey(),
        }),
        sg_list: vec![amr.sge(0, 512 << 10)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let after = a.ctx.counters();
    let mut got = vec![0u8; 512 << 10];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(512 << 10, 3));
    // A loaded machine may delay the peer past the ACK timeout: each retransmission round
    // then adds its packets and one call more.
    let st = a.qp.stats().unwrap();
    let sent = after.tx_packets - before.tx_packets;
    assert_eq!(sent - st.retransmitted_packets, 128, "{after}");
    let calls = after.tx_batches - before.tx_batches;
    assert!(
        (1..=2 + st.timeouts).contains(&calls),
        "{calls} send calls, {} timeouts: {after}",
        st.timeouts
    );
    assert!(after.tx_segmented - before.tx_segmented >= 120, "{after}");
}
