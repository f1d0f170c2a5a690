//! Every collective x algorithm x type x reduction, 1 to 9 ranks, counts that do not divide
//! by the rank count, in place and out of place: the schedules run in memory ([`sim`]) and
//! every rank's output is checked against a reference computed here, independently.

use half::{bf16, f16};
use monel_sched::buffers::Buffers;
use monel_sched::fp8::Fp8;
use monel_sched::plan::{self, Algorithm, Collective};
use monel_sched::schedule::{Op, validate};
use monel_sched::{DataType, RedOp, sim};
use proptest::prelude::*;

/// Encodes small integers as `t`, wrapping integers to the type's width.
fn encode(t: DataType, v: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &x in v {
        match t {
            DataType::I8 | DataType::U8 => out.push(x as u8),
            DataType::I32 | DataType::U32 => out.extend((x as u32).to_le_bytes()),
            DataType::I64 | DataType::U64 => out.extend((x as u64).to_le_bytes()),
            DataType::F16 => out.extend(f16::from_f64(x as f64).to_bits().to_le_bytes()),
            DataType::Bf16 => out.extend(bf16::from_f64(x as f64).to_bits().to_le_bytes()),
            DataType::F32 => out.extend((x as f32).to_le_bytes()),
            DataType::F64 => out.extend((x as f64).to_le_bytes()),
            DataType::F8E4M3 => out.push(Fp8::E4M3.from_f32(x as f32)),
            DataType::F8E5M2 => out.push(Fp8::E5M2.from_f32(x as f32)),
            _ => unreachable!(),
        }
    }
    out
}

/// The reference reduction of one element across ranks, encoded as `t`.
fn reference(t: DataType, op: RedOp, xs: &[i64], n: usize) -> Vec<u8> {
    let signed = matches!(t, DataType::I8 | DataType::I32 | DataType::I64) || t.is_float();
    // Unsigned types see the values as their (wrapped) unsigned encodings.
    let width = t.size() * 8;
    let as_type = |x: i64| -> i128 {
        if signed || t.is_float() {
            x as i128
        } else {
            (x as i128) & ((1i128 << width) - 1)
        }
    };
    let v: Vec<i128> = xs.iter().map(|&x| as_type(x)).collect();
    let r: i128 = match op {
        RedOp::Sum | RedOp::Avg => v.iter().sum(),
        RedOp::Prod => v.iter().fold(1i128, |a, &b| a.wrapping_mul(b)),
        RedOp::Min => *v.iter().min().unwrap(),
        RedOp::Max => *v.iter().max().unwrap(),
        _ => unreachable!(),
    };
    if op == RedOp::Avg {
        return match t {
            DataType::F16 => f16::from_f32(r as f32 / n as f32)
                .to_bits()
                .to_le_bytes()
                .to_vec(),
            DataType::Bf16 => bf16::from_f32(r as f32 / n as f32)
                .to_bits()
                .to_le_bytes()
                .to_vec(),
            DataType::F32 => (r as f32 / n as f32).to_le_bytes().to_vec(),
            DataType::F64 => (r as f64 / n as f64).to_le_bytes().to_vec(),
            DataType::F8E4M3 => vec![Fp8::E4M3.from_f32(r as f32 / n as f32)],
            DataType::F8E5M2 => vec![Fp8::E5M2.from_f32(r as f32 / n as f32)],
            // Integer average of the wrapped sum, in the type's own arithmetic.
            DataType::I8 => ((r as i8) / n as i8).to_le_bytes().to_vec(),
            DataType::U8 => ((r as u8) / n as u8).to_le_bytes().to_vec(),
            DataType::I32 => ((r as i32) / n as i32).to_le_bytes().to_vec(),
            DataType::U32 => ((r as u32) / n as u32).to_le_bytes().to_vec(),
            DataType::I64 => ((r as i64) / n as i64).to_le_bytes().to_vec(),
            DataType::U64 => ((r as u64) / n as u64).to_le_bytes().to_vec(),
            _ => unreachable!(),
        };
    }
    encode(t, &[r as i64])
}

struct Case {
    coll: Collective,
    algo: Algorithm,
    t: DataType,
    n: usize,
    count: usize,
    in_place: bool,
    seed: u64,
    /// The ranks' places in rings and trees (`plan::ScheduleRequest`).
    order: Vec<usize>,
    /// Ranks per host, the places in `order` host by host (0: hosts unknown).
    per_host: usize,
}

