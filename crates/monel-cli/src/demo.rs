//! `monel demo`: Monel's main job on one machine. Spawns N local ranks (default 4) as two
//! simulated hosts (`MONEL_HOST`), so pairs inside a host connect through shared memory and
//! pairs across hosts through the network path; prints the path every pair took, runs every
//! collective once out of place and in place with verification, then an AllReduce size sweep.
//! Exits non-zero if any rank got a wrong result.

use std::time::Instant;

use anyhow::{Context, bail};
use monel_ccl::{Call, Collective, Communicator, DataType, Io, RedOp};

use crate::bench::{count_wrong, encode, time_calls, val};
use crate::launch;

/// Arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Ranks.
    #[arg(short = 'n', long, default_value_t = 4)]
    nranks: usize,
    /// Simulated hosts the ranks are spread over (ranks on one host share memory).
    #[arg(long, default_value_t = 2)]
    hosts: usize,
    /// Largest AllReduce of the sweep, bytes.
    #[arg(long, default_value_t = 32 << 20)]
    max_bytes: usize,
    /// Internal: run as one rank (set by the demo itself).
    #[arg(long, hide = true)]
    worker: bool,
}

pub(crate) fn run(a: &DemoArgs) -> anyhow::Result<()> {
    if a.worker {
        return worker(a);
    }
    if a.nranks == 0 || a.hosts == 0 {
        bail!("-n and --hosts must be at least 1");
    }
    let exe = std::env::current_exe().context("find the monel executable")?;
    let per_host = a.nranks.div_ceil(a.hosts);
    println!(
        "# monel demo: {} ranks on {} simulated hosts ({} per host); every collective verified, then an AllReduce sweep",
        a.nranks, a.hosts, per_host
    );
    let cmd = vec![
        exe.to_string_lossy().into_owned(),
        "demo".into(),
        "--worker".into(),
        "--max-bytes".into(),
        a.max_bytes.to_string(),
    ];
    let code = launch::spawn_ranks(a.nranks, None, &cmd, &|r| {
        vec![("MONEL_HOST".into(), format!("host{}", r / per_host))]
    })?;
    if code != 0 {
        bail!("a rank failed (exit status {code})");
    }
    Ok(())
}

fn ccl(e: monel_ccl::CclError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Every rank's paths, gathered to everyone (fixed-size records through AllGather).
fn all_paths(comm: &mut Communicator) -> anyhow::Result<Vec<String>> {
    const REC: usize = 4096;
    let mut mine = comm.paths().join("\n").into_bytes();
    mine.resize(REC, 0);
    let mut all = vec![0u8; REC * comm.size()];
    comm.all_gather(&mine, &mut all, REC, DataType::U8)
        .map_err(ccl)?;
    Ok(all
        .chunks(REC)
        .flat_map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end])
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect())
}

/// Runs `coll` once out of place and once in place (where it has that form) on the
/// verification pattern; returns the wrong elements summed over all ranks, per form, and
/// this rank's time of the out-of-place call.
fn verify(
    comm: &mut Communicator,
    coll: Collective,
    t: DataType,
    count: usize,
) -> anyhow::Result<([i64; 2], f64)> {
    let (n, r, es) = (comm.size(), comm.rank(), t.size());
    let op = coll.op().unwrap_or(RedOp::Sum);
    let (ins, outs) = coll.sizes(n, r, count);
    let input: Vec<u8> = (0..ins).flat_map(|i| encode(t, val(r, i))).collect();
    let mut wrong = [0i64; 2];
    let mut out = vec![0u8; outs * es];
    let t0 = Instant::now();
    comm.collective(
        Call::new(coll, t, count),
        Io::Separate {
            send: &input,
            recv: &mut out,
        },
    )
    .map_err(ccl)?;
    let us = t0.elapsed().as_secs_f64() * 1e6;
    wrong[0] = count_wrong(coll, t, op, n, r, count, &out) as i64;
    if let Some((len, io, oo)) = coll.in_place_layout(n, r, count) {
        let mut buf = vec![0u8; len * es];
        buf[io * es..io * es + input.len()].copy_from_slice(&input);
        comm.collective(Call::new(coll, t, count), Io::InPlace(&mut buf))
            .map_err(ccl)?;
        wrong[1] = count_wrong(coll, t, op, n, r, count, &buf[oo * es..]) as i64;
    } else {
        wrong[1] = -1;
    }
    for w in &mut wrong {
        if *w >= 0 {
            let mut b = w.to_le_bytes();
            comm.all_reduce_in_place(&mut b, 1, DataType::I64, RedOp::Sum)
                .map_err(ccl)?;
            *w = i64::from_le_bytes(b);
        }
    }
    Ok((wrong, us))
}

