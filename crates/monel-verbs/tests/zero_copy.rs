//! Zero-copy sends: request payloads go from the registered region straight into the send
//! call, mixed with copied pieces (SGEs under 512 bytes), and every byte arrives, with every
//! ICRC right, whatever the SGE layout, padding and MTU.

mod common;

use common::*;
use monel_verbs::*;

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Two sides with `zero_copy` as given.
fn pair_with(x: u8, port: u16, mtu: Mtu, zero_copy: bool) -> (Side, Side) {
    let cfg = ContextConfig {
        udp_port: port,
        zero_copy,
        ..ContextConfig::default()
    };
    let cap = QpCap {
        max_send_sge: 16,
        ..QpCap::default()
    };
    let side = |ip: String| side_with(&ip, cfg.clone(), cap);
    let a = side(format!("127.0.0.{x}"));
    let b = side(format!("127.0.0.{}", x + 1));
    connect(&a, &b, mtu);
    (a, b)
}

/// SGE lengths mixing pieces that are lent (>= 512) and copied, with an odd total (pad).
const SGES: [usize; 9] = [3, 700, 100, 5000, 1, 513, 511, 9000, 2];

fn run(x: u8, port: u16, mtu: Mtu, zero_copy: bool) -> DeviceCounters {
    let (a, b) = pair_with(x, port, mtu, zero_copy);
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let total: usize = SGES.iter().sum();
    // Two source regions, SGEs alternating between them at odd offsets.
    let src = [
        a.pd.reg_mr(pattern(40_000, 1), rw).unwrap(),
        a.pd.reg_mr(pattern(40_000, 2), rw).unwrap(),
    ];
    let mut sg_list = Vec::new();
    let mut expect = Vec::new();
    let mut off = [17usize, 333];
    for (i, &n) in SGES.iter().enumerate() {
        let r = i % 2;
        sg_list.push(src[r].sge(off[r], n));
        expect.extend_from_slice(&pattern(40_000, 1 + r as u32)[off[r]..off[r] + n]);
        off[r] += n + 7;
    }
    let dst = b.pd.reg_mr(vec![0u8; 2 * total + 64], rw).unwrap();
    // WRITE at an odd offset, then SEND of the same gather list.
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write(RemoteAddr {
            addr: dst.addr() + 5,
            rkey: dst.rkey(),
        }),
        sg_list: sg_list.clone(),
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    b.qp.post_recv(RecvWr {
        wr_id: 2,
        sg_list: vec![dst.sge(total + 32, total)],
    })
    .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sg_list,
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let wc = one(&b.cq);
    assert_eq!(
        (wc.status, wc.byte_len as usize),
        (WcStatus::Success, total)
    );
    let mut got = vec![0u8; total];
    dst.read(5, &mut got).unwrap();
    assert!(
        got == expect,
        "WRITE data differs (mtu {mtu:?}, zero_copy {zero_copy})"
    );
    dst.read(total + 32, &mut got).unwrap();
    assert!(
        got == expect,
        "SEND data differs (mtu {mtu:?}, zero_copy {zero_copy})"
    );
    assert_eq!(b.ctx.counters().icrc_errors, 0);
    a.ctx.counters()
}

#[test]
fn gathered_payloads_arrive_whole_at_every_mtu() {
    let total: u64 = SGES.iter().sum::<usize>() as u64;
    for (i, mtu) in [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]
        .into_iter()
        .enumerate()
    {
        let c = run(40 + 2 * i as u8, 25_791 + i as u16, mtu, true);
        // At MTU 256 no piece reaches 512 bytes: everything is copied.
        if mtu == Mtu::Mtu256 {
            assert_eq!(c.tx_zero_copy_bytes, 0, "{c}");
        } else {
            assert!(
                c.tx_zero_copy_bytes > total && c.tx_zero_copy_bytes < 2 * total,
                "{c}"
            );
        }
    }
}

#[test]
fn copying_sends_stay_available() {
    let c = run(50, 25_795, Mtu::Mtu4096, false);
    assert_eq!(c.tx_zero_copy_bytes, 0);
}