/// A number of ranks per host that divides `n` into several hosts of several ranks, picked
/// by `pick` (0 when `n` has none, or for one pick in three: hosts unknown).
fn hosts_of(n: usize, pick: usize) -> usize {
    let ls: Vec<usize> = (2..n).filter(|l| n % l == 0).collect();
    if ls.is_empty() || pick % 3 == 0 {
        0
    } else {
        ls[pick % ls.len()]
    }
}

/// A permutation of `0..n` from `seed` (Fisher-Yates over a xorshift stream).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

fn values(seed: u64, rank: usize, len: usize, op: Option<RedOp>) -> Vec<i64> {
    // Small values: every sum and product is exact in every float type, whatever the order.
    let mut x = seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match op {
                Some(RedOp::Prod) => [-2i64, -1, 1, 2][(x % 4) as usize],
                _ => (x % 17) as i64 - 4,
            }
        })
        .collect()
}

fn run_case(c: &Case) -> Result<(), String> {
    let (n, count, t) = (c.n, c.count, c.t);
    let es = t.size();
    let op = c.coll.op();
    // FP8 holds integers exactly only up to 8 (E5M2) or 16 (E4M3): its values are -1, 0 and 1,
    // so every partial sum of up to 8 ranks is exact.
    let fp8 = matches!(t, DataType::F8E4M3 | DataType::F8E5M2);
    let inputs: Vec<Vec<i64>> = (0..n)
        .map(|r| {
            let v = values(c.seed, r, c.coll.sizes(n, r, count).0, op);
            if fp8 {
                v.into_iter().map(|x| x.rem_euclid(3) - 1).collect()
            } else {
                v
            }
        })
        .collect();
    let scheds: Vec<_> = (0..n)
        .map(|r| {
            plan::ScheduleRequest {
                coll: c.coll,
                algo: c.algo,
                ranks: n,
                rank: r,
                count,
                slice: 3,
                in_place: c.in_place,
                order: &c.order,
                per_host: c.per_host,
            }
            .build()
            .unwrap()
        })
        .collect();
    for (r, s) in scheds.iter().enumerate() {
        let (i, o) = c.coll.sizes(n, r, count);
        let (i, o) = match (c.in_place, c.coll.in_place_layout(n, r, count)) {
            (true, Some((len, _, _))) => (len, len),
            _ => (i, o),
        };
        let layout = c
            .coll
            .in_place_layout(n, r, count)
            .filter(|_| c.in_place)
            .map(|(_, io, oo)| (io, oo));
        validate(s, [i.max(o), i.max(o), 0], layout).map_err(|e| format!("rank {r}: {e}"))?;
    }
    // Buffers per rank.
    let mut ins: Vec<Vec<u8>> = Vec::new();
    let mut users: Vec<Vec<u8>> = Vec::new();
    let mut layouts = Vec::new();
    for (r, input) in inputs.iter().enumerate() {
        let enc = encode(t, input);
        let (_, o) = c.coll.sizes(n, r, count);
        if c.in_place {
            let (len, ioff, ooff) = c.coll.in_place_layout(n, r, count).unwrap();
            let mut u = vec![0xA5u8; len * es];
            u[ioff * es..ioff * es + enc.len()].copy_from_slice(&enc);
            users.push(u);
            ins.push(Vec::new());
            layouts.push((ioff, ooff));
        } else {
            users.push(vec![0xA5u8; o * es]);
            ins.push(enc);
            layouts.push((0, 0));
        }
    }
    let op_or_sum = op.unwrap_or(RedOp::Sum);
    {
        let mut bufs: Vec<Buffers<'_>> = users
            .iter_mut()
            .zip(&ins)
            .zip(&layouts)
            .map(|((u, i), &(io, oo))| {
                if c.in_place {
                    Buffers::in_place(u, io, oo, t, op_or_sum, n)
                } else {
                    Buffers::separate(i, u, t, op_or_sum, n)
                }
            })
            .collect();
        sim::run(&scheds, &mut bufs).map_err(|e| e.to_string())?;
    }
    // Expected outputs.
    let red = |o: RedOp, off: usize, len: usize| -> Vec<u8> {
        (off..off + len)
            .flat_map(|e| {
                let xs: Vec<i64> = inputs.iter().map(|v| v[e]).collect();
                reference(t, o, &xs, n)
            })
            .collect()
    };
    for r in 0..n {
        let want: Option<Vec<u8>> = match c.coll {
            Collective::AllReduce(o) => Some(red(o, 0, count)),
            Collective::Broadcast(root) => Some(encode(t, &inputs[root])),
            Collective::Reduce(o, root) => (r == root).then(|| red(o, 0, count)),
            Collective::AllGather => Some(inputs.iter().flat_map(|v| encode(t, v)).collect()),
            Collective::ReduceScatter(o) => Some(red(o, r * count, count)),
            Collective::AllToAll => Some(
                (0..n)
                    .flat_map(|j| encode(t, &inputs[j][r * count..(r + 1) * count]))
                    .collect(),
            ),
            Collective::Gather(root) => {
                (r == root).then(|| inputs.iter().flat_map(|v| encode(t, v)).collect())
            }
            Collective::Scatter(root) => Some(encode(t, &inputs[root][r * count..(r + 1) * count])),
            Collective::Barrier => None,
        };
        let Some(want) = want else { continue };
        let ooff = layouts[r].1 * es;
        let got = &users[r][ooff..ooff + want.len()];
        if got != want.as_slice() {
            return Err(format!("rank {r}: got {got:?}, want {want:?}"));
        }
    }
    Ok(())
}

