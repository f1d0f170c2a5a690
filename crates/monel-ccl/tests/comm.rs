//! Communicators over real transports, one thread per rank: shared memory, the soft RNIC
//! (RoCEv2 on loopback), TCP on loopback, and a mix (ranks that claim different hosts).
//! Every collective against a reference, and
//! the failure cases (mismatch, a missing rank, a departed rank, bad arguments, a wrong
//! unique id) each end with a clear error on every rank, never a hang.
//!
//! One file of about a thousand lines: the cases share the helpers that start ranks on
//! each transport and check results against a reference, and each case is short.

use std::time::{Duration, Instant};

use monel_ccl::Transports;
use monel_ccl::{
    Collective, CommConfig, Communicator, DataType, ErrorKind, GroupOp, Io, RedOp, UniqueId,
};
use monel_sched::Algorithm;
use monel_verbs::protect::PacketAuth;

fn f32s(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}
fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// How the ranks of a test connect.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Shared memory between every pair, with rings of this many bytes.
    Shm(usize),
    /// The soft RNIC only (`MONEL_TRANSPORT=rdma`), with receive rings of this many bytes.
    Rdma(usize),
    /// TCP only (`MONEL_TRANSPORT=tcp`).
    Tcp,
    /// Ranks 2k and 2k+1 claim one host: shared memory inside, the soft RNIC across.
    Mixed,
    /// Ranks placed cyclically on two hosts (even ranks on one, odd on the other): shared
    /// memory inside, the soft RNIC across.
    Cyclic,
}

// Rings are small, so the suite fits a container's 64 MB /dev/shm; the 8 KiB RDMA ring makes
// every large message wrap and wait for credits.
const MODES: [Mode; 6] = [
    Mode::Shm(64 << 10),
    Mode::Shm(4096),
    Mode::Rdma(1 << 20),
    Mode::Rdma(8192),
    Mode::Tcp,
    Mode::Mixed,
];

fn config(mode: Mode, r: usize, timeout: Duration) -> CommConfig {
    let mut cfg = CommConfig {
        timeout,
        ..CommConfig::default()
    };
    match mode {
        Mode::Shm(ring) => cfg.shm.ring = ring,
        Mode::Rdma(ring) => {
            cfg.transports = Transports::parse("rdma").unwrap();
            cfg.rdma.ring = ring;
            // The small ring runs encrypted on rank 0's pairs (a pair takes the stronger
            // of its ranks' settings) and plain between the others; the large one with
            // the default tag on every packet.
            if ring < 1 << 20 {
                cfg.rdma.auth = if r == 0 {
                    PacketAuth::Encrypt
                } else {
                    PacketAuth::None
                };
            }
        }
        Mode::Tcp => cfg.transports = Transports::parse("tcp").unwrap(),
        Mode::Mixed => cfg.shm.host = Some(format!("host{}", r / 2)),
        Mode::Cyclic => cfg.shm.host = Some(format!("host{}", r % 2)),
    }
    cfg
}

/// Runs `f(comm)` on `n` ranks (threads) of one communicator; returns each rank's result.
fn ranks<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    f: impl Fn(&mut Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    ranks_over(Mode::Shm(64 << 10), n, timeout, f)
}

