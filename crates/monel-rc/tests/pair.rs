//! Scripted scenarios on two directly connected QPs (quinn's `Pair` shape): every packet passes
//! through `Pair::step`, where a test can drop, duplicate or mark it.

use monel_rc::memory::{AccessFlags, VecMemory};
use monel_rc::{
    AttrMask, CongestionConfig, DcqcnParams, Instant, Mtu, QpAttr, QpCaps, QpEvent, QpState, RcQp,
    RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use monel_wire::{LKey, Opcode, Psn, Qpn, RKey, RocePacket};

const LAT: u64 = 1_000; // 1 us one way

struct Side {
    qp: RcQp,
    mem: VecMemory,
    buf: u64,
    wcs: Vec<WorkCompletion>,
}

/// Decides per packet (direction a->b, packet) whether it is delivered.
type Filter = Box<dyn FnMut(bool, &RocePacket<&[u8]>) -> bool>;

struct Pair {
    a: Side,
    b: Side,
    now: Instant,
    /// In-flight packets: (arrival, to_b, bytes, ce).
    wire: Vec<(Instant, bool, Vec<u8>, bool)>,
    /// Called for each packet leaving a side: return false to drop it.
    filter: Filter,
    mark_ce: bool,
    sent: Vec<(bool, Opcode, Psn)>,
}

#[allow(clippy::too_many_arguments)]
fn connect(
    a: &mut RcQp,
    b_qpn: Qpn,
    sq_psn: u32,
    rq_psn: u32,
    mtu: Mtu,
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
) {
    let attr = QpAttr {
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        path_mtu: mtu,
        dest_qp_num: b_qpn,
        rq_psn: Psn::new(rq_psn),
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        sq_psn: Psn::new(sq_psn),
        timeout,
        retry_cnt: retry,
        rnr_retry,
        max_rd_atomic: 4,
        ..Default::default()
    };
    a.bring_up(&attr).unwrap();
    assert_eq!(a.state(), QpState::Rts);
}

fn side(qpn: u32, cc: CongestionConfig) -> Side {
    let mut mem = VecMemory::new();
    let buf = mem.register(1 << 20, LKey(qpn), RKey(0x1000 + qpn), AccessFlags::ALL);
    Side {
        qp: RcQp::new(Qpn::new(qpn), QpCaps::default(), cc),
        mem,
        buf,
        wcs: Vec::new(),
    }
}

impl Pair {
    fn new(psn_a: u32, psn_b: u32, mtu: Mtu, timeout: u8, retry: u8, rnr_retry: u8) -> Self {
        Self::with_cc(
            psn_a,
            psn_b,
            mtu,
            timeout,
            retry,
            rnr_retry,
            CongestionConfig::None,
        )
    }
    #[allow(clippy::too_many_arguments)]
    fn with_cc(
        psn_a: u32,
        psn_b: u32,
        mtu: Mtu,
        timeout: u8,
        retry: u8,
        rnr_retry: u8,
        cc: CongestionConfig,
    ) -> Self {
        let mut a = side(0x11, cc);
        let mut b = side(0x22, cc);
        connect(
            &mut a.qp,
            Qpn::new(0x22),
            psn_a,
            psn_b,
            mtu,
            timeout,
            retry,
            rnr_retry,
        );
        connect(
            &mut b.qp,
            Qpn::new(0x11),
            psn_b,
            psn_a,
            mtu,
            timeout,
            retry,
            rnr_retry,
        );
        Self {
            a,
            b,
            now: Instant::ZERO,
            wire: Vec::new(),
            filter: Box::new(|_, _| true),
            mark_ce: false,
            sent: Vec::new(),
        }
    }

    /// Sends everything both sides have, delivers what is due, runs timers; returns false when
    /// nothing is left to do.
    fn step(&mut self) -> bool {
        let mut buf = vec![0u8; 8192];
        for to_b in [true, false] {
            let s = if to_b { &mut self.a } else { &mut self.b };
            while let Some(t) = s.qp.poll_transmit(self.now, &mut buf, &s.mem) {
                let bytes = buf[..t.len].to_vec();
                let pkt = RocePacket::new_checked(&bytes[..]).unwrap();
                self.sent.push((to_b, pkt.opcode(), pkt.bth().psn()));
                if (self.filter)(to_b, &pkt) {
                    self.wire.push((
                        Instant::from_nanos(self.now.as_nanos() + LAT),
                        to_b,
                        bytes,
                        self.mark_ce,
                    ));
                }
            }
        }
        for s in [&mut self.a, &mut self.b] {
            while let Some(wc) = s.qp.poll_completion() {
                s.wcs.push(wc);
            }
        }
        // Next event: earliest arrival or timer.
        let next_arrival = self.wire.iter().map(|w| w.0).min();
        let next_timer = [self.a.qp.poll_timeout(), self.b.qp.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let next = match (next_arrival, next_timer) {
            (Some(x), Some(y)) => x.min(y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => return false,
        };
        self.now = self.now.max(next);
        let now = self.now;
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.wire)
            .into_iter()
            .partition(|w| w.0 <= now);
        self.wire = rest;
        for (_, to_b, bytes, ce) in due {
            let s = if to_b { &mut self.b } else { &mut self.a };
            s.qp.handle_packet(now, &bytes, ce, &mut s.mem);
        }
        for s in [&mut self.a, &mut self.b] {
            if s.qp.poll_timeout().is_some_and(|t| t <= now) {
                s.qp.handle_timeout(now);
            }
        }
        true
    }

    fn drive(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                for s in [&mut self.a, &mut self.b] {
                    while let Some(wc) = s.qp.poll_completion() {
                        s.wcs.push(wc);
                    }
                }
                return;
            }
        }
        panic!("did not settle");
    }
}

