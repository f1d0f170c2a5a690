//! Hostile and failing peers, on loopback: each attack runs beside a real job, which must
//! still form and compute verified results while the attacker is refused; a rank that
//! freezes is named within the liveness bound.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use monel_ccl::{CommConfig, Communicator, DataType, RedOp, UniqueId};
use monel_peer::auth::Key;

/// The five address strings every forged registration here claims.
const ADDRS: [&str; 5] = ["127.0.0.1:9", "127.0.0.1:9", "m", "h", "0"];

fn addr_bytes() -> Vec<u8> {
    let mut m = Vec::new();
    for s in ADDRS {
        m.extend((s.len() as u16).to_le_bytes());
        m.extend(s.as_bytes());
    }
    m
}

/// A registration as the rendezvous protocol has it, for `n` ranks as rank `r`, answering
/// `challenge` with a proof under `key`.
fn registration(key: &Key, challenge: &[u8], n: u32, r: u32) -> Vec<u8> {
    let nonce = [7u8; 16];
    let body = addr_bytes();
    let mut m = b"MNL3".to_vec();
    m.extend(n.to_le_bytes());
    m.extend(r.to_le_bytes());
    m.extend(&body);
    m.extend(nonce);
    m.extend(key.prove(&[
        b"register",
        challenge,
        &nonce,
        &n.to_le_bytes(),
        &r.to_le_bytes(),
        &body,
    ]));
    m
}

/// Connects to the rendezvous and reads its challenge.
fn challenged(id: &UniqueId) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(id.root).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = [0u8; 20];
    s.read_exact(&mut c).unwrap();
    assert_eq!(&c[..4], b"MNL3");
    (s, c[4..].to_vec())
}

/// Registers with the rendezvous under `key` as rank `r` of `n`.
fn register(id: &UniqueId, key: &Key, n: u32, r: u32) -> TcpStream {
    let (mut s, c) = challenged(id);
    s.write_all(&registration(key, &c, n, r)).unwrap();
    s
}

/// Runs an `n`-rank float32 AllReduce on `id`, within `timeout`, and checks every element
/// on every rank.
fn job(id: &UniqueId, n: usize, timeout: Duration) {
    job_with(id, n, timeout, None);
}

/// [`job`], with every rank holding `secret`.
fn job_with(id: &UniqueId, n: usize, timeout: Duration, secret: Option<Key>) {
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            let (id, secret) = (id.clone(), secret.clone());
            std::thread::spawn(move || {
                let cfg = CommConfig {
                    timeout,
                    secret,
                    ..CommConfig::default()
                };
                let mut c = Communicator::init_rank(n, r, &id, cfg)?;
                let send: Vec<u8> = (0..64)
                    .flat_map(|i| ((r * 100 + i) as f32).to_le_bytes())
                    .collect();
                let mut recv = vec![0u8; send.len()];
                c.all_reduce(&send, &mut recv, 64, DataType::F32, RedOp::Sum)?;
                Ok::<_, monel_ccl::CclError>(recv)
            })
        })
        .collect();
    for (r, t) in ranks.into_iter().enumerate() {
        let got = t
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (i, b) in got.chunks_exact(4).enumerate() {
            let want = (0..n).map(|k| (k * 100 + i) as f32).sum::<f32>();
            assert_eq!(
                f32::from_le_bytes(b.try_into().unwrap()),
                want,
                "rank {r} [{i}]"
            );
        }
    }
}

/// Reads the rendezvous' answer to a registration: `Some(reason)` for a refusal.
fn refusal(s: &mut TcpStream) -> Option<String> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    assert_eq!(&h[..4], b"MNL3");
    if h[4] == 0 {
        return None;
    }
    let mut l = [0u8; 2];
    s.read_exact(&mut l).unwrap();
    let mut why = vec![0u8; usize::from(u16::from_le_bytes(l))];
    s.read_exact(&mut why).unwrap();
    Some(String::from_utf8(why).unwrap())
}

/// A registration claiming 2^32 - 1 ranks, sent before the real ranks, neither takes the
/// root down nor locks the real ranks out; it is refused once the real job forms.
#[test]
fn an_absurd_rank_count_neither_kills_the_root_nor_locks_the_job_out() {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    // The attacker knows the id here (as anyone knows a launcher's): its registrations
    // prove it.
    let key = id.job_key(None);
    let mut forged = register(&id, &key, u32::MAX, 0);
    let mut other = register(&id, &key, 3, 1);
    std::thread::sleep(Duration::from_millis(100));
    job(&id, 2, Duration::from_secs(20));
    let why = refusal(&mut forged).expect("the forged registration is refused");
    assert!(why.contains("not in 1..="), "{why}");
    let why = refusal(&mut other).expect("the other count is refused");
    assert!(why.contains("formed"), "{why}");
}