/// As [`ranks`], connected as `mode` says; checks that every pair took the path it should.
fn ranks_over<T: Send + 'static>(
    mode: Mode,
    n: usize,
    timeout: Duration,
    f: impl Fn(&mut Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, f) = (id.clone(), f.clone());
            std::thread::spawn(move || {
                let cfg = config(mode, r, timeout);
                let mut c = Communicator::init_rank(n, r, &id, cfg).unwrap();
                for (j, p) in (0..n).filter(|&j| j != r).zip(c.paths()) {
                    let want = match mode {
                        Mode::Shm(_) => "via SHM",
                        Mode::Rdma(_) => "via RoCE provider soft",
                        Mode::Tcp => "via TCP",
                        Mode::Mixed if j / 2 == r / 2 => "via SHM",
                        Mode::Mixed => "via RoCE provider soft",
                        Mode::Cyclic if j % 2 == r % 2 => "via SHM",
                        Mode::Cyclic => "via RoCE provider soft",
                    };
                    assert!(
                        p.starts_with(&format!("rank {r} -> {j} {want}")),
                        "{mode:?}: {p}"
                    );
                    if let Mode::Rdma(ring) = mode {
                        let packets = match (ring < 1 << 20, r == 0 || j == 0) {
                            (false, _) => "packets mac",
                            (true, true) => "packets encrypt",
                            (true, false) => "packets none",
                        };
                        assert!(p.contains(packets), "{mode:?}: {p}");
                        assert!(
                            p.contains(
                                "provider soft, dev monel_lo_127.0.0.1 port 1, GID 0 (the address this rank reaches the rendezvous from)"
                            ),
                            "{mode:?}: {p}"
                        );
                    }
                }
                f(&mut c)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn every_collective_over_every_transport() {
    for (mode, n) in MODES.into_iter().flat_map(|m| [(m, 1), (m, 3), (m, 4)]) {
        let out = ranks_over(mode, n, Duration::from_secs(20), move |c| {
            let (r, n) = (c.rank(), c.size());
            let count = 1000 + 3; // not a multiple of n
            let mine = f32s((0..count).map(|i| (i % 13) as f32 + r as f32));
            // AllReduce, large enough for the ring and small for direct.
            let mut out = vec![0u8; count * 4];
            c.all_reduce(&mine, &mut out, count, DataType::F32, RedOp::Sum)
                .unwrap();
            let want: Vec<f32> = (0..count)
                .map(|i| (0..n).map(|q| (i % 13) as f32 + q as f32).sum())
                .collect();
            assert_eq!(to_f32(&out), want, "all_reduce rank {r}");
            let mut small = f32s([r as f32 + 1.0]);
            c.all_reduce_in_place(&mut small, 1, DataType::F32, RedOp::Max)
                .unwrap();
            assert_eq!(to_f32(&small), [n as f32]);
            // Broadcast from the last rank, in place.
            let mut b = if r == n - 1 {
                f32s((0..count).map(|i| i as f32))
            } else {
                vec![0; count * 4]
            };
            c.broadcast_in_place(&mut b, count, DataType::F32, n - 1)
                .unwrap();
            assert_eq!(to_f32(&b), (0..count).map(|i| i as f32).collect::<Vec<_>>());
            // Reduce to rank 0 (avg).
            let mut red = vec![0u8; count * 4];
            c.reduce(&mine, &mut red, count, DataType::F32, RedOp::Avg, 0)
                .unwrap();
            if r == 0 {
                let avg: Vec<f32> = want.iter().map(|s| s / n as f32).collect();
                assert_eq!(to_f32(&red), avg);
            }
            // AllGather and ReduceScatter (i32).
            let per = 5;
            let g_in: Vec<u8> = (0..per)
                .flat_map(|i| (r as i32 * 100 + i).to_le_bytes())
                .collect();
            let mut g_out = vec![0u8; n * per as usize * 4];
            c.all_gather(&g_in, &mut g_out, per as usize, DataType::I32)
                .unwrap();
            let want_g: Vec<u8> = (0..n as i32)
                .flat_map(|q| (0..per).flat_map(move |i| (q * 100 + i).to_le_bytes()))
                .collect();
            assert_eq!(g_out, want_g);
            let rs_in: Vec<u8> = (0..n * per as usize)
                .flat_map(|i| (i as i32).to_le_bytes())
                .collect();
            let mut rs_out = vec![0u8; per as usize * 4];
            c.reduce_scatter(&rs_in, &mut rs_out, per as usize, DataType::I32, RedOp::Sum)
                .unwrap();
            let want_rs: Vec<u8> = (0..per as usize)
                .flat_map(|i| ((r * per as usize + i) as i32 * n as i32).to_le_bytes())
                .collect();
            assert_eq!(rs_out, want_rs);
            // AlltoAll (u8), Gather and Scatter.
            let a_in: Vec<u8> = (0..n).map(|j| (r * 10 + j) as u8).collect();
            let mut a_out = vec![0u8; n];
            c.all_to_all(&a_in, &mut a_out, 1, DataType::U8).unwrap();
            assert_eq!(
                a_out,
                (0..n).map(|j| (j * 10 + r) as u8).collect::<Vec<_>>()
            );
            let mut gat = vec![0u8; n];
            c.gather(&[r as u8], &mut gat, 1, DataType::U8, 0).unwrap();
            if r == 0 {
                assert_eq!(gat, (0..n).map(|j| j as u8).collect::<Vec<_>>());
            }
            let sc_in: Vec<u8> = (0..n).map(|j| 50 + j as u8).collect();
            let mut sc = [0u8];
            c.scatter(&sc_in, &mut sc, 1, DataType::U8, 0).unwrap();
            assert_eq!(sc[0], 50 + r as u8);
            c.barrier().unwrap();
            // A large all-reduce (several frames per message, staged reduction).
            let big = 3 << 20;
            let v = f32s((0..big).map(|i| ((i * 7 + r) % 11) as f32));
            let mut o = vec![0u8; big * 4];
            c.all_reduce(&v, &mut o, big, DataType::F32, RedOp::Sum)
                .unwrap();
            let got = to_f32(&o);
            for i in (0..big).step_by(9973) {
                let w: f32 = (0..n).map(|q| ((i * 7 + q) % 11) as f32).sum();
                assert_eq!(got[i], w, "element {i}");
            }
            // Odd byte counts first, then 8-byte elements: elements straddle ring wraps.
            for round in 0..20u64 {
                let mut odd = vec![1u8; 3 + round as usize];
                let len = odd.len();
                c.all_reduce_in_place(&mut odd, len, DataType::U8, RedOp::Sum)
                    .unwrap();
                assert!(odd.iter().all(|&x| x as usize == n));
                let count = 333 + round as usize * 17;
                let mut w: Vec<u8> = (0..count as u64)
                    .flat_map(|i| (i * (r as u64 + 1)).to_le_bytes())
                    .collect();
                c.all_reduce_in_place(&mut w, count, DataType::U64, RedOp::Sum)
                    .unwrap();
                let tri = (n * (n + 1) / 2) as u64;
                for (i, e) in w.chunks_exact(8).enumerate() {
                    assert_eq!(u64::from_le_bytes(e.try_into().unwrap()), i as u64 * tri);
                }
            }
        });
        assert_eq!(out.len(), n);
    }
}

/// Checks that every rank failed with the mismatch or with a peer's abort (`what` prefixes
/// the messages) and returns the error of a rank that saw the mismatch itself.
fn the_mismatch<'a>(errs: &'a [monel_ccl::CclError], what: &str) -> &'a monel_ccl::CclError {
    for (r, e) in errs.iter().enumerate() {
        assert!(
            matches!(e.kind, ErrorKind::Mismatch | ErrorKind::RemoteAbort),
            "{what}rank {r}: {e}"
        );
    }
    errs.iter()
        .find(|e| e.kind == ErrorKind::Mismatch)
        .unwrap_or_else(|| panic!("{what}nobody saw the mismatch"))
}

#[test]
fn mismatched_collectives_fail_on_every_rank() {
    let t0 = Instant::now();
    let errs = ranks(3, Duration::from_secs(10), |c| {
        let mut b = f32s([1.0, 2.0]);
        if c.rank() == 1 {
            c.broadcast_in_place(&mut b, 2, DataType::F32, 0)
                .unwrap_err()
        } else {
            c.all_reduce_in_place(&mut b, 2, DataType::F32, RedOp::Sum)
                .unwrap_err()
        }
    });
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "errors must come before the timeout"
    );
    let m = the_mismatch(&errs, "");
    assert!(
        m.message.contains("broadcast") && m.message.contains("all_reduce"),
        "{m}"
    );
}

/// A rank that forces another algorithm at run time (`set_algorithm` on some ranks only)
/// fails the call on every rank, the mismatch naming both algorithms. Before frames said
/// which algorithm their sender runs, of the 60 pairings on 2-4 ranks 8 ran through on 2
/// ranks (right sums by luck), 4 returned on some ranks only, with wrong sums on some
/// (direct against doubling, 3 and 4 ranks), and 8 hung until the timeout (ring against
/// halving on 4 ranks: data on a link the step does not read was taken for a later step's).
#[test]
fn ranks_that_force_different_algorithms_fail_on_every_rank() {
    use Algorithm::{Direct, Doubling, Halving, Ring, Tree};
    for (n, mine, odd) in [
        (2, Ring, Halving),
        (2, Direct, Doubling),
        (3, Direct, Doubling),
        (3, Ring, Doubling),
        (3, Tree, Halving),
        (4, Direct, Doubling),
        (4, Ring, Halving),
        (4, Tree, Ring),
    ] {
        let t0 = Instant::now();
        let errs = ranks(n, Duration::from_secs(10), move |c| {
            let last = c.rank() + 1 == n;
            c.set_algorithm(Some(if last { odd } else { mine }));
            let count = 1024;
            let mut b = f32s((0..count).map(|i| (i % 5) as f32));
            let res = c.all_reduce_in_place(&mut b, count, DataType::F32, RedOp::Sum);
            // Not an error: then at least the sums must be right.
            res.err().ok_or_else(|| {
                let want: Vec<f32> = (0..count).map(|i| (i % 5) as f32 * n as f32).collect();
                to_f32(&b) == want
            })
        });
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "{mine:?}/{odd:?}: errors must come before the timeout"
        );
        let errs: Vec<_> = errs
            .into_iter()
            .enumerate()
            .map(|(r, e)| {
                e.unwrap_or_else(|right| {
                    panic!("{mine:?}/{odd:?}: rank {r} succeeded (sums right: {right})")
                })
            })
            .collect();
        let m = the_mismatch(&errs, &format!("{mine:?}/{odd:?}: "));
        let names = [mine.name(), odd.name()];
        assert!(
            names
                .iter()
                .all(|a| m.message.contains(&format!("with {a}")))
                && m.message.contains("set_algorithm"),
            "{m}"
        );
    }
}