fn sge(s: &Side, off: u64, len: u32) -> Vec<Sge> {
    vec![Sge {
        addr: s.buf + off,
        length: len,
        lkey: LKey(s.qp.qpn().value()),
    }]
}

fn remote(s: &Side, off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: s.buf + off,
        rkey: RKey(0x1000 + s.qp.qpn().value()),
    }
}

fn signaled() -> SendFlags {
    SendFlags {
        signaled: true,
        ..Default::default()
    }
}

fn fill(s: &mut Side, off: u64, len: usize, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    s.mem.bytes_mut(s.buf + off, len).copy_from_slice(&data);
    data
}

#[test]
fn send_recv_multi_packet_message() {
    let mut p = Pair::new(100, 200, Mtu::Mtu1024, 14, 7, 7);
    let data = fill(&mut p.a, 0, 4000, 1);
    let rsge = sge(&p.b, 8192, 8192);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 7,
            sg_list: rsge,
        })
        .unwrap();
    let s = sge(&p.a, 0, 4000);
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::SendImm(0xabcd),
            sg_list: s,
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs.len(), 1);
    assert_eq!(p.a.wcs[0].status, WcStatus::Success);
    assert_eq!(
        p.b.wcs,
        vec![WorkCompletion {
            wr_id: 7,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 4000,
            imm: Some(0xabcd),
            invalidated_rkey: None,
            qp_num: Qpn::new(0x22),
            src_qp: Qpn::new(0x11),
            grh: false,
        }]
    );
    assert_eq!(p.b.mem.bytes(p.b.buf + 8192, 4000), &data[..]);
    let ops: Vec<Opcode> = p.sent.iter().filter(|s| s.0).map(|s| s.1).collect();
    assert_eq!(
        ops,
        vec![
            Opcode::RC_SEND_FIRST,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_MIDDLE,
            Opcode::RC_SEND_LAST_IMM
        ]
    );
    let acks: Vec<_> = p.sent.iter().filter(|s| !s.0).collect();
    assert_eq!(acks.len(), 1, "one coalesced ACK for the message");
    assert_eq!(acks[0].2, Psn::new(103));
}

