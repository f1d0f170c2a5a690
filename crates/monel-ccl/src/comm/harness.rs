//! The seeded harness: ranks as threads of this process, joined by in-memory links
//! (`transport::mem`), so the communicator's executor, its windows and its two-rank tiny path
//! run with no socket, process or bootstrap; and property tests of all three against the
//! schedule simulator (`monel_sched::sim`), which runs the same schedules over plain queues.
//!
//! Every case comes from one seed (printed when a case fails, with what it drew), so a
//! failure reruns as it happened.

use std::time::Duration;

use monel_sched::buffers::Buffers;
use monel_sched::plan::{Algorithm, Call, Collective, ScheduleRequest};
use monel_sched::{DataType, RedOp, sim};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{CommConfig, Communicator, Io};
use crate::error::Result;
use crate::transport::mem;

/// Runs `f` on every rank of an `n`-rank communicator over in-memory links holding `cap`
/// bytes each way; the results in rank order.
fn ranks<T: Send>(
    n: usize,
    cap: usize,
    cfg: &CommConfig,
    f: impl Fn(&mut Communicator) -> T + Sync,
) -> Vec<Result<T>> {
    let mesh = mem::mesh(n, cap).expect("eventfds");
    std::thread::scope(|s| {
        let threads: Vec<_> = mesh
            .into_iter()
            .enumerate()
            .map(|(r, links)| {
                let (cfg, f) = (cfg.clone(), &f);
                s.spawn(move || Communicator::over_links(r, links, cfg).map(|mut c| f(&mut c)))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    })
}

/// One drawn case: the call, its algorithm and buffers' form, and every rank's input.
#[derive(Debug, Clone)]
struct Case {
    n: usize,
    call: Call,
    algo: Algorithm,
    in_place: bool,
    /// Bytes each in-memory link holds each way (small ones split every frame).
    cap: usize,
    inputs: Vec<Vec<u8>>,
}

const TYPES: [DataType; 5] = [
    DataType::F32,
    DataType::I32,
    DataType::U8,
    DataType::F64,
    DataType::Bf16,
];
const OPS: [RedOp; 4] = [RedOp::Sum, RedOp::Max, RedOp::Min, RedOp::Prod];

/// Elements whose sums and products stay exact in every type drawn (small integers).
fn element(t: DataType, v: i8) -> Vec<u8> {
    let f = f32::from(v);
    match t {
        DataType::F32 => f.to_le_bytes().to_vec(),
        DataType::F64 => f64::from(f).to_le_bytes().to_vec(),
        DataType::I32 => i32::from(v).to_le_bytes().to_vec(),
        DataType::U8 => vec![v.unsigned_abs() % 4],
        DataType::Bf16 => half::bf16::from_f32(f).to_le_bytes().to_vec(),
        _ => unreachable!("not drawn"),
    }
}

fn draw(seed: u64, max_count: usize) -> Case {
    let mut g = ChaCha8Rng::seed_from_u64(seed);
    let n = g.gen_range(2..=5);
    let dtype = TYPES[g.gen_range(0..TYPES.len())];
    let op = OPS[g.gen_range(0..OPS.len())];
    let root = g.gen_range(0..n);
    let coll = match g.gen_range(0..8) {
        0 | 1 => Collective::AllReduce(op),
        2 => Collective::Broadcast(root),
        3 => Collective::Reduce(op, root),
        4 => Collective::AllGather,
        5 => Collective::ReduceScatter(op),
        6 => Collective::AllToAll,
        _ => [Collective::Gather(root), Collective::Scatter(root)][g.gen_range(0..2)],
    };
    let count = g.gen_range(0..=max_count);
    let algos = coll.algorithms();
    let algo = algos[g.gen_range(0..algos.len())];
    let in_place = coll.in_place_layout(n, 0, count).is_some() && g.gen_bool(0.4);
    let cap = [64, 1000, 1 << 16][g.gen_range(0..3)];
    // Products stay small: ones, minus ones and twos only.
    let span = if op == RedOp::Prod { 2 } else { 20 };
    let inputs = (0..n)
        .map(|r| {
            let (ins, _) = coll.sizes(n, r, count);
            (0..ins)
                .flat_map(|_| element(dtype, g.gen_range(-span..=span).max(-2)))
                .collect()
        })
        .collect();
    Case {
        n,
        call: Call::new(coll, dtype, count),
        algo,
        in_place,
        cap,
        inputs,
    }
}

/// Each rank's output from the simulator, running the schedules the communicator builds.
fn simulated(c: &Case, slice: usize) -> Vec<Vec<u8>> {
    let Call { coll, dtype, count } = c.call;
    let (n, es) = (c.n, dtype.size());
    let order: Vec<usize> = (0..n).collect();
    let op = coll.op().unwrap_or(RedOp::Sum);
    let scheds: Vec<_> = (0..n)
        .map(|r| {
            ScheduleRequest {
                coll,
                algo: c.algo,
                count,
                slice,
                in_place: c.in_place,
                ranks: n,
                rank: r,
                order: &order,
                per_host: n,
            }
            .build()
            .expect("a schedule")
        })
        .collect();
    let mut outs: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            if c.in_place {
                let (len, io, _) = coll.in_place_layout(n, r, count).expect("in place");
                let mut b = vec![0u8; len * es];
                b[io * es..io * es + c.inputs[r].len()].copy_from_slice(&c.inputs[r]);
                b
            } else {
                vec![0u8; coll.sizes(n, r, count).1 * es]
            }
        })
        .collect();
    let mut bufs: Vec<Buffers<'_>> = outs
        .iter_mut()
        .enumerate()
        .map(|(r, o)| {
            if c.in_place {
                let (_, io, oo) = coll.in_place_layout(n, r, count).expect("in place");
                Buffers::in_place(o, io, oo, dtype, op, n)
            } else {
                Buffers::separate(&c.inputs[r], o, dtype, op, n)
            }
        })
        .collect();
    sim::run(&scheds, &mut bufs).expect("the simulator runs the schedules");
    drop(bufs);
    (0..n).map(|r| output_of(c, r, &outs[r])).collect()
}