#[test]
fn a_missing_rank_is_named_with_where_it_was() {
    for mode in [Mode::Shm(64 << 10), Mode::Rdma(1 << 20), Mode::Tcp] {
        missing_rank(mode, 3);
    }
}

/// `n` ranks, the last of which never calls the all-reduce: the others name it.
fn missing_rank(mode: Mode, n: usize) {
    let last = n - 1;
    let errs = ranks_over(mode, n, Duration::from_millis(1500), move |c| {
        c.barrier().unwrap();
        if c.rank() == last {
            // It waits until the others gave up.
            std::thread::sleep(Duration::from_secs(4));
            return None;
        }
        let mut b = f32s([1.0]);
        Some(
            c.all_reduce_in_place(&mut b, 1, DataType::F32, RedOp::Sum)
                .unwrap_err(),
        )
    });
    let errs: Vec<_> = errs.into_iter().flatten().collect();
    assert_eq!(errs.len(), last);
    for e in errs {
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert_eq!(e.ranks, vec![last], "{e}");
        // Call #1 is init's own (the ranks agreeing on the cost model).
        let seen = format!("rank {last} last seen in barrier #2");
        assert!(e.message.contains(&seen), "{e}");
    }
}

#[test]
fn a_departed_rank_fails_its_peers_fast() {
    for mode in MODES {
        departed_rank(mode, 3);
    }
}

/// `n` ranks, rank 0 of which drops its communicator: the others fail fast, naming it.
fn departed_rank(mode: Mode, n: usize) {
    let t0 = Instant::now();
    let errs = ranks_over(mode, n, Duration::from_secs(20), |c| {
        if c.rank() == 0 {
            return None; // drops its communicator: its peers get a goodbye
        }
        let mut b = f32s([1.0; 64]);
        Some(
            c.all_reduce_in_place(&mut b, 64, DataType::F32, RedOp::Sum)
                .unwrap_err(),
        )
    });
    assert!(t0.elapsed() < Duration::from_secs(10));
    let errs: Vec<_> = errs.into_iter().flatten().collect();
    assert_eq!(errs.len(), n - 1);
    for e in errs {
        assert!(
            matches!(e.kind, ErrorKind::PeerLost | ErrorKind::RemoteAbort),
            "{e}"
        );
        assert!(e.message.contains("rank 0") || e.ranks.contains(&0), "{e}");
    }
}

#[test]
fn bad_arguments_are_refused_locally_and_the_communicator_lives_on() {
    ranks(2, Duration::from_secs(10), |c| {
        let mut out = [0u8; 8];
        let e = c
            .broadcast(&[0; 8], &mut out, 2, DataType::F32, 5)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("root 5"), "{e}");
        let e = c
            .all_gather(&[0; 8], &mut out, 2, DataType::F32)
            .unwrap_err();
        assert!(e.message.contains("recvbuff has 8 bytes"), "{e}");
        let e = c
            .collective(
                monel_ccl::Call::new(Collective::AllToAll, DataType::U8, 1),
                Io::InPlace(&mut out),
            )
            .unwrap_err();
        assert!(e.message.contains("no in-place form"), "{e}");
        // Still usable.
        let mut b = [1u8];
        c.all_reduce_in_place(&mut b, 1, DataType::U8, RedOp::Sum)
            .unwrap();
        assert_eq!(b[0], 2);
    });
}

/// A GID setting the soft RNIC's device cannot meet keeps the pair off RDMA, with the reason
/// naming the device and what its table holds; with TCP forbidden that is the job's error.
#[test]
fn an_impossible_gid_setting_is_refused_with_what_the_device_holds() {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                let mut cfg = CommConfig {
                    timeout: Duration::from_secs(10),
                    transports: Transports::parse("rdma").unwrap(),
                    ..CommConfig::default()
                };
                cfg.rdma.gid.index = Some(5);
                Communicator::init_rank(2, r, &id, cfg).err().unwrap()
            })
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap();
        assert!(
            e.message
                .contains("monel_lo_127.0.0.1 port 1 has no GID at index 5"),
            "{e}"
        );
        assert!(e.message.contains("0: RoCE v2 127.0.0.1"), "{e}");
    }
}

#[test]
fn a_wrong_unique_id_is_refused() {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut wrong = id;
    wrong.token[0] ^= 1;
    let cfg = CommConfig {
        timeout: Duration::from_secs(3),
        ..CommConfig::default()
    };
    let e = Communicator::init_rank(2, 1, &wrong, cfg).err().unwrap();
    assert!(e.message.contains("wrong unique id or secret"), "{e}");
}

#[test]
fn send_recv_and_groups_over_every_transport() {
    for (mode, n) in MODES.into_iter().flat_map(|m| [(m, 2), (m, 3)]) {
        ranks_over(mode, n, Duration::from_secs(20), move |c| {
            let (r, n) = (c.rank(), c.size());
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            // A ring shift of a message bigger than any transport's buffering: only a group
            // lets every rank send and receive at once.
            let count = 300_000 + r; // sizes differ per pair
            let out = f32s((0..count).map(|i| (i * 3 + r) as f32));
            let mut inc = vec![0u8; (count - r + prev) * 4];
            c.group(vec![
                GroupOp::Send {
                    buf: &out,
                    count,
                    dtype: DataType::F32,
                    peer: next,
                    tag: 0,
                },
                GroupOp::Recv {
                    buf: &mut inc,
                    count: 300_000 + prev,
                    dtype: DataType::F32,
                    peer: prev,
                    tag: 0,
                },
            ])
            .unwrap();
            let want: Vec<f32> = (0..300_000 + prev).map(|i| (i * 3 + prev) as f32).collect();
            assert_eq!(to_f32(&inc), want, "{mode:?} rank {r}");
            // Plain send/recv, ordered so nothing waits on itself: 0 -> 1 twice, in order.
            if r == 0 {
                c.send(&[7; 5], 5, DataType::U8, 1).unwrap();
                c.send(&f32s([1.5, 2.5]), 2, DataType::F32, 1).unwrap();
            } else if r == 1 {
                let mut a = [0u8; 5];
                c.recv(&mut a, 5, DataType::U8, 0).unwrap();
                assert_eq!(a, [7; 5]);
                let mut b = [0u8; 8];
                c.recv(&mut b, 2, DataType::F32, 0).unwrap();
                assert_eq!(to_f32(&b), [1.5, 2.5]);
            }
            // A group with a send to self, an all-to-all by hand, and a collective after.
            let mine: Vec<Vec<u8>> = (0..n).map(|j| vec![(10 * r + j) as u8; 3]).collect();
            let mut got: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 3]).collect();
            let mut sum = f32s([r as f32]);
            let mut ops: Vec<GroupOp<'_>> = Vec::new();
            for (j, m) in mine.iter().enumerate() {
                ops.push(GroupOp::Send {
                    buf: m,
                    count: 3,
                    dtype: DataType::U8,
                    peer: j,
                    tag: 40 + j as u32,
                });
            }
            for (j, g) in got.iter_mut().enumerate() {
                ops.push(GroupOp::Recv {
                    buf: g,
                    count: 3,
                    dtype: DataType::U8,
                    peer: j,
                    tag: 40 + r as u32,
                });
            }
            ops.push(GroupOp::Collective {
                coll: Collective::AllReduce(RedOp::Sum),
                dtype: DataType::F32,
                count: 1,
                io: Io::InPlace(&mut sum),
            });
            c.group(ops).unwrap();
            for (j, g) in got.iter().enumerate() {
                assert_eq!(
                    g,
                    &vec![(10 * j + r) as u8; 3],
                    "{mode:?} rank {r} from {j}"
                );
            }
            assert_eq!(to_f32(&sum), [(0..n).sum::<usize>() as f32]);
        });
    }
}

