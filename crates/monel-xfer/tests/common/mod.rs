//! What the transfer engine's tests share.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use monel_xfer::{Agent, Desc, DescState, Op, XferError};

/// `len` bytes of a pattern that differs with `seed`.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// A descriptor: `op` of `len` bytes between `local` at `lo` and `remote` at `ro`.
pub(crate) fn desc<'a>(
    op: Op,
    local: &'a str,
    lo: u64,
    remote: &'a str,
    ro: u64,
    len: u64,
) -> Desc<'a> {
    Desc {
        op,
        local,
        local_offset: lo,
        remote,
        remote_offset: ro,
        len,
    }
}

/// `prefill` (connected to `decode`, named `peer`) sends a batch with an unknown segment, a
/// range past the end of `decode`'s 4096-byte "kv" and one good WRITE of 16 bytes of 7s
/// from its "src": the first two fail alone with their errors, the third lands exactly, and
/// nobody is notified.
pub(crate) fn bad_descriptors_fail_alone(decode: &Agent, prefill: &Agent, peer: &str) {
    let descs = [
        desc(Op::Write, "src", 0, "nope", 0, 8),
        desc(Op::Write, "src", 0, "kv", 4000, 100),
        desc(Op::Write, "src", 0, "kv", 64, 16),
    ];
    let id = prefill.transfer(peer, &descs, Some(b"x".to_vec())).unwrap();
    let st = prefill.wait(id, Duration::from_secs(20)).unwrap();
    assert!(
        matches!(&st[0], DescState::Failed(XferError::UnknownSegment(_))),
        "{st:?}"
    );
    assert!(
        matches!(&st[1], DescState::Failed(XferError::OutOfRange { .. })),
        "{st:?}"
    );
    assert_eq!(st[2], DescState::Done);
    let mut got = vec![0u8; 4096];
    decode.read_local("kv", 0, &mut got).unwrap();
    assert!(got[64..80].iter().all(|&b| b == 7));
    assert!(got[..64].iter().chain(&got[80..]).all(|&b| b == 0));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        decode.notifications().is_empty(),
        "a failed batch notifies nobody"
    );
}

/// Starts this test binary's ignored test `victim` in a process of its own, on address
/// `ip` (`XFER_VICTIM_IP`); returns it and the address its agent printed.
pub(crate) fn spawn_victim(victim: &str, ip: &str) -> (Child, SocketAddr) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", victim, "--nocapture"])
        .env("XFER_VICTIM_IP", ip)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let l = lines
            .next()
            .expect("the victim printed no address")
            .unwrap();
        if let Some(a) = l.strip_prefix("ADDR ") {
            break a.parse().unwrap();
        }
    };
    (child, addr)
}

/// `prefill` (named `from`, with 16 MiB "blocks" holding `src`) sends `decode` (named `to`,
/// with 16 MiB "kv" holding `kv`) one batch: a 9 MiB WRITE (sliced), 100 small contiguous
/// WRITEs (merged) and a 1 MiB READ, with a notification. Every descriptor is done, the
/// notification comes after the data, and exactly the bytes asked for moved, both ways.
pub(crate) fn a_batch_moves_exact_bytes(
    decode: &Agent,
    prefill: &Agent,
    to: &str,
    from: &str,
    src: &[u8],
    kv: &[u8],
) {
    let mut descs = vec![desc(Op::Write, "blocks", 0, "kv", 1 << 20, 9 << 20)];
    descs.extend((0..100u64).map(|k| {
        let at = (12 << 20) + k * 512;
        desc(Op::Write, "blocks", at, "kv", at, 512)
    }));
    descs.push(desc(Op::Read, "blocks", 10 << 20, "kv", 0, 1 << 20));
    let t = Duration::from_secs(20);
    let id = prefill
        .transfer(to, &descs, Some(b"request 1".to_vec()))
        .unwrap();
    let states = prefill.wait(id, t).unwrap();
    assert!(states.iter().all(|s| *s == DescState::Done), "{states:?}");
    let n = decode.wait_notifications(t);
    assert!(!n.is_empty(), "no notification within {t:?}");
    assert_eq!(
        (n[0].from.as_str(), n[0].payload.as_slice()),
        (from, &b"request 1"[..])
    );
    let mut got = vec![0u8; 16 << 20];
    decode.read_local("kv", 0, &mut got).unwrap();
    // The first MiB was READ (unchanged), then the WRITEs' bytes, nothing else touched.
    assert!(got[..1 << 20] == kv[..1 << 20]);
    assert!(got[1 << 20..10 << 20] == src[..9 << 20]);
    assert!(got[10 << 20..12 << 20] == kv[10 << 20..12 << 20]);
    assert!(got[12 << 20..(12 << 20) + 51200] == src[12 << 20..(12 << 20) + 51200]);
    assert!(got[(12 << 20) + 51200..] == kv[(12 << 20) + 51200..]);
    let mut back = vec![0u8; 1 << 20];
    prefill.read_local("blocks", 10 << 20, &mut back).unwrap();
    assert!(back == kv[..1 << 20], "the READ brought the target's bytes");
}