/// The part of rank `r`'s buffer that holds its output.
fn output_of(c: &Case, r: usize, buf: &[u8]) -> Vec<u8> {
    let Call { coll, dtype, count } = c.call;
    let es = dtype.size();
    let outs = coll.sizes(c.n, r, count).1 * es;
    let at = match c.in_place {
        true => coll.in_place_layout(c.n, r, count).expect("in place").2 * es,
        false => 0,
    };
    // Rooted collectives define the output at the root only.
    match coll {
        Collective::Reduce(_, root) | Collective::Gather(root) if r != root => Vec::new(),
        _ => buf[at..at + outs].to_vec(),
    }
}

/// Runs `c` on the communicator, on ordinary buffers or on windows; each rank's output and
/// the path it took.
fn executed(c: &Case, cfg: &CommConfig, windows: bool) -> Vec<(Vec<u8>, &'static str)> {
    let Call { coll, dtype, count } = c.call;
    let es = dtype.size();
    ranks(c.n, c.cap, cfg, |comm| {
        let (n, r) = (comm.size(), comm.rank());
        comm.set_algorithm(Some(c.algo));
        let (ins, outs) = coll.sizes(n, r, count);
        let len = coll
            .in_place_layout(n, r, count)
            .map_or(0, |l| l.0)
            .max(outs)
            .max(ins);
        let (mut send, mut recv) = if windows {
            comm.set_algorithm(None);
            let s = comm.alloc_window(len * es + 64).expect("window");
            let o = comm.alloc_window(len * es + 64).expect("window");
            (Bufs::Window(s), Bufs::Window(o))
        } else {
            (
                Bufs::Vec(vec![0u8; ins * es]),
                Bufs::Vec(vec![0u8; len * es]),
            )
        };
        let res = if c.in_place {
            let (l, io, _) = coll.in_place_layout(n, r, count).expect("in place");
            let buf = &mut recv.bytes()[..l * es];
            buf.fill(0);
            buf[io * es..io * es + c.inputs[r].len()].copy_from_slice(&c.inputs[r]);
            comm.collective(c.call, Io::InPlace(buf))
        } else {
            let s = &mut send.bytes()[..ins * es];
            s.copy_from_slice(&c.inputs[r]);
            let o = &mut recv.bytes()[..outs * es];
            o.fill(0);
            comm.collective(c.call, Io::Separate { send: s, recv: o })
        };
        res.map(|()| (output_of(c, r, recv.bytes()), comm.last_path()))
    })
    .into_iter()
    .map(|r| r.and_then(|x| x).expect("the call succeeds"))
    .collect()
}

