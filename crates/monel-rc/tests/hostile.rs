//! Hostile input to a live QP: random bytes, and valid packets with random bytes changed. The
//! engine must never panic or loop, and memory outside the registered, remotely writable
//! region must stay untouched. Proptest prints the failing case and its seed.

use monel_rc::memory::{AccessFlags, VecMemory};
use monel_rc::{CongestionConfig, Instant, Mtu, QpAttr, QpCaps, RcQp, RecvWr, Sge};
use monel_wire::packet::pad_for;
use monel_wire::{BthRepr, ExtHeaders, LKey, Opcode, PKey, Psn, Qpn, RKey, RethRepr, RoceRepr};
use proptest::prelude::*;

fn live_qp() -> (RcQp, VecMemory, u64, u64) {
    let mut mem = VecMemory::new();
    let recv = mem.register(4096, LKey(1), RKey(0x10), AccessFlags::LOCAL_WRITE);
    let guarded = mem.register(4096, LKey(2), RKey(0x20), AccessFlags::REMOTE_READ);
    let mut qp = RcQp::new(Qpn::new(0x11), QpCaps::default(), CongestionConfig::None);
    let a = QpAttr {
        port_num: 1,
        qp_access_flags: AccessFlags::ALL,
        path_mtu: Mtu::Mtu256,
        dest_qp_num: Qpn::new(0x22),
        rq_psn: Psn::new(100),
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        timeout: 1,
        retry_cnt: 2,
        ..Default::default()
    };
    qp.bring_up(&a).unwrap();
    for i in 0..4 {
        qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![Sge {
                addr: recv,
                length: 4096,
                lkey: LKey(1),
            }],
        })
        .unwrap();
    }
    (qp, mem, recv, guarded)
}

fn valid_write(psn: u32, va: u64, len: usize) -> Vec<u8> {
    let repr = RoceRepr {
        bth: BthRepr {
            opcode: Opcode::RC_WRITE_ONLY,
            solicited: false,
            migreq: false,
            pad_count: pad_for(len),
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x11),
            ack_req: true,
            psn: Psn::new(psn),
        },
        ext: ExtHeaders::Reth(RethRepr {
            va,
            rkey: RKey(0x20),
            dma_len: len as u32,
        }),
        payload_len: len,
    };
    let mut b = vec![0u8; repr.buffer_len()];
    repr.emit(&mut b).unwrap();
    b
}

fn drive(qp: &mut RcQp, mem: &mut VecMemory, pkts: &[Vec<u8>]) {
    let mut out = vec![0u8; 8192];
    for (i, p) in pkts.iter().enumerate() {
        let now = Instant::from_micros(i as u64 * 10);
        qp.handle_packet(now, p, i % 3 == 0, mem);
        qp.handle_timeout(now);
        let mut n = 0;
        while qp.poll_transmit(now, &mut out, mem).is_some() {
            n += 1;
            assert!(n < 10_000, "transmit loop did not end");
        }
        while qp.poll_completion().is_some() {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(pkts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 1..20)) {
        let (mut qp, mut mem, _, guarded) = live_qp();
        let pkts: Vec<Vec<u8>> = pkts.into_iter().map(|mut p| {
            if p.len() >= 8 { p[4..8].copy_from_slice(&[0, 0, 0, 0x11]); }
            if !p.is_empty() { p[0] &= 0x1f; }
            if p.len() >= 2 { p[1] &= 0xf0; }
            p
        }).collect();
        drive(&mut qp, &mut mem, &pkts);
        prop_assert!(mem.bytes(guarded, 4096).iter().all(|&b| b == 0), "read-only region written");
    }

    #[test]
    fn mutated_writes_never_touch_read_only_memory(edits in proptest::collection::vec((0usize..48, any::<u8>()), 0..6), psn_off in 0u32..4) {
        let (mut qp, mut mem, _, guarded) = live_qp();
        let mut p = valid_write(100 + psn_off, guarded, 16);
        for (at, v) in edits {
            let at = at % p.len();
            p[at] = v;
        }
        drive(&mut qp, &mut mem, &[p]);
        prop_assert!(mem.bytes(guarded, 4096).iter().all(|&b| b == 0), "read-only region written");
    }
}