#[test]
fn write_read_and_atomics() {
    let mut p = Pair::new(5, 6, Mtu::Mtu256, 14, 7, 7);
    let data = fill(&mut p.a, 0, 1000, 9);
    let remote_data = fill(&mut p.b, 4096, 700, 77);
    p.b.mem
        .bytes_mut(p.b.buf + 65536, 8)
        .copy_from_slice(&40u64.to_le_bytes());
    let wrs = vec![
        SendOp::Write(remote(&p.b, 0)),
        SendOp::Read(remote(&p.b, 4096)),
        SendOp::FetchAdd {
            remote: remote(&p.b, 65536),
            add: 2,
        },
        SendOp::CompareSwap {
            remote: remote(&p.b, 65536),
            compare: 42,
            swap: 7,
        },
        SendOp::CompareSwap {
            remote: remote(&p.b, 65536),
            compare: 42,
            swap: 9,
        },
    ];
    for (i, op) in wrs.into_iter().enumerate() {
        let sg = match op {
            SendOp::Write(_) => sge(&p.a, 0, 1000),
            SendOp::Read(_) => sge(&p.a, 8192, 700),
            _ => sge(&p.a, 16384 + 8 * i as u64, 8),
        };
        p.a.qp
            .post_send(SendWr {
                wr_id: i as u64,
                op,
                sg_list: sg,
                flags: signaled(),
            })
            .unwrap();
    }
    p.drive();
    let st: Vec<_> =
        p.a.wcs
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect();
    assert_eq!(
        st,
        vec![
            (0, WcStatus::Success, WcOpcode::RdmaWrite),
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::FetchAdd),
            (3, WcStatus::Success, WcOpcode::CompSwap),
            (4, WcStatus::Success, WcOpcode::CompSwap),
        ]
    );
    assert_eq!(p.b.mem.bytes(p.b.buf, 1000), &data[..]);
    assert_eq!(p.a.mem.bytes(p.a.buf + 8192, 700), &remote_data[..]);
    let word = |s: &Side, off| u64::from_le_bytes(s.mem.bytes(s.buf + off, 8).try_into().unwrap());
    assert_eq!(
        word(&p.a, 16384 + 16),
        40,
        "fetch-add returned the old value"
    );
    assert_eq!(word(&p.a, 16384 + 24), 42, "cas saw 42 and swapped");
    assert_eq!(
        word(&p.a, 16384 + 32),
        7,
        "second cas failed and returned 7"
    );
    assert_eq!(word(&p.b, 65536), 7);
    assert!(p.b.wcs.is_empty(), "WRITE and READ consume no receive");
}

#[test]
fn lost_middle_packet_naks_and_goes_back_n() {
    let mut p = Pair::new(10, 20, Mtu::Mtu256, 14, 7, 7);
    let data = fill(&mut p.a, 0, 256 * 8, 3);
    let mut dropped = false;
    p.filter = Box::new(move |to_b, pkt| {
        if to_b && pkt.bth().psn() == Psn::new(12) && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 2048),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs.len(), 1);
    assert_eq!(p.a.wcs[0].status, WcStatus::Success);
    assert_eq!(p.b.mem.bytes(p.b.buf, 2048), &data[..]);
    assert_eq!(p.b.qp.stats().seq_naks_sent, 1, "one NAK for the gap");
    assert_eq!(p.a.qp.stats().seq_naks_received, 1);
    assert_eq!(
        p.a.qp.stats().timeouts,
        0,
        "recovered without waiting for the timer"
    );
    let resent: Vec<Psn> = p.sent.iter().filter(|s| s.0).map(|s| s.2).skip(8).collect();
    assert_eq!(
        resent,
        (12..18).map(Psn::new).collect::<Vec<_>>(),
        "go back to 12"
    );
}