fn collectives(n: usize, root: usize, op: RedOp) -> Vec<Collective> {
    let root = root % n;
    vec![
        Collective::AllReduce(op),
        Collective::Broadcast(root),
        Collective::Reduce(op, root),
        Collective::AllGather,
        Collective::ReduceScatter(op),
        Collective::AllToAll,
        Collective::Gather(root),
        Collective::Scatter(root),
        Collective::Barrier,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every collective and algorithm for a random type, reduction, rank count (1-9),
    /// count (0-40, mostly not a multiple of the rank count), root and placement.
    #[test]
    fn every_collective_matches_the_reference(
        n in 1usize..=9,
        count in 0usize..40,
        t in 0usize..10, // not FP8 (the last two): 9 ranks overflow its exact integers
        o in 0usize..5,
        root in 0usize..9,
        in_place: bool,
        seed: u64,
        shuffle: bool,
        pick in 0usize..6,
    ) {
        let t = DataType::ALL[t];
        let op = RedOp::ALL[o];
        for coll in collectives(n, root, op) {
            for &algo in coll.algorithms() {
                let in_place = in_place && coll.in_place_layout(n, 0, count).is_some();
                // Ranks placed in a shuffled order (as ranks of several hosts are), half
                // the time.
                let order = if shuffle { shuffled(n, seed) } else { (0..n).collect() };
                let per_host = hosts_of(n, pick);
                let c = Case {
                    coll, algo, t, n, count, in_place, seed, order: order.clone(), per_host,
                };
                if let Err(e) = run_case(&c) {
                    return Err(TestCaseError::fail(format!(
                        "{coll} {} {t} n={n} count={count} in_place={in_place} seed={seed} \
                         order={order:?} per_host={per_host}: {e}",
                        algo.name()
                    )));
                }
            }
        }
    }
}

/// Every type x reduction x algorithm at one awkward size, exhaustively.
#[test]
fn allreduce_every_type_and_reduction() {
    for t in DataType::ALL {
        for op in RedOp::ALL {
            for n in [1, 2, 3, 5, 8] {
                for &algo in Collective::AllReduce(op).algorithms() {
                    for in_place in [false, true] {
                        let c = Case {
                            coll: Collective::AllReduce(op),
                            algo,
                            t,
                            n,
                            count: 2 * n + 1,
                            in_place,
                            seed: 7,
                            order: shuffled(n, 7),
                            per_host: hosts_of(n, 1),
                        };
                        run_case(&c).unwrap_or_else(|e| {
                            panic!("{t} {op} n={n} {} in_place={in_place}: {e}", algo.name())
                        });
                    }
                }
            }
        }
    }
}

/// The deterministic and direct all-reduces give the same bits on every rank for arbitrary
/// floats (no exact arithmetic to hide behind), and the ring agrees across ranks.
#[test]
fn deterministic_allreduce_bits_agree() {
    for n in 2..=7 {
        let count = 37;
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                (0..count)
                    .flat_map(|i| ((i as f32 + 0.1) * (r as f32 + 1.3).powi(3) / 7.0).to_le_bytes())
                    .collect()
            })
            .collect();
        let mut results = Vec::new();
        for algo in [
            Algorithm::Deterministic,
            Algorithm::Direct,
            Algorithm::Ring,
            Algorithm::Doubling,
            Algorithm::Halving,
            Algorithm::Tree,
        ] {
            let scheds: Vec<_> = (0..n)
                .map(|r| {
                    plan::schedule(
                        Collective::AllReduce(RedOp::Sum),
                        algo,
                        n,
                        r,
                        count,
                        4,
                        false,
                    )
                    .unwrap()
                })
                .collect();
            let mut outs = vec![vec![0u8; count * 4]; n];
            {
                let mut bufs: Vec<Buffers<'_>> = outs
                    .iter_mut()
                    .zip(&inputs)
                    .map(|(o, i)| Buffers::separate(i, o, DataType::F32, RedOp::Sum, n))
                    .collect();
                sim::run(&scheds, &mut bufs).unwrap();
            }
            for r in 1..n {
                assert_eq!(
                    outs[r],
                    outs[0],
                    "{} rank {r} differs from rank 0",
                    algo.name()
                );
            }
            results.push(outs.swap_remove(0));
        }
        assert_eq!(
            results[0], results[1],
            "deterministic and direct differ at n={n}"
        );
    }
}

