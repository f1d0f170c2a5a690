//! `monel bench <op>`: nccl-tests' flags, columns and bus-bandwidth factors, over a
//! communicator from the launcher's environment (run it under `monel launch`, torchrun,
//! Slurm or mpirun). Rank 0 prints the table.

use std::time::Instant;

use anyhow::{Context, bail};
use monel_ccl::{Call, Collective, Communicator, DataType, Io, RedOp};
use monel_sched::CollectiveKind;
use monel_sched::fp8::Fp8;

/// Arguments (nccl-tests' names).
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// all_reduce, broadcast, reduce, all_gather, reduce_scatter, alltoall, gather, scatter
    /// (nccl-tests' spellings: `allreduce`, `all-reduce` and `all_reduce_perf` work too).
    op: String,
    /// Smallest size, bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8")]
    minbytes: String,
    /// Largest size, bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    maxbytes: String,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    stepfactor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    warmup: usize,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: usize,
    /// Data type.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Reduction.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    redop: String,
    /// Root.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Output format: table, csv or json.
    #[arg(long, default_value = "table")]
    format: String,
    /// Instead of a fixed -n, time each size for about this many milliseconds (the count
    /// comes from timing batches of warm calls for at least half as long, the same on every
    /// rank).
    #[arg(short = 'T', long = "target_ms")]
    target_ms: Option<f64>,
    /// Buffer registration, as nccl-tests' -R: 0 ordinary memory; 1 (or 2) symmetric
    /// windows (`Communicator::alloc_window`, made once at the largest size), so
    /// collectives on one host run directly between the ranks' buffers.
    #[arg(short = 'R', long = "local_register", default_value_t = 0)]
    register: u8,
}

fn bytes(s: &str) -> anyhow::Result<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Ok(num
        .parse::<usize>()
        .with_context(|| format!("not a size: {s:?}"))?
        * mul)
}

pub(crate) fn encode(t: DataType, x: i64) -> Vec<u8> {
    match t {
        DataType::I8 | DataType::U8 => vec![x as u8],
        DataType::I32 | DataType::U32 => (x as u32).to_le_bytes().to_vec(),
        DataType::I64 | DataType::U64 => (x as u64).to_le_bytes().to_vec(),
        DataType::F16 => half::f16::from_f64(x as f64)
            .to_bits()
            .to_le_bytes()
            .to_vec(),
        DataType::Bf16 => half::bf16::from_f64(x as f64)
            .to_bits()
            .to_le_bytes()
            .to_vec(),
        DataType::F32 => (x as f32).to_le_bytes().to_vec(),
        DataType::F8E4M3 | DataType::F8E5M2 => vec![fp8_of(t).from_f32(x as f32)],
        _ => (x as f64).to_le_bytes().to_vec(),
    }
}

fn fp8_of(t: DataType) -> Fp8 {
    if t == DataType::F8E4M3 {
        Fp8::E4M3
    } else {
        Fp8::E5M2
    }
}

/// True if `got` is element `want`: exactly, or for FP8, whose integers are exact only up to
/// 8 or 16, within one rounding per rank (sums round at every step, in an order that depends
/// on the algorithm).
fn matches(t: DataType, got: Option<&[u8]>, want: i64, n: usize) -> bool {
    let Some(got) = got else { return false };
    if !matches!(t, DataType::F8E4M3 | DataType::F8E5M2) {
        return got == encode(t, want).as_slice();
    }
    let ulp = if t == DataType::F8E4M3 { 0.125 } else { 0.25 };
    let v = fp8_of(t).to_f32(got[0]);
    (v - want as f32).abs() <= (want as f32).abs() * ulp * n as f32
}

/// Rank r's element i: small integers, exact in every type and order.
pub(crate) fn val(r: usize, i: usize) -> i64 {
    ((r * 3 + i) % 5) as i64
}

struct Row {
    size: usize,
    count: usize,
    time_us: [f64; 2],
    algbw: [f64; 2],
    busbw: [f64; 2],
    wrong: [i64; 2],
}