enum Bufs {
    Vec(Vec<u8>),
    Window(crate::Window),
}

impl Bufs {
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Self::Vec(v) => v,
            Self::Window(w) => w,
        }
    }
}

fn config() -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(60),
        chunk: 64,
        ..CommConfig::default()
    }
}

fn check(seed: u64, max_count: usize, windows: bool) -> std::result::Result<(), TestCaseError> {
    let c = draw(seed, max_count);
    let cfg = config();
    let slice = (cfg.chunk / c.call.dtype.size()).max(1);
    let want = simulated(&c, slice);
    let got = executed(&c, &cfg, windows);
    for (r, (g, path)) in got.iter().enumerate() {
        prop_assert_eq!(
            g,
            &want[r],
            "seed {}: rank {} of {:?} by {} ({}) differs from the simulator",
            seed,
            r,
            c,
            c.algo.name(),
            path
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The executor over in-memory links gives what the simulator gives, for every
    /// collective, algorithm, type, size and buffer form drawn, through links that split
    /// frames (64 bytes) or hold whole messages.
    #[test]
    fn the_executor_matches_the_simulator(seed in any::<u64>()) {
        check(seed, 300, false)?;
    }

    /// Collectives on windows (large enough for the direct path) give what the simulator
    /// gives.
    #[test]
    fn windows_match_the_simulator(seed in any::<u64>()) {
        check(seed, 3000, true)?;
    }
}

/// Tiny AllReduces between two ranks take the fast path, and give the simulator's sums.
#[test]
fn the_tiny_path_matches_the_simulator() {
    let cfg = CommConfig {
        chunk: 64,
        ..CommConfig::default()
    };
    for seed in 0..24u64 {
        let mut c = draw(seed, 40);
        c.n = 2;
        c.call = Call::new(
            Collective::AllReduce(RedOp::Sum),
            DataType::F32,
            1 + seed as usize,
        );
        c.algo = Algorithm::Direct;
        c.in_place = false;
        c.cap = 1 << 16;
        c.inputs = (0..2)
            .map(|r| {
                (0..c.call.count)
                    .flat_map(|i| element(DataType::F32, (i as i8).wrapping_mul(r as i8 + 1)))
                    .collect()
            })
            .collect();
        let want = simulated(&c, 16);
        let got = ranks(2, c.cap, &cfg, |comm| {
            comm.set_algorithm(Some(Algorithm::Direct));
            let mut out = vec![0u8; c.inputs[0].len()];
            for _ in 0..3 {
                let input = &c.inputs[comm.rank()];
                comm.collective(
                    c.call,
                    Io::Separate {
                        send: input,
                        recv: &mut out,
                    },
                )
                .expect("tiny all-reduce");
            }
            (out, comm.tiny_calls())
        });
        for (r, g) in got.into_iter().enumerate() {
            let (out, tiny) = g.expect("a communicator");
            assert_eq!(out, want[r], "seed {seed}: rank {r}");
            assert!(tiny > 0, "seed {seed}: rank {r} never took the tiny path");
        }
    }
}