/// Large AllReduces run the ring on pieces of `n` slices in turn, so a reduced piece is sent
/// on while it is in cache; small ones stay one ring (2(n - 1) steps).
#[test]
fn the_allreduce_ring_is_pipelined_in_pieces_of_n_slices() {
    let ar = Collective::AllReduce(RedOp::Sum);
    for n in 2..=6 {
        for (count, slice) in [
            (1000usize, 7usize),
            (64, 100),
            (n * 10, 10),
            (n * 10 + 1, 10),
        ] {
            let pieces = count.div_ceil(n * slice).max(1);
            for r in 0..n {
                let s = plan::schedule(ar, Algorithm::Ring, n, r, count, slice, false).unwrap();
                assert_eq!(
                    s.steps.len(),
                    pieces * 2 * (n - 1),
                    "n {n} rank {r} count {count} slice {slice}"
                );
                let sent: usize = s
                    .steps
                    .iter()
                    .flat_map(|st| &st.ops)
                    .map(|op| match op {
                        Op::Send { src, .. } => src.len,
                        _ => 0,
                    })
                    .sum();
                // Each rank sends 2 (n - 1) / n of the vector, whatever the pieces.
                let lo = 2 * (n - 1) * count / n;
                assert!(
                    sent.abs_diff(lo) <= 2 * (n - 1) * pieces,
                    "n {n} count {count}: sent {sent}, want about {lo}"
                );
            }
        }
    }
}

/// With ranks placed host by host in an order other than their numbers, the AllReduce ring
/// passes between neighbours in that order only: it crosses from one host to the next once
/// per host, not at every step.
#[test]
fn an_ordered_allreduce_ring_passes_between_neighbours_in_the_order() {
    // Ranks 0, 2 and 4 on one host, 1 and 3 on the other (a cyclic placement).
    let order = [0, 2, 4, 1, 3];
    let n = order.len();
    let host = |r: usize| r % 2;
    let mut crossings = 0;
    for r in 0..n {
        let s = plan::ScheduleRequest {
            coll: Collective::AllReduce(RedOp::Sum),
            algo: Algorithm::Ring,
            ranks: n,
            rank: r,
            count: 1000,
            slice: 10,
            in_place: false,
            order: &order,
            per_host: 0,
        }
        .build()
        .unwrap();
        let place = order.iter().position(|&x| x == r).unwrap();
        let next = order[(place + 1) % n];
        let prev = order[(place + n - 1) % n];
        for op in s.steps.iter().flat_map(|st| st.ops.iter()) {
            match *op {
                Op::Send { peer, .. } => assert_eq!(peer, next, "rank {r} sends"),
                Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    assert_eq!(peer, prev, "rank {r} receives")
                }
                _ => {}
            }
        }
        crossings += usize::from(host(next) != host(r));
    }
    assert_eq!(crossings, 2, "one crossing per host");
    // In rank order the same ring would cross at every step.
    assert_eq!((0..n).filter(|&r| host((r + 1) % n) != host(r)).count(), 4);
    // Collectives whose result depends on the places keep the ranks' own numbers.
    let ag = |o: &[usize]| {
        plan::ScheduleRequest {
            coll: Collective::AllGather,
            algo: Algorithm::Ring,
            ranks: n,
            rank: 1,
            count: 10,
            slice: 10,
            in_place: false,
            order: o,
            per_host: 0,
        }
        .build()
        .unwrap()
    };
    assert_eq!(ag(&order), ag(&[0, 1, 2, 3, 4]));
    // An order that is not a permutation is refused.
    for bad in [&[0, 1, 1, 3, 4][..], &[0, 1, 2], &[0, 1, 2, 3, 5]] {
        assert!(
            plan::ScheduleRequest {
                coll: Collective::AllReduce(RedOp::Sum),
                algo: Algorithm::Ring,
                ranks: n,
                rank: 0,
                count: 10,
                slice: 10,
                in_place: false,
                order: bad,
                per_host: 0
            }
            .build()
            .is_err()
        );
    }
}