#[test]
fn psn_wraps_around() {
    let mut p = Pair::new(0xff_fffa, 0xff_fffe, Mtu::Mtu256, 14, 7, 7);
    let data = fill(&mut p.a, 0, 256 * 20, 5);
    for i in 0..4u64 {
        p.b.qp
            .post_recv(RecvWr {
                wr_id: i,
                sg_list: sge(&p.b, 8192 + i * 2048, 2048),
            })
            .unwrap();
    }
    for i in 0..4u64 {
        p.a.qp
            .post_send(SendWr {
                wr_id: i,
                op: SendOp::Send,
                sg_list: sge(&p.a, i * 1280, 1280),
                flags: signaled(),
            })
            .unwrap();
    }
    p.a.qp
        .post_send(SendWr {
            wr_id: 9,
            op: SendOp::Read(remote(&p.b, 8192)),
            sg_list: sge(&p.a, 65536, 2048),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(
        p.a.wcs
            .iter()
            .filter(|w| w.status == WcStatus::Success)
            .count(),
        5
    );
    for i in 0..4usize {
        assert_eq!(
            p.b.mem.bytes(p.b.buf + 8192 + i as u64 * 2048, 1280),
            &data[i * 1280..(i + 1) * 1280]
        );
    }
    assert!(p.sent.iter().any(|s| s.2 == Psn::new(0)), "crossed PSN 0");
}

#[test]
fn rnr_nak_waits_then_succeeds() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    fill(&mut p.a, 0, 100, 1);
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: sge(&p.a, 0, 100),
            flags: signaled(),
        })
        .unwrap();
    // No receive yet: RNR NAK; post one after a few steps.
    for _ in 0..4 {
        p.step();
    }
    assert!(p.b.qp.stats().rnr_naks_sent >= 1);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 5,
            sg_list: sge(&p.b, 0, 100),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs[0].status, WcStatus::Success);
    assert_eq!(p.b.wcs[0].byte_len, 100);
}

#[test]
fn rnr_retry_exhaustion_flushes_the_rest() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 2);
    for i in 0..3 {
        p.a.qp
            .post_send(SendWr {
                wr_id: i,
                op: SendOp::Send,
                sg_list: sge(&p.a, 0, 10),
                flags: SendFlags::default(),
            })
            .unwrap();
    }
    p.drive();
    let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![
            (0, WcStatus::RnrRetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        p.a.qp.stats().rnr_naks_received,
        3,
        "first try plus rnr_retry = 2"
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(p.a.qp.poll_event(), Some(QpEvent::QpFatal));
}

#[test]
fn retry_exhaustion_gives_retry_exc_err() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 10, 3, 7);
    p.filter = Box::new(|to_b, _| !to_b); // the peer never hears us
    for i in 0..2 {
        p.a.qp
            .post_send(SendWr {
                wr_id: i,
                op: SendOp::Write(remote(&p.b, 0)),
                sg_list: sge(&p.a, 0, 10),
                flags: signaled(),
            })
            .unwrap();
    }
    p.drive();
    let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![(0, WcStatus::RetryExcErr), (1, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        p.a.qp.stats().timeouts,
        4,
        "first timeout plus retry_cnt = 3 retries"
    );
    // 4.096 us x 2^10 per timeout.
    assert_eq!(p.now.as_nanos(), 4 * 4096 * 1024);
}

#[test]
fn access_violations_nak_and_leave_memory_untouched() {
    for case in 0..4 {
        let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
        let mut ro = VecMemory::new();
        std::mem::swap(&mut ro, &mut p.b.mem);
        p.b.mem = ro;
        let ro_addr =
            p.b.mem
                .register(4096, LKey(99), RKey(0x99), AccessFlags::REMOTE_READ);
        p.b.mem.bytes_mut(ro_addr, 4096).fill(0x5a);
        fill(&mut p.a, 0, 64, 1);
        let (op, status) = match case {
            0 => (
                SendOp::Write(RemoteAddr {
                    addr: p.b.buf,
                    rkey: RKey(0xdead),
                }),
                WcStatus::RemAccessErr,
            ),
            1 => (
                SendOp::Write(RemoteAddr {
                    addr: p.b.buf + (1 << 20) - 10,
                    rkey: RKey(0x1022),
                }),
                WcStatus::RemAccessErr,
            ),
            2 => (
                SendOp::Write(RemoteAddr {
                    addr: ro_addr,
                    rkey: RKey(0x99),
                }),
                WcStatus::RemAccessErr,
            ),
            _ => (
                SendOp::FetchAdd {
                    remote: RemoteAddr {
                        addr: ro_addr,
                        rkey: RKey(0x99),
                    },
                    add: 1,
                },
                WcStatus::RemAccessErr,
            ),
        };
        let len = if case == 3 { 8 } else { 64 };
        let before_b = p.b.mem.clone();
        p.a.qp
            .post_send(SendWr {
                wr_id: 1,
                op,
                sg_list: sge(&p.a, 0, len),
                flags: signaled(),
            })
            .unwrap();
        p.a.qp
            .post_send(SendWr {
                wr_id: 2,
                op: SendOp::Send,
                sg_list: sge(&p.a, 0, 8),
                flags: signaled(),
            })
            .unwrap();
        p.drive();
        let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            st,
            vec![(1, status), (2, WcStatus::WrFlushErr)],
            "case {case}"
        );
        assert_eq!(
            p.b.mem.bytes(p.b.buf, 1 << 20),
            before_b.bytes(p.b.buf, 1 << 20),
            "case {case}"
        );
        assert!(
            p.b.mem.bytes(ro_addr, 4096).iter().all(|&b| b == 0x5a),
            "case {case}"
        );
        assert_eq!(p.b.qp.stats().access_errors, 1);
        assert_eq!(p.a.qp.state(), QpState::Err);
        assert_eq!(p.b.qp.state(), QpState::Err);
    }
}