/// Times `call`: `warmup` calls (at least one), then `iters` calls or, with `target_ms`, as
/// many as fit in that time by a calibration on warm calls that lasts at least half the target
/// (the same count on every rank). Returns the slowest rank's mean microseconds per call, as
/// nccl-tests reports.
pub(crate) fn time_calls(
    comm: &mut Communicator,
    warmup: usize,
    iters: usize,
    target_ms: Option<f64>,
    call: &mut dyn FnMut(&mut Communicator) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let ccl = |e: monel_ccl::CclError| anyhow::anyhow!("{e}");
    let max_of = |comm: &mut Communicator, x: f64| -> anyhow::Result<f64> {
        let mut b = x.to_le_bytes();
        comm.all_reduce_in_place(&mut b, 1, DataType::F64, RedOp::Max)
            .map_err(ccl)?;
        Ok(f64::from_le_bytes(b))
    };
    comm.barrier().map_err(ccl)?;
    for _ in 0..warmup.max(1) {
        call(comm)?;
    }
    let iters = match target_ms {
        Some(ms) => {
            // Calibrate on warm calls: batches doubling until one takes a tenth of the
            // target (the slowest rank's time decides, so all ranks stop together), and
            // until the batches together took half the target. The first calls after init
            // or a new size can be far slower than the rest (on an oversubscribed machine
            // the scheduler takes tens of milliseconds to settle the ranks); a count taken
            // from them made the timed loop too short for its mean to mean much, and a
            // loop that starts unsettled times the settling.
            let mut k = 1usize;
            let mut spent = 0.0;
            let per = loop {
                let t = Instant::now();
                for _ in 0..k {
                    call(comm)?;
                }
                let took = max_of(comm, t.elapsed().as_secs_f64())?;
                spent += took;
                let long = took >= ms / 1e4;
                if (long && spent >= ms / 2e3) || k >= 1 << 20 {
                    break took / k as f64;
                }
                if !long {
                    k *= 2;
                }
            };
            (ms / 1e3 / per.max(1e-9)).clamp(3.0, 1e6) as usize
        }
        None => iters.max(1),
    };
    comm.barrier().map_err(ccl)?;
    let t0 = Instant::now();
    for _ in 0..iters {
        call(comm)?;
    }
    max_of(comm, t0.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

pub(crate) fn run(a: &BenchArgs) -> anyhow::Result<()> {
    let kind = parse_collective(&a.op)?;
    let t =
        DataType::parse(&a.dtype).with_context(|| format!("unknown data type {:?}", a.dtype))?;
    let op = RedOp::parse(&a.redop).with_context(|| format!("unknown reduction {:?}", a.redop))?;
    if !matches!(op, RedOp::Sum | RedOp::Max | RedOp::Min) && a.check != 0 {
        bail!("-c 1 checks sum, min and max; use -c 0 for {op}");
    }
    let mut comm = Communicator::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    let (n, r) = (comm.size(), comm.rank());
    let coll = kind.with(op, a.root);
    if coll.root().is_some_and(|root| root >= n) {
        bail!("root {} is not a rank (0..{n})", a.root);
    }
    // nccl-tests: S counts all ranks' data for the gathering collectives.
    let per_rank = !matches!(
        coll,
        Collective::AllReduce(_) | Collective::Broadcast(_) | Collective::Reduce(..)
    );
    let factor = match coll {
        Collective::AllReduce(_) => 2.0 * (n as f64 - 1.0) / n as f64,
        Collective::Broadcast(_) | Collective::Reduce(..) => 1.0,
        _ => (n as f64 - 1.0) / n as f64,
    };
    let es = t.size();
    let (mut size, max) = (bytes(&a.minbytes)?, bytes(&a.maxbytes)?);
    let mut rows = Vec::new();
    if r == 0 && a.format == "table" {
        println!(
            "# monel bench {} on {n} ranks; {}",
            coll.name(),
            comm.paths().first().map_or("one rank", |p| p.as_str())
        );
        println!(
            "#{:>11} {:>12} {:>8} {:>6} {:>6}   {:>9} {:>8} {:>8} {:>6}   {:>9} {:>8} {:>8} {:>6}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        println!(
            "#{:>11} {:>12} {:>8} {:>6} {:>6}   {:>9} {:>8} {:>8} {:>6}   {:>9} {:>8} {:>8} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        );
    }
    // Registered buffers, made once for the largest size (as nccl-tests allocates).
    let mut windows = if a.register != 0 {
        let count = if per_rank { max / (n * es) } else { max / es };
        let (ins, outs) = coll.sizes(n, r, count);
        let inplace = coll.in_place_layout(n, r, count).map_or(0, |l| l.0);
        let w_in = comm
            .alloc_window(ins * es)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let w_out = comm
            .alloc_window(outs.max(inplace) * es)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if r == 0 && a.format == "table" {
            println!(
                "# buffers: symmetric windows ({})",
                if w_in.is_shared() {
                    "shared by every rank: collectives run directly"
                } else {
                    "not shared: ranks on several hosts, ordinary path; on RDMA links \
                     registered with the NIC, which sends from them without a staging copy"
                }
            );
        }
        Some((w_in, w_out))
    } else {
        None
    };
    let mut plain_out: Vec<u8> = Vec::new();
    while size <= max {
        let count = if per_rank { size / (n * es) } else { size / es };
        let (ins, outs) = coll.sizes(n, r, count);
        let input: Vec<u8> = (0..ins).flat_map(|i| encode(t, val(r, i))).collect();
        let mut row = Row {
            size: count * es * if per_rank { n } else { 1 },
            count,
            time_us: [0.0; 2],
            algbw: [0.0; 2],
            busbw: [0.0; 2],
            wrong: [0; 2],
        };
        for (k, in_place) in [false, true].into_iter().enumerate() {
            let layout = coll.in_place_layout(n, r, count);
            if in_place && layout.is_none() {
                row.wrong[k] = -1;
                continue;
            }
            let out_len = if in_place {
                layout.map_or(0, |l| l.0) * es
            } else {
                outs * es
            };
            let (send, out): (&[u8], &mut [u8]) = match &mut windows {
                Some((w_in, w_out)) => {
                    w_in[..input.len()].copy_from_slice(&input);
                    w_out[..out_len].fill(0);
                    (&w_in[..input.len()], &mut w_out[..out_len])
                }
                None => {
                    plain_out.clear();
                    plain_out.resize(out_len, 0);
                    (&input, &mut plain_out[..])
                }
            };
            // In place, the input is (re)placed before the first call and before the checked
            // one, not inside the timed loop (as nccl-tests does).
            let reset = |out: &mut [u8]| {
                if let Some((_, io_off, _)) = layout.filter(|_| in_place) {
                    out[io_off * es..io_off * es + input.len()].copy_from_slice(&input);
                }
            };
            reset(out);
            let call = |comm: &mut Communicator, out: &mut [u8]| -> anyhow::Result<()> {
                let io = if in_place {
                    Io::InPlace(out)
                } else {
                    Io::Separate { send, recv: out }
                };
                comm.collective(Call::new(coll, t, count), io)
                    .map_err(|e| anyhow::anyhow!("{e}"))
            };
            let us = time_calls(&mut comm, a.warmup, a.iters, a.target_ms, &mut |c| {
                call(c, out)
            })?;
            row.time_us[k] = us;
            row.algbw[k] = row.size as f64 / us / 1e3;
            row.busbw[k] = row.algbw[k] * factor;
            if a.check != 0 {
                reset(out);
                call(&mut comm, out)?;
                let off = if in_place {
                    layout.map_or(0, |l| l.2) * es
                } else {
                    0
                };
                let wrong = count_wrong(coll, t, op, n, r, count, &out[off..]);
                let mut w = (wrong as i64).to_le_bytes();
                comm.all_reduce_in_place(&mut w, 1, DataType::I64, RedOp::Sum)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                row.wrong[k] = i64::from_le_bytes(w);
            }
        }
        if r == 0 {
            let root = coll.root().map_or(-1, |x| x as i64);
            let opname = coll.op().map_or("none", RedOp::name);
            match a.format.as_str() {
                "csv" => println!(
                    "{},{},{},{},{},{:.3},{:.3},{:.3},{},{:.3},{:.3},{:.3},{}",
                    row.size,
                    row.count,
                    t,
                    opname,
                    root,
                    row.time_us[0],
                    row.algbw[0],
                    row.busbw[0],
                    row.wrong[0],
                    row.time_us[1],
                    row.algbw[1],
                    row.busbw[1],
                    row.wrong[1]
                ),
                "json" => println!(
                    "{{\"size\":{},\"count\":{},\"type\":\"{t}\",\"redop\":\"{opname}\",\"root\":{root},\"oop\":{{\"time_us\":{:.3},\"algbw\":{:.4},\"busbw\":{:.4},\"wrong\":{}}},\"ip\":{{\"time_us\":{:.3},\"algbw\":{:.4},\"busbw\":{:.4},\"wrong\":{}}}}}",
                    row.size,
                    row.count,
                    row.time_us[0],
                    row.algbw[0],
                    row.busbw[0],
                    row.wrong[0],
                    row.time_us[1],
                    row.algbw[1],
                    row.busbw[1],
                    row.wrong[1]
                ),
                _ => println!(
                    " {:>11} {:>12} {:>8} {:>6} {:>6}   {:>9.2} {:>8.3} {:>8.3} {:>6}   {:>9.2} {:>8.3} {:>8.3} {:>6}",
                    row.size,
                    row.count,
                    t.name(),
                    opname,
                    root,
                    row.time_us[0],
                    row.algbw[0],
                    row.busbw[0],
                    wrong_str(row.wrong[0], a.check),
                    row.time_us[1],
                    row.algbw[1],
                    row.busbw[1],
                    wrong_str(row.wrong[1], a.check)
                ),
            }
        }
        rows.push(row);
        if size == 0 {
            size = 1;
        }
        size *= a.stepfactor.max(2);
    }
    if r == 0 && a.format == "table" {
        let avg = rows.iter().map(|x| x.busbw[0]).sum::<f64>() / rows.len().max(1) as f64;
        let wrong: i64 = rows.iter().flat_map(|x| x.wrong).filter(|&w| w > 0).sum();
        println!(
            "# Out of bounds values : {wrong} {}",
            if wrong == 0 { "OK" } else { "FAILED" }
        );
        println!("# Avg bus bandwidth    : {avg:.3}");
        if a.register != 0 {
            println!(
                "# Sent from windows without a staging copy: {} bytes (this rank)",
                comm.zero_copy_bytes()
            );
        }
    }
    let bad = rows.iter().any(|x| x.wrong.iter().any(|&w| w > 0));
    if bad {
        bail!("wrong results");
    }
    Ok(())
}

fn wrong_str(w: i64, check: usize) -> String {
    if check == 0 || w < 0 {
        "N/A".into()
    } else {
        w.to_string()
    }
}

/// Elements of `out` that differ from what `coll` must produce on rank `r`.
pub(crate) fn count_wrong(
    coll: Collective,
    t: DataType,
    op: RedOp,
    n: usize,
    r: usize,
    count: usize,
    out: &[u8],
) -> usize {
    let es = t.size();
    let red = |i: usize| -> i64 {
        let v = (0..n).map(|q| val(q, i));
        match op {
            RedOp::Max => v.max().unwrap_or(0),
            RedOp::Min => v.min().unwrap_or(0),
            _ => v.sum(),
        }
    };
    let want: Vec<i64> = match coll {
        Collective::AllReduce(_) => (0..count).map(red).collect(),
        Collective::Broadcast(root) => (0..count).map(|i| val(root, i)).collect(),
        Collective::Reduce(_, root) if r == root => (0..count).map(red).collect(),
        Collective::AllGather => (0..n * count)
            .map(|i| val(i / count.max(1), i % count.max(1)))
            .collect(),
        Collective::ReduceScatter(_) => (0..count).map(|i| red(r * count + i)).collect(),
        Collective::AllToAll => (0..n * count)
            .map(|i| val(i / count.max(1), r * count + i % count.max(1)))
            .collect(),
        Collective::Gather(root) if r == root => (0..n * count)
            .map(|i| val(i / count.max(1), i % count.max(1)))
            .collect(),
        Collective::Scatter(root) => (0..count).map(|i| val(root, r * count + i)).collect(),
        _ => Vec::new(),
    };
    want.iter()
        .enumerate()
        .filter(|&(i, &w)| !matches(t, out.get(i * es..(i + 1) * es), w, n))
        .count()
}

/// A collective by any of its spellings, with a suggestion on a typo.
fn parse_collective(name: &str) -> anyhow::Result<CollectiveKind> {
    if let Some(k) = CollectiveKind::parse(name).filter(|&k| k != CollectiveKind::Barrier) {
        return Ok(k);
    }
    match CollectiveKind::nearest(name).filter(|&k| k != CollectiveKind::Barrier) {
        Some(k) => bail!("unknown operation {name:?}: did you mean {k}?"),
        None => bail!(
            "unknown operation {name:?}: want one of all_reduce, broadcast, reduce, all_gather, \
             reduce_scatter, alltoall, gather, scatter"
        ),
    }
}