fn worker(a: &DemoArgs) -> anyhow::Result<()> {
    let mut comm = Communicator::from_env().map_err(ccl)?;
    let (n, r) = (comm.size(), comm.rank());
    let paths = all_paths(&mut comm)?;
    if r == 0 {
        println!("\n## Paths (one line per connection, as MONEL_DEBUG=INFO logs them)");
        for p in &paths {
            println!("  {p}");
        }
        println!(
            "\n## Every collective, verified on every rank (count 1003: not a multiple of {n})"
        );
        println!(
            "  {:<16} {:<9} {:<5} {:>9}  {:>12}  {:>8}  {:>10}",
            "operation", "type", "op", "algorithm", "out of place", "in place", "time (us)"
        );
    }
    let count = 1003;
    let root = n - 1;
    let cases: Vec<(Collective, DataType)> = vec![
        (Collective::AllReduce(RedOp::Sum), DataType::F32),
        (Collective::AllReduce(RedOp::Max), DataType::I32),
        (Collective::AllReduce(RedOp::Sum), DataType::Bf16),
        (Collective::AllReduce(RedOp::Min), DataType::F16),
        (Collective::Broadcast(root), DataType::F64),
        (Collective::Reduce(RedOp::Sum, root), DataType::I64),
        (Collective::AllGather, DataType::U8),
        (Collective::ReduceScatter(RedOp::Sum), DataType::F32),
        (Collective::AllToAll, DataType::I32),
        (Collective::Gather(0), DataType::U32),
        (Collective::Scatter(root), DataType::I8),
        (Collective::Barrier, DataType::U8),
    ];
    let mut failed = false;
    for (coll, t) in cases {
        let c = if coll == Collective::Barrier {
            0
        } else {
            count
        };
        let algo = comm.algorithm_for(coll, t, c);
        let (wrong, us) = verify(&mut comm, coll, t, c)?;
        failed |= wrong.iter().any(|&w| w > 0);
        if r == 0 {
            let show = |w: i64| match w {
                -1 => "n/a".to_string(),
                0 => "ok".to_string(),
                w => format!("{w} WRONG"),
            };
            println!(
                "  {:<16} {:<9} {:<5} {:>9}  {:>12}  {:>8}  {:>10.1}",
                coll.name(),
                t.name(),
                coll.op().map_or("-", RedOp::name),
                algo.name(),
                show(wrong[0]),
                show(wrong[1]),
                us
            );
        }
    }
    if r == 0 {
        println!(
            "\n## AllReduce sweep (float32 sum, out of place, slowest rank, about 50 ms per size)"
        );
        println!(
            "  {:>10} {:>9} {:>10} {:>10} {:>10}",
            "size (B)", "algorithm", "time (us)", "algbw GB/s", "busbw GB/s"
        );
    }
    let mut size = 8;
    while size <= a.max_bytes {
        let count = size / 4;
        let coll = Collective::AllReduce(RedOp::Sum);
        let input: Vec<u8> = (0..count)
            .flat_map(|i| encode(DataType::F32, val(r, i)))
            .collect();
        let mut out = vec![0u8; size];
        let us = time_calls(&mut comm, 3, 0, Some(50.0), &mut |c| {
            c.all_reduce(&input, &mut out, count, DataType::F32, RedOp::Sum)
                .map_err(ccl)
        })?;
        let wrong = count_wrong(coll, DataType::F32, RedOp::Sum, n, r, count, &out);
        failed |= wrong > 0;
        if r == 0 {
            let algbw = size as f64 / us / 1e3;
            println!(
                "  {:>10} {:>9} {:>10.2} {:>10.3} {:>10.3}{}",
                size,
                comm.algorithm_for(coll, DataType::F32, count).name(),
                us,
                algbw,
                algbw * 2.0 * (n as f64 - 1.0) / n as f64,
                if wrong > 0 { "  WRONG" } else { "" }
            );
        }
        size *= 4;
    }
    let mut f = [u8::from(failed)];
    comm.all_reduce_in_place(&mut f, 1, DataType::U8, RedOp::Max)
        .map_err(ccl)?;
    if f[0] != 0 {
        bail!("rank {r}: wrong results (see the table)");
    }
    if r == 0 {
        println!("\n# all results verified on every rank");
    }
    Ok(())
}