/// The hierarchical AllReduce on every layout of 2-4 hosts of 2-4 ranks, every type and
/// reduction, in place and out, ranks placed in a shuffled order: right on every rank; each
/// rank talks to its host's ring neighbours and, between hosts, only to the ranks holding
/// its part on the hosts next to its own; a host sends 2 (H-1)/H of the vector out, where
/// the flat ring sends 2 (n-1)/n of it over each crossing.
#[test]
fn the_hierarchical_allreduce_reduces_inside_hosts_and_crosses_with_parts() {
    for (hosts, local) in [(2, 2), (3, 2), (2, 3), (4, 2), (2, 4), (3, 3)] {
        let n = hosts * local;
        let order = shuffled(n, n as u64);
        let host_of = |r: usize| order.iter().position(|&x| x == r).unwrap() / local;
        for t in DataType::ALL {
            for op in RedOp::ALL {
                let fp8 = matches!(t, DataType::F8E4M3 | DataType::F8E5M2);
                if fp8 && n > 8 {
                    continue; // its exact integers run out
                }
                for count in [0, 1, n + 1, 4 * n + 3] {
                    for in_place in [false, true] {
                        let c = Case {
                            coll: Collective::AllReduce(op),
                            algo: Algorithm::Hier,
                            t,
                            n,
                            count,
                            in_place,
                            seed: 11,
                            order: order.clone(),
                            per_host: local,
                        };
                        run_case(&c).unwrap_or_else(|e| {
                            panic!(
                                "{hosts}x{local} {t} {op} count {count} in place {in_place}: {e}"
                            )
                        });
                    }
                }
            }
        }
        let count = 1200 * n;
        let mut out_of_host = vec![0usize; hosts];
        for r in 0..n {
            let s = plan::ScheduleRequest {
                coll: Collective::AllReduce(RedOp::Sum),
                algo: Algorithm::Hier,
                ranks: n,
                rank: r,
                count,
                slice: 100,
                in_place: false,
                order: &order,
                per_host: local,
            }
            .build()
            .unwrap();
            let peers = s.peers();
            let (inside, across): (Vec<usize>, Vec<usize>) =
                peers.iter().partition(|&&p| host_of(p) == host_of(r));
            assert!(inside.len() <= 2, "{hosts}x{local} rank {r}: {inside:?}");
            assert!(across.len() <= 2, "{hosts}x{local} rank {r}: {across:?}");
            let place = order.iter().position(|&x| x == r).unwrap();
            for p in &across {
                let pp = order.iter().position(|&x| x == *p).unwrap();
                assert_eq!(
                    pp % local,
                    place % local,
                    "rank {r} crosses to another part"
                );
            }
            for op in s.steps.iter().flat_map(|st| &st.ops) {
                if let Op::Send { peer, src } = op {
                    if host_of(*peer) != host_of(r) {
                        out_of_host[host_of(r)] += src.len;
                    }
                }
            }
        }
        let want = 2 * (hosts - 1) * count / hosts;
        for (h, &sent) in out_of_host.iter().enumerate() {
            assert!(
                sent.abs_diff(want) <= 2 * n * (count / (n * 100) + 1),
                "{hosts}x{local} host {h} sends {sent} out, want about {want}"
            );
        }
        // The flat ring over the same order sends more out of each host.
        assert!(want < 2 * (n - 1) * count / n);
    }
}