#[test]
fn lost_atomic_ack_replays_without_reexecuting() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 8, 7, 7);
    let mut dropped = 0;
    p.filter = Box::new(move |to_b, pkt| {
        if !to_b && pkt.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE && dropped < 2 {
            dropped += 1;
            return false;
        }
        true
    });
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::FetchAdd {
                remote: remote(&p.b, 0),
                add: 5,
            },
            sg_list: sge(&p.a, 0, 8),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs[0].status, WcStatus::Success);
    assert_eq!(
        p.b.mem.bytes(p.b.buf, 8),
        &5u64.to_le_bytes(),
        "executed exactly once"
    );
    assert_eq!(p.a.mem.bytes(p.a.buf, 8), &0u64.to_le_bytes());
    assert_eq!(p.b.qp.stats().duplicate_requests, 2);
}

#[test]
fn lost_read_response_is_reissued_for_the_rest() {
    let mut p = Pair::new(1, 2, Mtu::Mtu256, 14, 7, 7);
    let data = fill(&mut p.b, 0, 256 * 6, 8);
    let mut dropped = false;
    p.filter = Box::new(move |to_b, pkt| {
        if !to_b && pkt.bth().psn() == Psn::new(4) && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Read(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 1536),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs[0].status, WcStatus::Success);
    assert_eq!(p.a.mem.bytes(p.a.buf, 1536), &data[..]);
    let reqs: Vec<_> = p.sent.iter().filter(|s| s.0).map(|s| s.2).collect();
    assert_eq!(
        reqs,
        vec![Psn::new(1), Psn::new(4)],
        "re-issued READ for the remainder"
    );
}

#[test]
fn state_machine_and_flush() {
    let mut qp = RcQp::new(Qpn::new(5), QpCaps::default(), CongestionConfig::None);
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: vec![],
        flags: signaled(),
    };
    assert!(qp.post_send(wr.clone()).is_err(), "RESET refuses posts");
    assert!(
        qp.post_recv(RecvWr {
            wr_id: 1,
            sg_list: vec![]
        })
        .is_err()
    );
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 3,
            sg_list: vec![],
        })
        .unwrap();
    p.a.qp.post_send(wr.clone()).unwrap();
    let to_err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    p.a.qp.modify(&to_err, AttrMask::STATE).unwrap();
    p.b.qp.modify(&to_err, AttrMask::STATE).unwrap();
    assert_eq!(
        p.a.qp.poll_completion().map(|w| w.status),
        Some(WcStatus::WrFlushErr)
    );
    assert_eq!(
        p.b.qp.poll_completion().map(|w| (w.wr_id, w.status)),
        Some((3, WcStatus::WrFlushErr))
    );
    // Posting in ERR completes with a flush at once.
    p.a.qp.post_send(wr).unwrap();
    assert_eq!(
        p.a.qp.poll_completion().map(|w| w.status),
        Some(WcStatus::WrFlushErr)
    );
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    p.a.qp.modify(&reset, AttrMask::STATE).unwrap();
    assert_eq!(p.a.qp.state(), QpState::Reset);
}

