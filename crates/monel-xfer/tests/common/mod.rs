//! What the transfer engine's tests share.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