/// With a job secret, a process that knows the id (as anyone knows a launcher's) but not
/// the secret cannot take a rank's slot: its registration, sent before the real rank's, is
/// refused, and the real job forms and computes.
#[test]
fn a_rank_without_the_secret_cannot_steal_a_slot() {
    let secret = Key::from_secret(b"job secret");
    let id = UniqueId::create_with("127.0.0.1:0".parse().unwrap(), Some(&secret)).unwrap();
    let mut thief = register(&id, &id.job_key(None), 2, 1);
    let why = refusal(&mut thief).expect("the thief is refused");
    assert!(why.contains("could not prove the job key"), "{why}");
    job_with(&id, 2, Duration::from_secs(20), Some(secret.clone()));
    // A rank with the wrong secret is refused with an error that says so.
    let id = UniqueId::create_with("127.0.0.1:0".parse().unwrap(), Some(&secret)).unwrap();
    let cfg = CommConfig {
        timeout: Duration::from_secs(5),
        secret: Some(Key::from_secret(b"guess")),
        ..CommConfig::default()
    };
    let e = Communicator::init_rank(2, 1, &id, cfg).err().unwrap();
    assert!(e.message.contains("could not prove the job key"), "{e}");
}

/// A registration recorded off the wire and replayed on a new connection answers the wrong
/// challenge: refused. The real job then forms.
#[test]
fn a_replayed_registration_is_refused() {
    let secret = Key::from_secret(b"job secret");
    let id = UniqueId::create_with("127.0.0.1:0".parse().unwrap(), Some(&secret)).unwrap();
    let key = id.job_key(Some(&secret));
    // Recorded: a real registration for rank 1, answering the challenge of its connection.
    let (_first, c) = challenged(&id);
    let recorded = registration(&key, &c, 2, 1);
    let (mut replay, _) = challenged(&id);
    replay.write_all(&recorded).unwrap();
    let why = refusal(&mut replay).expect("the replay is refused");
    assert!(why.contains("could not prove the job key"), "{why}");
    job_with(&id, 2, Duration::from_secs(20), Some(secret));
}

/// Silent, slow and garbled connections to the rendezvous hold nobody up: the job forms
/// well within a timeout shorter than any one of them is allowed to stay silent.
#[test]
fn silent_and_garbled_connections_do_not_stall_the_rendezvous() {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(id.root).unwrap())
        .collect();
    let (mut half, c) = challenged(&id);
    half.write_all(&registration(&id.job_key(None), &c, 2, 1)[..10])
        .unwrap();
    let mut garbage = TcpStream::connect(id.root).unwrap();
    garbage.write_all(&[0xff; 64]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Each silent connection may stay 5 s; read one after another, three would take 15 s.
    job(&id, 2, Duration::from_secs(8));
    drop(silent);
}

/// Rank 1 of [`a_frozen_rank_is_named_within_the_liveness_bound`], in a process of its
/// own: all-reduces until it is stopped and killed.
fn frozen_child(id: &str) {
    let id: UniqueId = id.parse().unwrap();
    let mut c = Communicator::init_rank(2, 1, &id, CommConfig::default()).unwrap();
    let send = vec![0u8; 4096];
    let mut recv = vec![0u8; 4096];
    while c
        .all_reduce(&send, &mut recv, 1024, DataType::F32, RedOp::Sum)
        .is_ok()
    {}
}

/// A rank that freezes (SIGSTOP: its process is there, its connections open, nothing
/// moves) is named by its peer as lost within the liveness bound (3 s here), not after the
/// timeout (600 s here): the error is `PeerLost` naming it, where the timeout's would be
/// `Timeout`.
#[test]
fn a_frozen_rank_is_named_within_the_liveness_bound() {
    const CHILD: &str = "MONEL_TEST_FROZEN_RANK";
    if let Ok(id) = std::env::var(CHILD) {
        return frozen_child(&id);
    }
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_frozen_rank_is_named_within_the_liveness_bound",
            "--test-threads=1",
        ])
        .env(CHILD, id.to_string())
        .spawn()
        .unwrap();
    // Killed whatever happens here: a stopped child left behind would hold the test
    // harness's output open.
    let child = Reaper(child);
    let cfg = CommConfig {
        timeout: Duration::from_secs(600),
        liveness: Duration::from_secs(3),
        ..CommConfig::default()
    };
    let mut c = Communicator::init_rank(2, 0, &id, cfg).unwrap();
    let send = vec![0u8; 4096];
    let mut recv = vec![0u8; 4096];
    c.all_reduce(&send, &mut recv, 1024, DataType::F32, RedOp::Sum)
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The stop takes effect a moment later: wait until the child is stopped for certain.
    let stopped = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WUNTRACED));
    assert!(
        matches!(stopped, Ok(nix::sys::wait::WaitStatus::Stopped(..))),
        "{stopped:?}"
    );
    // The child may be a call ahead: the error comes within a few calls.
    let e = (0..4).find_map(|_| {
        c.all_reduce(&send, &mut recv, 1024, DataType::F32, RedOp::Sum)
            .err()
    });
    drop(child);
    let e = e.expect("the frozen rank fails the call");
    assert_eq!(e.kind, monel_ccl::ErrorKind::PeerLost, "{e}");
    assert_eq!(e.ranks, vec![1], "{e}");
    assert!(e.message.contains("rank 1 has not answered"), "{e}");
}

/// A child process, killed and reaped on drop.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
