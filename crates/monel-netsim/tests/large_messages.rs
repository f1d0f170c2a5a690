//! Streams of large WRITEs (hundreds of packets each) across a lossy, slow path still
//! complete: the shape of a bulk transfer through the software switch.

use core::time::Duration;

use monel_netsim::{ConnectConfig, LinkConfig, Network};
use monel_rc::memory::AccessFlags;
use monel_rc::{Instant, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcStatus};
use monel_wire::{LKey, RKey};

#[test]
fn megabyte_writes_complete_under_loss() {
    const MSG: u32 = 1 << 20;
    const DEPTH: u64 = 16;
    const TOTAL: u64 = 64;
    for seed in 1..=3u64 {
        let link = LinkConfig {
            latency: Duration::from_micros(50),
            bandwidth_bps: 10e9,
            loss: 0.01,
            ..LinkConfig::default()
        };
        let mut net = Network::star(2, link, seed);
        let conn = ConnectConfig {
            timeout: 14,
            ..ConnectConfig::default()
        };
        net.connect(0, 1, &conn);
        let len = (DEPTH as usize) * MSG as usize;
        let a = net
            .host_mut(0)
            .mem
            .register(len, LKey(1), RKey(0x100), AccessFlags::LOCAL_WRITE);
        let b = net.host_mut(1).mem.register(
            len,
            LKey(2),
            RKey(0x200),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        let (mut posted, mut done) = (0u64, 0usize);
        while done < TOTAL as usize {
            while posted < TOTAL && posted - (done as u64) < DEPTH {
                let off = (posted % DEPTH) * u64::from(MSG);
                let wr = SendWr {
                    wr_id: posted,
                    op: SendOp::Write(RemoteAddr {
                        addr: b + off,
                        rkey: RKey(0x200),
                    }),
                    sg_list: vec![Sge {
                        addr: a + off,
                        length: MSG,
                        lkey: LKey(1),
                    }],
                    flags: SendFlags {
                        signaled: true,
                        ..Default::default()
                    },
                };
                net.host_mut(0).qps[0].post_send(wr).unwrap();
                net.kick(0);
                posted += 1;
            }
            let before = net.host(0).completions.len();
            let deadline = Instant::from_nanos(net.now().as_nanos() + 5_000_000_000);
            net.run_until(deadline, |n| n.host(0).completions.len() > before);
            let got = net.host(0).completions.len();
            assert!(
                got > before,
                "seed {seed}: stalled after {done} of {TOTAL} WRITEs at {:?}; {:?}",
                net.now(),
                net.host(0).qps[0].stats()
            );
            for (_, wc) in &net.host(0).completions[before..got] {
                assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
            }
            done = got;
        }
    }
}