/// `b` (with 64 MiB "src") sends peer "a", the agent in process `victim` (64 MiB "dst"),
/// `blocks` WRITEs of 1 MiB, and the victim is killed once the first are in place: the
/// batch ends with some blocks done and the rest failed `PeerLost`, none pending, and a
/// WRITE to `b`'s other peer "c" (1 MiB "dst") still goes through.
pub(crate) fn a_killed_peer_fails_its_batch_alone(b: &Agent, mut victim: Child, blocks: u64) {
    let t = Duration::from_secs(20);
    let big: Vec<Desc<'_>> = (0..blocks)
        .map(|k| {
            desc(
                Op::Write,
                "src",
                (k % 64) << 20,
                "dst",
                (k % 64) << 20,
                1 << 20,
            )
        })
        .collect();
    let id = b.transfer("a", &big, None).unwrap();
    while !b.status(id).unwrap().contains(&DescState::Done) {
        std::thread::sleep(Duration::from_micros(200));
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
    let t0 = Instant::now();
    let s = b.wait(id, t).unwrap();
    assert!(s.contains(&DescState::Done), "{s:?}");
    assert!(
        s.iter()
            .any(|d| matches!(d, DescState::Failed(XferError::PeerLost(_)))),
        "{s:?}"
    );
    assert!(s.iter().all(|d| *d != DescState::Pending));
    eprintln!(
        "the lost peer's batch ended {:?} after the kill",
        t0.elapsed()
    );
    let id = b
        .transfer("c", &[desc(Op::Write, "src", 0, "dst", 0, 1 << 20)], None)
        .unwrap();
    assert_eq!(b.wait(id, t).unwrap(), [DescState::Done]);
    assert!(matches!(
        b.transfer("a", &big[..1], None),
        Err(XferError::PeerLost(_))
    ));
}

/// `decode` registered `mem` in place as "kv"; `prefill` (whose "src" is as long and holds
/// no zero byte) keeps writing 1 MiB blocks into it, and `decode` withdraws the segment
/// under those writes. Once `deregister` returns nothing lands in `mem` any more (it is
/// cleared and watched for 300 ms); some writes were done before, some failed after, and
/// every batch ended. Returns (done, failed).
pub(crate) fn writes_stop_at_the_withdrawal(
    decode: &Agent,
    prefill: &Agent,
    to: &str,
    mem: &mut [u8],
) -> (usize, usize) {
    let t = Duration::from_secs(20);
    let stop = AtomicBool::new(false);
    let blocks = (mem.len() >> 20) as u64;
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let descs: Vec<Desc<'_>> = (0..blocks)
                .map(|k| desc(Op::Write, "src", k << 20, "kv", k << 20, 1 << 20))
                .collect();
            let (mut done, mut failed) = (0, 0);
            while !stop.load(Ordering::Acquire) {
                let Ok(id) = prefill.transfer(to, &descs, None) else {
                    failed += 1;
                    continue;
                };
                for st in prefill.wait(id, t).unwrap() {
                    match st {
                        DescState::Done => done += 1,
                        DescState::Failed(_) => failed += 1,
                        DescState::Pending => panic!("a batch did not end"),
                    }
                }
            }
            (done, failed)
        });
        // Let the writes run, then withdraw the segment under them.
        let t0 = Instant::now();
        let mut first = [0u8; 1];
        while first[0] == 0 {
            assert!(t0.elapsed() < t, "no WRITE landed");
            std::thread::sleep(Duration::from_millis(1));
            decode.read_local("kv", 0, &mut first).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        decode.deregister("kv").unwrap();
        // The memory is the caller's again: clear it, and nothing may write it any more.
        mem.fill(0);
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Release);
        let (done, failed) = writer.join().unwrap();
        let seen = mem
            .iter()
            .map(|b| std::hint::black_box(*b))
            .filter(|&b| b != 0)
            .count();
        assert_eq!(seen, 0, "bytes landed after deregister returned");
        assert!(done > 0 && failed > 0, "done {done}, failed {failed}");
        (done, failed)
    })
}