#[test]
fn mismatched_sends_and_bad_peers_are_errors() {
    let errs = ranks(2, Duration::from_secs(10), |c| {
        let e = c.send(&[0; 4], 1, DataType::F32, 2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        let e = c.send(&[0; 4], 2, DataType::F32, 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        let e = c.send(&[0; 4], 1, DataType::F32, c.rank()).unwrap_err();
        assert!(e.message.contains("send to self"), "{e}");
        // Rank 0 sends 8 bytes where rank 1 expects 4: refused before anything is
        // consumed, the message left for a receive of its size.
        if c.rank() == 0 {
            c.send(&[1; 8], 2, DataType::F32, 1).err()
        } else {
            let mut b = [0u8; 4];
            c.recv(&mut b, 1, DataType::F32, 0).err()
        }
    });
    let e = errs[1].as_ref().expect("the receiver sees the mismatch");
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(
        e.message.contains("8 bytes") && e.message.contains("4 bytes"),
        "{e}"
    );
}

#[test]
fn split_by_color_and_key() {
    let out = ranks(5, Duration::from_secs(20), |c| {
        let r = c.rank();
        // Evens and odds, numbered in reverse; rank 4 joins none.
        let color = if r == 4 { None } else { Some((r % 2) as u32) };
        let sub = c.split(color, -(r as i64)).unwrap();
        let got = sub.map(|mut sub| {
            let mut v = f32s([r as f32]);
            sub.all_reduce_in_place(&mut v, 1, DataType::F32, RedOp::Sum)
                .unwrap();
            (sub.rank(), sub.size(), to_f32(&v)[0])
        });
        // The parent still works after the split.
        let mut w = f32s([1.0]);
        c.all_reduce_in_place(&mut w, 1, DataType::F32, RedOp::Sum)
            .unwrap();
        assert_eq!(to_f32(&w), [5.0]);
        got
    });
    assert_eq!(out[0], Some((1, 2, 2.0)));
    assert_eq!(out[2], Some((0, 2, 2.0)));
    assert_eq!(out[1], Some((1, 2, 4.0)));
    assert_eq!(out[3], Some((0, 2, 4.0)));
    assert_eq!(out[4], None);
}

/// Runs an f32 AllReduce of `count` elements by every algorithm (forced, and the choice
/// reported as forced) and checks the exact sums.
fn every_allreduce_algorithm_sums_exactly(c: &mut Communicator, count: usize, what: &str) {
    let (r, n) = (c.rank(), c.size());
    for algo in Algorithm::ALL {
        let mine = f32s((0..count).map(|i| (i % 7) as f32 * (r + 1) as f32));
        let mut out = vec![0u8; count * 4];
        c.set_algorithm(Some(algo));
        c.all_reduce(&mine, &mut out, count, DataType::F32, RedOp::Sum)
            .unwrap();
        let tri = (n * (n + 1) / 2) as f32;
        let want: Vec<f32> = (0..count).map(|i| (i % 7) as f32 * tri).collect();
        assert_eq!(to_f32(&out), want, "{what} {} rank {r}", algo.name());
        assert_eq!(
            c.algorithm_for(Collective::AllReduce(RedOp::Sum), DataType::F32, count),
            algo
        );
    }
    c.set_algorithm(None);
}

/// Hosts of several ranks each (2 x 2, 3 x 2, and 2 x 2 placed cyclically) run large
/// AllReduces hierarchically by the cost model's own choice, sum and average exactly, in
/// place and out; hosts of unequal sizes keep the flat algorithms.
#[test]
fn hosts_of_several_ranks_reduce_hierarchically() {
    for (mode, n, hier) in [
        (Mode::Mixed, 4, true),
        (Mode::Mixed, 6, true),
        (Mode::Cyclic, 4, true),
        (Mode::Cyclic, 5, false),
    ] {
        ranks_over(mode, n, Duration::from_secs(30), move |c| {
            let (r, n) = (c.rank(), c.size());
            let count = 300_001; // about 1.2 MB, not a multiple of anything here
            let ar = Collective::AllReduce(RedOp::Sum);
            let picked = c.algorithm_for(ar, DataType::F32, count);
            assert_eq!(picked == Algorithm::Hier, hier, "{mode:?} {n}: {picked:?}");
            let mine = f32s((0..count).map(|i| (i % 5) as f32 * (r + 1) as f32));
            let tri = (n * (n + 1) / 2) as f32;
            let mut out = vec![0u8; count * 4];
            c.all_reduce(&mine, &mut out, count, DataType::F32, RedOp::Sum)
                .unwrap();
            assert_eq!(c.last_path(), picked.name());
            let want: Vec<f32> = (0..count).map(|i| (i % 5) as f32 * tri).collect();
            assert_eq!(to_f32(&out), want, "{mode:?} {n} rank {r}");
            let mut buf = mine.clone();
            c.all_reduce_in_place(&mut buf, count, DataType::F32, RedOp::Avg)
                .unwrap();
            let want: Vec<f32> = (0..count)
                .map(|i| (i % 5) as f32 * tri / n as f32)
                .collect();
            assert_eq!(to_f32(&buf), want, "{mode:?} {n} rank {r} avg in place");
            // Small calls keep the fewest steps.
            assert_ne!(c.algorithm_for(ar, DataType::F32, 2), Algorithm::Hier);
        });
    }
}

/// Runs `f(comm)` on `n` ranks whose configurations `cfg(rank)` gives; returns each rank's
/// init result and, where init succeeded, `f`'s.
fn ranks_with<T: Send + 'static>(
    n: usize,
    cfg: impl Fn(usize) -> CommConfig + Send + Sync + Clone + 'static,
    f: impl Fn(&mut Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<Result<T, monel_ccl::CclError>> {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, f, cfg) = (id.clone(), f.clone(), cfg.clone());
            std::thread::spawn(move || {
                Communicator::init_rank(n, r, &id, cfg(r)).map(|mut c| f(&mut c))
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Ranks whose own links differ still choose alike. Two hosts of two ranks, where rank 0
/// refuses shared memory: ranks 0 and 1 reach each other over the soft RNIC, ranks 2 and 3
/// over shared memory, so each pair prices the inside of a host differently. Before init
/// agreed on the cost model, ranks 2 and 3 went hierarchical at 32 KiB while 0 and 1 took
/// recursive doubling, and the call failed with a mismatch.
#[test]
fn ranks_with_different_links_choose_the_same_algorithm() {
    let cfg = |r: usize| {
        let mut c = CommConfig {
            timeout: Duration::from_secs(30),
            ..CommConfig::default()
        };
        c.shm.host = Some(format!("host{}", r / 2));
        if r == 0 {
            c.transports = Transports::parse("rdma,tcp").unwrap();
        }
        c
    };
    let out = ranks_with(4, cfg, |c| {
        let r = c.rank();
        let ar = Collective::AllReduce(RedOp::Sum);
        let sizes = [2, 16, 128, 1024, 8192, 65536, 1 << 19, 1 << 22];
        let picks: Vec<Algorithm> = sizes
            .iter()
            .map(|&n| c.algorithm_for(ar, DataType::F32, n))
            .collect();
        let ag: Vec<Algorithm> = sizes
            .iter()
            .map(|&n| c.algorithm_for(Collective::AllGather, DataType::F32, n))
            .collect();
        for count in [2, 1024, 8192, 65536] {
            let mine = f32s((0..count).map(|i| (i % 7) as f32 * (r + 1) as f32));
            let mut out = vec![0u8; count * 4];
            c.all_reduce(&mine, &mut out, count, DataType::F32, RedOp::Sum)
                .unwrap_or_else(|e| panic!("rank {r}, {count} floats: {e}"));
            let want: Vec<f32> = (0..count).map(|i| (i % 7) as f32 * 10.0).collect();
            assert_eq!(to_f32(&out), want, "rank {r}, {count} floats");
        }
        (c.paths().to_vec(), picks, ag)
    });
    let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
    // The links do differ: rank 0's path to rank 1 is the soft RNIC, rank 2's to 3 SHM.
    assert!(
        out[0].0[0].starts_with("rank 0 -> 1 via RoCE"),
        "{}",
        out[0].0[0]
    );
    assert!(
        out[2].0[2].starts_with("rank 2 -> 3 via SHM"),
        "{}",
        out[2].0[2]
    );
    for (r, o) in out.iter().enumerate() {
        assert_eq!(
            o.1, out[0].1,
            "rank {r}'s AllReduce choices against rank 0's"
        );
        assert_eq!(
            o.2, out[0].2,
            "rank {r}'s AllGather choices against rank 0's"
        );
    }
}

/// Ranks started with different `MONEL_ALGO` or `MONEL_CHUNK` would build different
/// schedules: init refuses, on every rank, naming the odd ones.
#[test]
fn ranks_with_different_settings_are_refused_at_init() {
    type Tweak = fn(&mut CommConfig);
    let tweaks: [(Tweak, &str); 3] = [
        (|c| c.algo = Some(Algorithm::Ring), "MONEL_ALGO"),
        (|c| c.chunk = 4096, "MONEL_CHUNK"),
        (|c| c.deterministic = true, "MONEL_DETERMINISTIC"),
    ];
    // Over every transport: a rank that sees the mismatch first and leaves must not take
    // its part of the exchange with it (a soft-RNIC link once closed before its last write
    // was acknowledged, and its peer saw a lost connection instead of the mismatch).
    for (tweak, name, via) in tweaks
        .into_iter()
        .flat_map(|(t, n)| ["shm,rdma,tcp", "rdma,tcp", "tcp"].map(move |v| (t, n, v)))
    {
        let cfg = move |r: usize| {
            let mut c = CommConfig {
                timeout: Duration::from_secs(20),
                transports: Transports::parse(via).unwrap(),
                ..CommConfig::default()
            };
            if r == 2 {
                tweak(&mut c);
            }
            c
        };
        let t0 = Instant::now();
        for (r, res) in ranks_with(3, cfg, |_| ()).into_iter().enumerate() {
            let e = res.expect_err("init must refuse");
            assert_eq!(e.kind, ErrorKind::Mismatch, "{via}: rank {r}: {e}");
            assert_eq!(e.ranks, vec![2], "{via}: rank {r}: {e}");
            assert!(e.message.contains(name), "{via}: rank {r}: {e}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{name} over {via}: before the timeout"
        );
    }
}

/// Ranks placed cyclically on two hosts take their places in rings and trees host by host
/// (the ring crosses between hosts twice, not at every step), every AllReduce algorithm still
/// gives the exact sum, and ranks placed host by host keep their own numbers.
#[test]
fn ranks_of_one_host_sit_next_to_each_other_in_rings() {
    for (mode, n, want) in [
        (Mode::Cyclic, 4, vec![0, 2, 1, 3]),
        (Mode::Cyclic, 5, vec![0, 2, 4, 1, 3]),
        (Mode::Mixed, 4, vec![0, 1, 2, 3]),
    ] {
        ranks_over(mode, n, Duration::from_secs(20), move |c| {
            let (r, n) = (c.rank(), c.size());
            assert_eq!(c.rank_order(), want.as_slice(), "{mode:?} rank {r}");
            every_allreduce_algorithm_sums_exactly(c, 3001, &format!("{mode:?}"));
            // A collective that depends on places: AllGather keeps rank order.
            let mut all = vec![0u8; 4 * n];
            c.all_gather(&f32s([r as f32]), &mut all, 1, DataType::F32)
                .unwrap();
            assert_eq!(to_f32(&all), (0..n).map(|x| x as f32).collect::<Vec<_>>());
        });
    }
}

#[test]
fn every_allreduce_algorithm_over_real_transports() {
    for mode in [Mode::Shm(4096), Mode::Rdma(8192), Mode::Tcp] {
        for n in [3, 4] {
            ranks_over(mode, n, Duration::from_secs(20), move |c| {
                every_allreduce_algorithm_sums_exactly(c, 5001, &format!("{mode:?}"));
            });
        }
    }
}

#[test]
fn reductions_out_of_a_ring_survive_elements_split_by_its_wrap() {
    // A 3-byte message first leaves every later f64 misaligned with the ring's end, so some
    // element straddles the wrap point and takes the staged path while the rest are reduced
    // in place; both must give the exact sums.
    for mode in [Mode::Shm(4096), Mode::Rdma(8192)] {
        ranks_over(mode, 3, Duration::from_secs(20), move |c| {
            let (r, n) = (c.rank(), c.size());
            let mut tiny = vec![r as u8; 3];
            c.all_reduce_in_place(&mut tiny, 3, DataType::U8, RedOp::Sum)
                .unwrap();
            assert_eq!(tiny, vec![3; 3], "{mode:?}");
            for round in 0..3u64 {
                let count = 7001;
                let mine: Vec<u8> = (0..count as u64)
                    .flat_map(|i| ((i * 3 + round + r as u64) as f64).to_le_bytes())
                    .collect();
                let mut out = vec![0u8; count * 8];
                c.all_reduce(&mine, &mut out, count, DataType::F64, RedOp::Sum)
                    .unwrap();
                for (i, v) in out.chunks_exact(8).enumerate() {
                    let got = f64::from_le_bytes(v.try_into().unwrap());
                    let want: u64 = (0..n as u64).map(|q| i as u64 * 3 + round + q).sum();
                    assert_eq!(
                        got, want as f64,
                        "{mode:?} round {round} element {i} rank {r}"
                    );
                }
            }
        });
    }
}

/// Calls take the algorithm the cost model gives for their shape, whether the choice is
/// priced afresh or remembered from an earlier call of that shape (more shapes than the
/// cache holds, each twice, in two orders, so slots are shared and overwritten).
#[test]
fn remembered_choices_match_the_cost_model() {
    let out = ranks(3, Duration::from_secs(20), |c| {
        let mut counts: Vec<usize> = (0..150).map(|i| 1 + i * 37 + (i * i) % 101).collect();
        counts.extend(counts.clone().into_iter().rev());
        counts.extend([1 << 16, 1 << 18, 1 << 16]);
        let mut bad = Vec::new();
        for &count in &counts {
            let mine = f32s((0..count).map(|i| (i % 3) as f32));
            let mut sum = vec![0u8; count * 4];
            c.all_reduce(&mine, &mut sum, count, DataType::F32, RedOp::Sum)
                .unwrap();
            let want = c.algorithm_for(Collective::AllReduce(RedOp::Sum), DataType::F32, count);
            if c.last_path() != want.name() {
                bad.push((count, c.last_path(), want.name()));
            }
            assert_eq!(to_f32(&sum)[count - 1], ((count - 1) % 3) as f32 * 3.0);
        }
        let picked: std::collections::BTreeSet<&str> = counts
            .iter()
            .map(|&n| {
                c.algorithm_for(Collective::AllReduce(RedOp::Sum), DataType::F32, n)
                    .name()
            })
            .collect();
        (bad, picked)
    });
    for (r, (bad, picked)) in out.into_iter().enumerate() {
        assert!(bad.is_empty(), "rank {r}: {bad:?}");
        // The sizes span more than one algorithm, so a stale choice would show.
        assert!(picked.len() >= 2, "rank {r}: {picked:?}");
    }
}

/// A rank that finished a collective may already send point-to-point to a peer that is
/// still in it, waiting on a third rank. Point-to-point messages number themselves per
/// pair, so such a message can carry the collective's own number: it is a message for
/// later, not a mismatch. (Checking the data that waits on links a step does not read once
/// took it for one: the message numbers here are kept equal to the collectives'.)
#[test]
fn a_send_that_overtakes_a_peers_collective_waits_for_it() {
    let out = ranks(3, Duration::from_secs(20), |c| {
        let r = c.rank();
        let mut got = Vec::new();
        // Init's exchange is call #1: one message ahead makes message #k go with call #k.
        if r == 0 {
            c.send(&[7u8], 1, DataType::U8, 1).unwrap();
        } else if r == 1 {
            let mut b = [0u8];
            c.recv(&mut b, 1, DataType::U8, 0).unwrap();
        }
        for i in 0..400u32 {
            let mine = (i + r as u32).to_le_bytes();
            let mut all = [0u8; 12];
            c.all_gather(&mine, &mut all, 4, DataType::U8).unwrap();
            if r == 2 && i % 2 == 0 {
                // Rank 1 waits on rank 2 now and then while rank 0 runs ahead.
                std::thread::sleep(Duration::from_micros(200));
            }
            if r == 0 {
                c.send(&i.to_le_bytes(), 4, DataType::U8, 1).unwrap();
            } else if r == 1 {
                let mut b = [0u8; 4];
                c.recv(&mut b, 4, DataType::U8, 0).unwrap();
                got.push(u32::from_le_bytes(b));
            }
            let want: Vec<u8> = (0..3u32).flat_map(|j| (i + j).to_le_bytes()).collect();
            assert_eq!(all.to_vec(), want, "rank {r}, round {i}");
        }
        got
    });
    assert_eq!(out[1], (0..400).collect::<Vec<u32>>());
}

/// Runs a fixed sequence of tiny two-rank AllReduces (every type and reduction, three
/// counts, in place and out) on random bits; returns each call's output and how many calls
/// the tiny path finished.
fn tiny_allreduces(mode: Mode) -> Vec<(Vec<Vec<u8>>, u64)> {
    ranks_over(mode, 2, Duration::from_secs(30), |c| {
        let r = c.rank();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ r as u64;
        let mut outs = Vec::new();
        for t in DataType::ALL {
            for op in RedOp::ALL {
                for count in [1, 3, 256 / t.size()] {
                    let mine: Vec<u8> = (0..count * t.size())
                        .map(|_| {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            seed as u8
                        })
                        .collect();
                    let mut out = vec![0u8; mine.len()];
                    c.all_reduce(&mine, &mut out, count, t, op).unwrap();
                    let mut inplace = mine.clone();
                    c.all_reduce_in_place(&mut inplace, count, t, op).unwrap();
                    assert_eq!(out, inplace, "{t} {op:?} {count}: in place differs");
                    outs.push(out);
                }
            }
        }
        (outs, c.tiny_calls())
    })
}

/// Tiny AllReduces between two ranks over shared memory take the fast path past the
/// executor, and give exactly the bits the executor gives for the same direct algorithm
/// (over TCP, where the fast path never runs).
#[test]
fn the_two_rank_tiny_path_gives_the_executors_bits() {
    let fast = tiny_allreduces(Mode::Shm(64 << 10));
    let slow = tiny_allreduces(Mode::Tcp);
    let calls = (DataType::ALL.len() * RedOp::ALL.len() * 3 * 2) as u64;
    for r in 0..2 {
        assert_eq!(slow[r].1, 0, "TCP never takes the tiny path");
        // The peer's frame may be late now and then (the executor takes those calls).
        assert!(fast[r].1 > calls / 2, "rank {r}: {} of {calls}", fast[r].1);
        assert_eq!(fast[r].0.len(), slow[r].0.len());
        for (k, (a, b)) in fast[r].0.iter().zip(&slow[r].0).enumerate() {
            assert_eq!(a, b, "rank {r}, call {k}");
        }
    }
    // (The two ranks may differ in NaN payloads: each computes mine op theirs, as the
    // executor does.)
}

/// The tiny path hands what it does not expect to the executor: a peer that comes late
/// (the sum is still right), and a peer that calls with another count (a mismatch on both
/// ranks, before the timeout).
#[test]
fn the_tiny_path_hands_late_and_mismatched_peers_to_the_executor() {
    let t0 = Instant::now();
    let out = ranks(2, Duration::from_secs(10), |c| {
        let r = c.rank();
        if r == 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut b = f32s([1.0 + r as f32, 10.0]);
        c.all_reduce_in_place(&mut b, 2, DataType::F32, RedOp::Sum)
            .unwrap();
        let late = (to_f32(&b), c.tiny_calls());
        let count = 2 + r;
        let mut b = f32s(vec![1.0; count]);
        let e = c
            .all_reduce_in_place(&mut b, count, DataType::F32, RedOp::Sum)
            .unwrap_err();
        (late, e)
    });
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "errors come before the timeout"
    );
    for (r, ((sum, _), _)) in out.iter().enumerate() {
        assert_eq!(sum, &[3.0, 20.0], "rank {r}");
    }
    // Rank 0 waited for rank 1 past the spin: the executor finished that call.
    assert_eq!(out[0].0.1, 0);
    let errs: Vec<_> = out.into_iter().map(|(_, e)| e).collect();
    let m = the_mismatch(&errs, "");
    assert!(m.message.contains("count"), "{m}");
}

/// Two ranks on the tiny path (a 4-byte and a 256-byte AllReduce): a peer that never calls
/// is named at the timeout with where it was, and a peer that drops its communicator fails
/// the call at once.
#[test]
fn the_tiny_path_names_a_missing_peer_and_sees_a_departed_one() {
    missing_rank(Mode::Shm(64 << 10), 2);
    departed_rank(Mode::Shm(64 << 10), 2);
}

/// Ranks that a launcher bound to cores of their own (`taskset`, `mpirun --bind-to core`)
/// each see one core, but together they have one core each: they must not count as
/// oversubscribed (which makes waiting ranks yield on every look, 2-3x slower for small
/// calls). Two ranks bound to one core are.
#[test]
fn ranks_bound_to_their_own_cores_are_not_oversubscribed() {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    // The two ranks' cores: two different ones where this process may use two, else one.
    for (own, want) in [(true, cpus.len().min(2)), (false, 1)] {
        let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
        let cpus = cpus.clone();
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (id, cpus) = (id.clone(), cpus.clone());
                std::thread::spawn(move || {
                    let mut one = CpuSet::new();
                    one.set(cpus[if own { r % cpus.len() } else { 0 }]).unwrap();
                    sched_setaffinity(Pid::from_raw(0), &one).unwrap();
                    let cfg = config(Mode::Shm(64 << 10), r, Duration::from_secs(20));
                    let mut c = Communicator::init_rank(2, r, &id, cfg).unwrap();
                    // Still a working communicator.
                    let mut b = f32s([r as f32 + 1.0]);
                    c.all_reduce_in_place(&mut b, 1, DataType::F32, RedOp::Sum)
                        .unwrap();
                    assert_eq!(to_f32(&b), [3.0]);
                    c.core_share()
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), (2, want), "bound to own cores: {own}");
        }
    }
}

/// TCP links ask the kernel for the congestion control the configuration names, skip the
/// ones it refuses, keep the system's when told to, and say in their path which one runs.
#[test]
fn tcp_links_run_the_congestion_control_asked_for() {
    let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .unwrap()
        .trim()
        .to_string();
    // Reno is always built in and always allowed, privileged or not.
    let cases: [(&[&str], String); 3] = [
        (&["reno"], "(congestion reno; not SHM".to_string()),
        (
            &["no_such_cc", "reno"],
            "(congestion reno; no_such_cc refused: ".to_string(),
        ),
        (&[], format!("(congestion {system}, the system's; not SHM")),
    ];
    for (wanted, want) in cases {
        let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let id = id.clone();
                let wanted: Vec<String> = wanted.iter().map(|w| w.to_string()).collect();
                std::thread::spawn(move || {
                    let mut cfg = config(Mode::Tcp, r, Duration::from_secs(20));
                    cfg.tcp_congestion = wanted;
                    let mut c = Communicator::init_rank(2, r, &id, cfg).unwrap();
                    let mut b = f32s((0..100_000).map(|i| (i + r) as f32));
                    c.all_reduce_in_place(&mut b, 100_000, DataType::F32, RedOp::Sum)
                        .unwrap();
                    assert_eq!(
                        to_f32(&b),
                        (0..100_000).map(|i| (2 * i + 1) as f32).collect::<Vec<_>>()
                    );
                    c.paths().to_vec()
                })
            })
            .collect();
        for h in hs {
            let paths = h.join().unwrap();
            assert_eq!(paths.len(), 1);
            assert!(paths[0].contains(&want), "{wanted:?}: {}", paths[0]);
        }
    }
}

/// `MONEL_DOCTOR=1`: init runs the brief checks. Ranks that fit this host start and work;
/// ranks whose shared-memory rings no /dev/shm holds fail init, each naming the check and
/// its fix, before any segment is made.
#[test]
fn the_doctor_at_init_passes_a_job_that_fits_and_stops_one_that_does_not() {
    let fits = |r: usize| {
        let mut c = CommConfig {
            timeout: Duration::from_secs(20),
            doctor: true,
            ..CommConfig::default()
        };
        // Two hosts of one rank: the locked-memory check runs too.
        c.shm.host = Some(format!("host{r}"));
        c
    };
    for (r, res) in ranks_with(2, fits, |c| {
        let mut out = vec![0u8; 8];
        c.all_reduce(&f32s([1.0, 2.0]), &mut out, 2, DataType::F32, RedOp::Sum)
            .map(|()| to_f32(&out))
    })
    .into_iter()
    .enumerate()
    {
        let sum = res.unwrap_or_else(|e| panic!("rank {r}: init: {e}"));
        assert_eq!(sum.unwrap(), vec![2.0, 4.0], "rank {r}");
    }
    let too_big = |_: usize| {
        let mut c = CommConfig {
            timeout: Duration::from_secs(20),
            doctor: true,
            ..CommConfig::default()
        };
        c.shm.ring = 1 << 50;
        c
    };
    for (r, res) in ranks_with(2, too_big, |_| ()).into_iter().enumerate() {
        let e = res.expect_err("init must refuse");
        assert_eq!(e.kind, ErrorKind::System, "rank {r}: {e}");
        assert!(
            e.message.contains("MONEL_DOCTOR: /dev/shm") && e.message.contains("fix:"),
            "rank {r}: {e}"
        );
    }
}

/// Receives match by tag, as torch's and MPI's do: a receive posted for tag 2 before one for
/// tag 1 gets the message tagged 2 whatever order they were sent in (the other waits aside,
/// then goes to its own receive); a receive from any rank names its source; a size that
/// does not match is refused and the message stays for a receive of its size, the
/// communicator usable. Over every transport; messages above a ring's size included.
#[test]
fn receives_match_by_tag_and_from_any_source() {
    for mode in MODES {
        ranks_over(mode, 3, Duration::from_secs(30), move |c| {
            let r = c.rank();
            let big = 100_000; // floats: larger than the small rings
            let payload =
                |tag: u32, len: usize| f32s((0..len).map(|i| (i as u32 * 7 + tag) as f32));
            if r == 0 {
                // Sent in tag order 1, 2, 3; received below in 3, 1, 2.
                for (tag, len) in [(1, 4), (2, big), (3, 16)] {
                    c.send_tagged(&payload(tag, len), len, DataType::F32, 1, tag)
                        .unwrap();
                }
            } else if r == 1 {
                for (tag, len) in [(3, 16), (1, 4), (2, big)] {
                    let mut b = vec![0u8; len * 4];
                    let from = c
                        .recv_tagged(&mut b, len, DataType::F32, Some(0), tag)
                        .unwrap();
                    assert_eq!(from, 0);
                    assert_eq!(b, payload(tag, len), "{mode:?}: tag {tag}");
                }
            }
            // Any source: ranks 0 and 2 each send one message to rank 1, tagged with their rank.
            if r != 1 {
                c.send_tagged(&payload(r as u32, 8), 8, DataType::F32, 1, 100 + r as u32)
                    .unwrap();
            } else {
                let mut seen = Vec::new();
                for _ in 0..2 {
                    // Tag 100 first, from whoever sent it; then 102.
                    let tag = if seen.is_empty() { 100 } else { 102 };
                    let mut b = vec![0u8; 32];
                    let from = c.recv_tagged(&mut b, 8, DataType::F32, None, tag).unwrap();
                    assert_eq!(from as u32, tag - 100, "{mode:?}");
                    assert_eq!(b, payload(from as u32, 8), "{mode:?}");
                    seen.push(from);
                }
            }
            // A receive of the wrong size: refused, nothing consumed; the right one then works.
            if r == 2 {
                c.send_tagged(&payload(9, 6), 6, DataType::F32, 0, 9)
                    .unwrap();
            } else if r == 0 {
                let mut b = vec![0u8; 40];
                let e = c
                    .recv_tagged(&mut b, 10, DataType::F32, Some(2), 9)
                    .expect_err("a 6-float message into a 10-float receive");
                assert_eq!(e.kind, ErrorKind::InvalidArgument, "{mode:?}: {e}");
                assert!(e.message.contains("24 bytes"), "{mode:?}: {e}");
                let from = c.recv_tagged(&mut b, 6, DataType::F32, None, 9).unwrap();
                assert_eq!((from, &b[..24]), (2, &payload(9, 6)[..]), "{mode:?}");
            }
            // Still usable: a collective after it all.
            let mut sum = f32s([1.0]);
            c.all_reduce_in_place(&mut sum, 1, DataType::F32, RedOp::Sum)
                .unwrap();
            assert_eq!(to_f32(&sum), [3.0], "{mode:?} rank {r}");
        });
    }
}

/// A receive in a group takes a message set aside earlier by a tagged receive; one whose
/// next message carries another tag fails loudly on both sides, never with wrong data.
#[test]
fn group_receives_take_set_aside_messages_and_refuse_a_wrong_tag() {
    ranks_over(Mode::Shm(64 << 10), 2, Duration::from_secs(20), |c| {
        let r = c.rank();
        if r == 0 {
            c.send_tagged(&[5; 4], 4, DataType::U8, 1, 5).unwrap();
            c.send_tagged(&[6; 4], 4, DataType::U8, 1, 6).unwrap();
            // The message of tag 8 meets a group receive for tag 7.
            c.send_tagged(&[8; 4], 4, DataType::U8, 1, 8).unwrap();
            let mut b = [0u8; 1];
            // Rank 1's failure reaches this rank.
            c.recv(&mut b, 1, DataType::U8, 1)
                .expect_err("rank 1 failed");
        } else {
            let mut six = [0u8; 4];
            c.recv_tagged(&mut six, 4, DataType::U8, Some(0), 6)
                .unwrap();
            assert_eq!(six, [6; 4]);
            let mut five = [0u8; 4];
            c.group(vec![GroupOp::Recv {
                buf: &mut five,
                count: 4,
                dtype: DataType::U8,
                peer: 0,
                tag: 5,
            }])
            .unwrap();
            assert_eq!(five, [5; 4], "from the messages set aside");
            let mut seven = [0u8; 4];
            let e = c
                .group(vec![GroupOp::Recv {
                    buf: &mut seven,
                    count: 4,
                    dtype: DataType::U8,
                    peer: 0,
                    tag: 7,
                }])
                .expect_err("the next message carries tag 8");
            assert_eq!(e.kind, ErrorKind::Mismatch, "{e}");
            assert!(
                e.message.contains("tag 8") && e.message.contains("tag 7"),
                "{e}"
            );
            assert_eq!(seven, [0; 4], "nothing landed");
        }
    });
}

/// torch's `monitored_barrier`, as Gloo runs it: passes when every rank arrives; when one
/// does not, rank 0 names it within the timeout and the others learn that rank 0 gave up;
/// with `wait_all`, rank 0 names every missing rank.
#[test]
fn a_monitored_barrier_names_the_ranks_that_do_not_arrive() {
    let timeout = Duration::from_millis(500);
    let out = ranks(3, Duration::from_secs(20), move |c| {
        c.monitored_barrier(timeout, false)
            .expect("every rank arrives");
        c.monitored_barrier(timeout, true).expect("again");
        let t0 = Instant::now();
        let r = c.rank();
        let res = if r == 2 {
            std::thread::sleep(Duration::from_millis(1500));
            Ok(())
        } else {
            c.monitored_barrier(timeout, false)
        };
        (r, res, t0.elapsed())
    });
    let (_, e0, took) = &out[0];
    let e0 = e0.as_ref().expect_err("rank 2 never came");
    assert_eq!(e0.kind, ErrorKind::Timeout, "{e0}");
    assert!(
        e0.message
            .contains("Rank 2 failed to pass monitoredBarrier in 500 ms"),
        "{e0}"
    );
    assert_eq!(e0.ranks, vec![2]);
    assert!(
        *took < Duration::from_secs(5),
        "within the timeout, not the communicator's"
    );
    let e1 = out[1].1.as_ref().expect_err("rank 0 gave up");
    assert!(
        e1.message.contains("Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0"),
        "{e1}"
    );
    // wait_all: ranks 1 and 2 both stay away.
    let out = ranks(3, Duration::from_secs(20), move |c| {
        (c.rank() == 0).then(|| c.monitored_barrier(timeout, true))
    });
    let e = out[0].as_ref().unwrap().as_ref().expect_err("nobody came");
    assert!(
        e.message
            .contains("Ranks 1, 2 failed to pass monitoredBarrier"),
        "{e}"
    );
    assert_eq!(e.ranks, vec![1, 2]);
}
