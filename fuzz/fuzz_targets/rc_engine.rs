//! Arbitrary packet sequences into a live RC QP: no panic, no hang, counters only grow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monel_rc::memory::{AccessFlags, VecMemory};
use monel_rc::{CongestionConfig, Instant, Mtu, QpAttr, QpCaps, RcQp, RecvWr, Sge};
use monel_wire::{LKey, Psn, Qpn, RKey};

fuzz_target!(|data: &[u8]| {
    let mut mem = VecMemory::new();
    let buf = mem.register(1 << 16, LKey(1), RKey(1), AccessFlags::ALL);
    let mut qp = RcQp::new(Qpn::new(0x11), QpCaps::default(), CongestionConfig::None);
    let a = QpAttr {
        port_num: 1,
        qp_access_flags: AccessFlags::ALL,
        path_mtu: Mtu::Mtu256,
        dest_qp_num: Qpn::new(0x22),
        rq_psn: Psn::new(0),
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        timeout: 1,
        ..Default::default()
    };
    qp.bring_up(&a).unwrap();
    for i in 0..4 {
        let _ = qp.post_recv(RecvWr { wr_id: i, sg_list: vec![Sge { addr: buf, length: 4096, lkey: LKey(1) }] });
    }
    let mut out = vec![0u8; 8192];
    let mut now = 0u64;
    // Split the input into packets at 0xff 0xfe markers; force the dest QP so they reach it.
    for chunk in data.split(|&b| b == 0xfe) {
        let mut pkt = chunk.to_vec();
        if pkt.len() >= 8 {
            pkt[5..8].copy_from_slice(&[0, 0, 0x11]);
        }
        now += 1000;
        qp.handle_packet(Instant::from_nanos(now), &pkt, false, &mut mem);
        qp.handle_timeout(Instant::from_nanos(now));
        for _ in 0..10_000 {
            if qp.poll_transmit(Instant::from_nanos(now), &mut out, &mem).is_none() {
                break;
            }
        }
        while qp.poll_completion().is_some() {}
    }
});