#[test]
fn ecn_marks_raise_cnps_and_dcqcn_slows_down() {
    let params = DcqcnParams::for_line_rate(10e9);
    let mut p = Pair::with_cc(
        1,
        2,
        Mtu::Mtu1024,
        14,
        7,
        7,
        CongestionConfig::Dcqcn(params),
    );
    p.mark_ce = true;
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 65536),
            flags: signaled(),
        })
        .unwrap();
    while p.a.wcs.is_empty() {
        assert!(p.step(), "transfer stalled");
    }
    assert_eq!(p.a.wcs[0].status, WcStatus::Success);
    assert!(p.b.qp.stats().cnps_sent >= 1);
    assert_eq!(p.a.qp.stats().cnps_received, p.b.qp.stats().cnps_sent);
    let rate = p.a.qp.congestion().rate_bps.unwrap();
    assert!(rate < 10e9, "rate {rate} was cut");
    // Left alone, the timer-driven increases bring it back to line rate.
    p.drive();
    assert_eq!(p.a.qp.congestion().rate_bps, Some(10e9));
}

#[test]
fn send_with_invalidate_revokes_the_key() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 1,
            sg_list: sge(&p.b, 0, 64),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::SendInv(RKey(0x1022)),
            sg_list: sge(&p.a, 0, 16),
            flags: signaled(),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 16),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.b.wcs[0].invalidated_rkey, Some(RKey(0x1022)));
    let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]
    );
}

#[test]
fn bad_local_key_gives_loc_prot_err() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    let bad = vec![Sge {
        addr: p.a.buf,
        length: 64,
        lkey: LKey(0xbad),
    }];
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: bad,
            flags: signaled(),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 8),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(p.sent.is_empty(), "nothing left the requester");
}

#[test]
fn receive_too_small_gives_loc_len_err_there_and_rem_inv_req_err_here() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 9,
            sg_list: sge(&p.b, 0, 100),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: sge(&p.a, 0, 3000),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs[0].status, WcStatus::RemInvReqErr);
    assert_eq!(
        (p.b.wcs[0].wr_id, p.b.wcs[0].status),
        (9, WcStatus::LocLenErr)
    );
    assert_eq!(p.b.qp.state(), QpState::Err);
}

#[test]
fn qp_without_remote_write_refuses_writes_with_rem_inv_req_err() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    let only_read = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: AccessFlags::REMOTE_READ,
        ..Default::default()
    };
    p.b.qp
        .modify(&only_read, AttrMask::STATE | AttrMask::ACCESS_FLAGS)
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 8),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs[0].status, WcStatus::RemInvReqErr);
    assert_eq!(p.b.qp.stats().invalid_requests, 1);
}

#[test]
fn sqd_drains_then_resumes() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 5000),
            flags: signaled(),
        })
        .unwrap();
    p.step(); // the first WRITE is under way
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        ..Default::default()
    };
    p.a.qp.modify(&sqd, AttrMask::STATE).unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::Write(remote(&p.b, 0)),
            sg_list: sge(&p.a, 0, 8),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    let st: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![(1, WcStatus::Success)],
        "the started WR finishes, the new one waits"
    );
    assert_eq!(p.a.qp.poll_event(), Some(QpEvent::SqDrained));
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    p.a.qp.modify(&rts, AttrMask::STATE).unwrap();
    p.drive();
    assert_eq!(p.a.wcs.len(), 2);
    assert_eq!(p.a.wcs[1].status, WcStatus::Success);
    // An idle send queue is drained at once.
    p.a.qp.modify(&sqd, AttrMask::STATE).unwrap();
    assert_eq!(p.a.qp.poll_event(), Some(QpEvent::SqDrained));
}

#[test]
fn broken_receive_buffer_gives_rem_op_err() {
    let mut p = Pair::new(1, 2, Mtu::Mtu1024, 14, 7, 7);
    let bad = vec![Sge {
        addr: p.b.buf,
        length: 64,
        lkey: LKey(0xbad),
    }];
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 4,
            sg_list: bad,
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: sge(&p.a, 0, 32),
            flags: signaled(),
        })
        .unwrap();
    p.drive();
    assert_eq!(p.a.wcs[0].status, WcStatus::RemOpErr);
    assert_eq!(
        (p.b.wcs[0].wr_id, p.b.wcs[0].status),
        (4, WcStatus::LocProtErr)
    );
}
