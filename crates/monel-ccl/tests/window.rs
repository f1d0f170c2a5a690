//! Symmetric memory windows: collectives on window buffers run directly between the ranks'
//! memory (`last_path() == "window"`) and give bitwise the results of the ordinary path
//! (the deterministic algorithm for AllReduce) for every collective, type, reduction, rank
//! count, odd count, offset and in-place form; a rank outside the window, a mismatched call
//! and ranks on different hosts end in a clear error or the ordinary path, never a hang.

use std::time::{Duration, Instant};

use monel_ccl::WINDOW_MIN_BYTES as MIN_BYTES;
use monel_ccl::{
    Algorithm, Collective, CommConfig, Communicator, DataType, ErrorKind, Io, RedOp, Transports,
    UniqueId,
};
use monel_sched::fp8::Fp8;

/// Runs `f(comm)` on `n` ranks (threads) of one communicator; `host(r)` is rank r's
/// `MONEL_HOST` (`None`: this machine).
fn ranks<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    host: fn(usize) -> Option<String>,
    f: impl Fn(&mut Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    ranks_over(n, timeout, host, None, f)
}

/// As [`ranks`], on the given transports only (`MONEL_TRANSPORT`'s syntax) when named.
fn ranks_over<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    host: fn(usize) -> Option<String>,
    via: Option<&'static str>,
    f: impl Fn(&mut Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, f) = (id.clone(), f.clone());
            std::thread::spawn(move || {
                let mut cfg = CommConfig {
                    timeout,
                    ..CommConfig::default()
                };
                cfg.shm.ring = 64 << 10;
                cfg.shm.host = host(r);
                if let Some(via) = via {
                    cfg.transports = Transports::parse(via).unwrap();
                }
                let mut c = Communicator::init_rank(n, r, &id, cfg).unwrap();
                f(&mut c)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn one_host(_: usize) -> Option<String> {
    None
}

/// Element `i` of rank `r` in `t`: 0, 1 or 2, exact in every type, order and reduction.
fn input(t: DataType, r: usize, count: usize, salt: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| {
            let k = (r * 7 + i * 3 + salt) % 3;
            let x = k as f32;
            match t {
                DataType::I8 | DataType::U8 => vec![k as u8],
                DataType::I32 | DataType::U32 => (k as u32).to_le_bytes().to_vec(),
                DataType::I64 | DataType::U64 => (k as u64).to_le_bytes().to_vec(),
                DataType::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
                DataType::Bf16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
                DataType::F32 => x.to_le_bytes().to_vec(),
                DataType::F64 => f64::from(x).to_le_bytes().to_vec(),
                DataType::F8E4M3 => vec![Fp8::E4M3.from_f32(x)],
                DataType::F8E5M2 => vec![Fp8::E5M2.from_f32(x)],
                other => panic!("no test values for {other}"),
            }
        })
        .collect()
}

/// The collectives under test, with the root (if any) at the last rank.
fn collectives(n: usize, op: RedOp) -> Vec<Collective> {
    vec![
        Collective::AllReduce(op),
        Collective::ReduceScatter(op),
        Collective::Reduce(op, n - 1),
        Collective::AllGather,
        Collective::Broadcast(n - 1),
        Collective::AllToAll,
        Collective::Gather(n - 1),
        Collective::Scatter(n - 1),
    ]
}

/// Runs `coll` once on plain vectors (`window == None`) or on the given windows (send,
/// recv), at byte offsets `off`; returns the receive bytes and the path taken.
#[allow(clippy::too_many_arguments)]
fn call(
    c: &mut Communicator,
    coll: Collective,
    t: DataType,
    count: usize,
    in_place: bool,
    salt: usize,
    window: Option<(&mut [u8], &mut [u8])>,
    off: usize,
) -> (Vec<u8>, &'static str) {
    let (n, r, es) = (c.size(), c.rank(), t.size());
    let (ins, outs) = coll.sizes(n, r, count);
    let data = input(t, r, ins, salt);
    let (mut vs, mut vr) = (
        vec![0u8; off + ins * es],
        vec![0u8; off + outs.max(n * count) * es],
    );
    let (send, recv): (&mut [u8], &mut [u8]) = match window {
        Some((s, r)) => (s, r),
        None => (&mut vs, &mut vr),
    };
    let send = &mut send[off..off + ins * es];
    send.copy_from_slice(&data);
    if in_place {
        let (len, io_off, oo) = coll.in_place_layout(n, r, count).unwrap();
        let buf = &mut recv[off..off + len * es];
        buf.fill(0);
        buf[io_off * es..io_off * es + data.len()].copy_from_slice(&data);
        c.collective(monel_ccl::Call::new(coll, t, count), Io::InPlace(buf))
            .unwrap();
        (buf[oo * es..oo * es + outs * es].to_vec(), c.last_path())
    } else {
        let recv = &mut recv[off..off + outs * es];
        recv.fill(0);
        c.collective(
            monel_ccl::Call::new(coll, t, count),
            Io::Separate { send, recv },
        )
        .unwrap();
        (recv.to_vec(), c.last_path())
    }
}

#[test]
fn every_collective_type_and_reduction_on_windows_runs_directly_with_the_same_bits() {
    for n in 1..=5 {
        let checked = ranks(n, Duration::from_secs(30), one_host, move |c| {
            let n = c.size();
            let max = 4099 * n * 8;
            let mut ws = c.alloc_window(max + 64).unwrap();
            let mut wr = c.alloc_window(max + 64).unwrap();
            assert!(
                ws.is_shared() && wr.is_shared(),
                "one host: windows are shared"
            );
            assert_ne!(ws.id(), wr.id());
            let mut checked = 0;
            for (k, t) in DataType::ALL.into_iter().enumerate() {
                for (m, op) in RedOp::ALL.into_iter().enumerate() {
                    for coll in collectives(n, op) {
                        // Reductions in every op; the rest once per type.
                        if coll.op().is_none() && m > 0 {
                            continue;
                        }
                        for (count, in_place) in
                            [(1003, false), (1003, true), (1, true), (0, false)]
                        {
                            if in_place && coll.in_place_layout(n, 0, count).is_none() {
                                continue;
                            }
                            let salt = k + m;
                            let off = 8 * ((k + c.rank()) % 3);
                            let ctx = format!(
                                "{coll} {t} count {count} in place {in_place} rank {} of {n}",
                                c.rank()
                            );
                            c.set_algorithm(
                                matches!(coll, Collective::AllReduce(_))
                                    .then_some(Algorithm::Deterministic),
                            );
                            let (want, p0) = call(c, coll, t, count, in_place, salt, None, 0);
                            c.set_algorithm(None);
                            let (got, p1) = call(
                                c,
                                coll,
                                t,
                                count,
                                in_place,
                                salt,
                                Some((&mut ws, &mut wr)),
                                off,
                            );
                            assert_ne!(p0, "window", "{ctx}");
                            // Small calls take the ordinary path.
                            assert_eq!(
                                p1 == "window",
                                count * t.size() >= MIN_BYTES,
                                "{ctx}: {p1}"
                            );
                            assert_eq!(got, want, "{ctx}");
                            checked += 1;
                        }
                    }
                }
            }
            // One independent reference: the f32 sum of the inputs, exactly.
            let count = 4099;
            let (got, _) = call(
                c,
                Collective::AllReduce(RedOp::Sum),
                DataType::F32,
                count,
                false,
                5,
                Some((&mut ws, &mut wr)),
                0,
            );
            let want: Vec<u8> = (0..count)
                .flat_map(|i| {
                    let s: f32 = (0..n).map(|r| ((r * 7 + i * 3 + 5) % 3) as f32).sum();
                    s.to_le_bytes()
                })
                .collect();
            assert_eq!(got, want);
            // A forced algorithm takes the ordinary path, even on windows.
            c.set_algorithm(Some(Algorithm::Ring));
            let (got2, p) = call(
                c,
                Collective::AllReduce(RedOp::Sum),
                DataType::F32,
                count,
                false,
                5,
                Some((&mut ws, &mut wr)),
                0,
            );
            assert_eq!(p, "ring");
            assert_eq!(got2, want);
            checked
        });
        // 12 types: 3 reductions x 5 ops and 5 other collectives, 3-4 forms each.
        assert!(
            checked.iter().all(|&k| k >= 720),
            "{n} ranks checked {checked:?}"
        );
    }
}

#[test]
fn a_rank_outside_the_window_is_named_within_the_timeout() {
    let timeout = Duration::from_secs(2);
    let t0 = Instant::now();
    let out = ranks(3, timeout, one_host, |c| {
        let r = c.rank();
        let mut w = c.alloc_window(8192).unwrap();
        let mut plain = vec![0u8; 8192];
        let buf: &mut [u8] = if r == 2 { &mut plain } else { &mut w };
        c.all_reduce_in_place(&mut buf[..4096], 1024, DataType::F32, RedOp::Sum)
    });
    let took = t0.elapsed();
    for (r, res) in out.iter().enumerate() {
        let e = res.as_ref().expect_err("no rank may succeed");
        if r < 2 {
            assert_eq!(e.kind, ErrorKind::Timeout, "rank {r}: {e}");
            assert!(e.ranks.contains(&2), "rank {r} names rank 2: {e}");
            assert!(e.message.contains("window"), "rank {r}: {e}");
        }
    }
    assert!(took < timeout * 4, "every rank returned in {took:?}");
}

#[test]
fn a_mismatched_call_on_windows_fails_on_every_rank_and_moves_no_byte() {
    let out = ranks(3, Duration::from_secs(10), one_host, |c| {
        let r = c.rank();
        let mut ws = c.alloc_window(8192).unwrap();
        let mut wr = c.alloc_window(8192).unwrap();
        ws.fill(1);
        wr.fill(7);
        // Both counts are large enough for the window path.
        let count = if r == 1 { 2000 } else { 1024 };
        let e = c
            .all_reduce(&ws, &mut wr, count, DataType::F32, RedOp::Sum)
            .expect_err("mismatch");
        assert!(
            wr.iter().all(|&b| b == 7),
            "rank {r}: receive buffer untouched"
        );
        assert_eq!(c.last_path(), "window");
        e
    });
    for (r, e) in out.iter().enumerate() {
        assert_eq!(e.kind, ErrorKind::Mismatch, "rank {r}: {e}");
        assert_eq!(e.ranks, vec![1], "rank {r}: {e}");
    }
}

#[test]
fn windows_of_ranks_on_different_hosts_stay_private_and_collectives_still_work() {
    let out = ranks(
        4,
        Duration::from_secs(20),
        |r| Some(format!("host{}", r / 2)),
        |c| {
            let mut w = c.alloc_window(4 * 2000).unwrap();
            let shared = w.is_shared();
            let r = c.rank() as f32;
            for (i, v) in w.chunks_exact_mut(4).enumerate() {
                v.copy_from_slice(&(i as f32 + r).to_le_bytes());
            }
            c.all_reduce_in_place(&mut w, 2000, DataType::F32, RedOp::Sum)
                .unwrap();
            let ok = w
                .chunks_exact(4)
                .enumerate()
                .all(|(i, v)| f32::from_le_bytes(v.try_into().unwrap()) == 4.0 * i as f32 + 6.0);
            (shared, ok, c.last_path())
        },
    );
    for (r, (shared, ok, path)) in out.into_iter().enumerate() {
        assert!(
            !shared,
            "rank {r}: ranks on two hosts cannot share a window"
        );
        assert!(ok, "rank {r}: sum");
        assert_ne!(path, "window", "rank {r}");
    }
}

/// Ranks that wait long at a window meeting sleep on the late rank's bell, and its arrival
/// wakes them: the call completes, exact, long before the timeout. (A missed wake-up would
/// leave them asleep until the deadline, and the call would fail with a timeout.)
#[test]
fn ranks_asleep_at_a_meeting_wake_when_the_late_rank_comes() {
    let timeout = Duration::from_secs(20);
    let late = Duration::from_millis(300);
    for rounds in [1, 3] {
        let t0 = Instant::now();
        let out = ranks(3, timeout, one_host, move |c| {
            let r = c.rank();
            let mut w = c.alloc_window(4 * 2048).unwrap();
            let mut ok = true;
            for round in 0..rounds {
                // A different rank is late each round, long past the spinning and yielding.
                if r == round % 3 {
                    std::thread::sleep(late);
                }
                for (i, v) in w.chunks_exact_mut(4).enumerate() {
                    v.copy_from_slice(&((i % 5) as f32 * (r + 1) as f32).to_le_bytes());
                }
                c.all_reduce_in_place(&mut w, 2048, DataType::F32, RedOp::Sum)
                    .unwrap();
                ok &= w.chunks_exact(4).enumerate().all(|(i, v)| {
                    f32::from_le_bytes(v.try_into().unwrap()) == (i % 5) as f32 * 6.0
                });
                assert_eq!(c.last_path(), "window");
            }
            ok
        });
        assert!(out.iter().all(|&ok| ok), "{rounds} rounds: sums {out:?}");
        assert!(
            t0.elapsed() < timeout / 2,
            "{rounds} rounds took {:?}: a sleeping rank was not woken",
            t0.elapsed()
        );
    }
}

fn host_of_its_own(r: usize) -> Option<String> {
    Some(format!("host{r}"))
}

/// Ranks on different hosts over the soft RNIC: their windows are registered with the NIC,
/// and every collective on them, in place and out of place, gives the ordinary path's bits
/// while the sends of bytes nothing overwrites during the call go straight from the window
/// (two SGEs: the frame header from staging, the payload where it lies).
#[test]
fn windows_registered_with_the_nic_send_without_staging_and_give_the_same_bits() {
    for n in [2, 3] {
        let out = ranks_over(
            n,
            Duration::from_secs(60),
            host_of_its_own,
            Some("rdma"),
            move |c| {
                let n = c.size();
                let max = 70_001 * n * 4;
                let mut ws = c.alloc_window(max + 64).unwrap();
                let mut wr = c.alloc_window(max + 64).unwrap();
                assert!(!ws.is_shared() && !wr.is_shared());
                let mut seen = Vec::new();
                for (k, t) in [DataType::F32, DataType::U8].into_iter().enumerate() {
                    for coll in collectives(n, RedOp::Sum) {
                        for (count, in_place) in [(70_001, false), (70_001, true), (1003, false)] {
                            if in_place && coll.in_place_layout(n, 0, count).is_none() {
                                continue;
                            }
                            let ctx = format!(
                                "{coll} {t} count {count} in place {in_place} rank {} of {n}",
                                c.rank()
                            );
                            let (want, _) = call(c, coll, t, count, in_place, k, None, 0);
                            let before = c.zero_copy_bytes();
                            let off = 8 * ((k + c.rank()) % 3);
                            let win = Some((&mut *ws, &mut *wr));
                            let (got, path) = call(c, coll, t, count, in_place, k, win, off);
                            assert_ne!(path, "window", "{ctx}");
                            assert_eq!(got, want, "{ctx}");
                            seen.push((format!("{coll} {t} {count} {in_place}"), {
                                c.zero_copy_bytes() - before
                            }));
                        }
                    }
                }
                seen
            },
        );
        // Out of place, every collective sends bytes nothing overwrites during the call
        // from the window on some rank. The reduction chain (Reduce on 2 ranks) sends
        // partial sums from scratch, which is not registered.
        for (i, (what, _)) in out[0].iter().enumerate() {
            let straight: u64 = out.iter().map(|rank| rank[i].1).sum();
            if what.ends_with("70001 false") && !(n == 2 && what.starts_with("reduce(")) {
                assert!(straight > 0, "{n} ranks, {what}: nothing went straight");
            }
        }
    }
}

/// A call on registered windows returns only once the peers have the bytes it sent from
/// them: the caller may overwrite its window at once and the peers still get what was
/// there. Freed windows leave the communicator working, and a new window is registered.
#[test]
fn a_window_overwritten_right_after_the_call_does_not_change_what_peers_got() {
    const LEN: usize = 8 << 20;
    let out = ranks_over(
        3,
        Duration::from_secs(60),
        host_of_its_own,
        Some("rdma"),
        |c| {
            let r = c.rank();
            let pattern = |round: usize, i: usize| (i * 31 + round * 7 + 1) as u8;
            let mut straight = 0;
            for life in 0..2 {
                let mut ws = c.alloc_window(LEN).unwrap();
                let mut wr = c.alloc_window(3 * LEN).unwrap();
                for round in 0..3 {
                    let round = life * 3 + round;
                    for (i, b) in ws.iter_mut().enumerate() {
                        *b = pattern(round + r, i);
                    }
                    let before = c.zero_copy_bytes();
                    c.broadcast(&ws, &mut wr[..LEN], LEN, DataType::U8, round % 3)
                        .unwrap();
                    // Overwrite at once: a send still reading the window would carry this.
                    ws.fill(0xEE);
                    for (i, &b) in wr[..LEN].iter().enumerate() {
                        assert_eq!(b, pattern(round + round % 3, i), "rank {r} byte {i}");
                    }
                    for (i, b) in ws.iter_mut().enumerate() {
                        *b = pattern(round + r, i);
                    }
                    c.all_gather(&ws, &mut wr, LEN, DataType::U8).unwrap();
                    ws.fill(0xEE);
                    for (j, part) in wr.chunks_exact(LEN).enumerate() {
                        for (i, &b) in part.iter().enumerate() {
                            assert_eq!(b, pattern(round + j, i), "rank {r} from {j} byte {i}");
                        }
                    }
                    straight += c.zero_copy_bytes() - before;
                }
            }
            // The communicator outlives its windows.
            let mut v = vec![1u8; 4096];
            c.all_reduce_in_place(&mut v, 4096, DataType::U8, RedOp::Sum)
                .unwrap();
            assert!(v.iter().all(|&b| b == 3));
            straight
        },
    );
    assert!(out.iter().all(|&s| s > 0), "bytes sent straight: {out:?}");
}
