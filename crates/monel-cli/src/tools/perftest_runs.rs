//! perftest's data loops, as its `run_iter_*` functions run them, for `monel perf
//! --perftest`: the latency ping-pongs and lone READs (with perftest's latency row), and
//! send-bw's receiving and both-ways runs with a timed run's sampler. Who runs which, and the
//! exchange around them, is `crate::perftest`'s.

use std::time::{Duration, Instant};

use anyhow::bail;
use monel_verbs::{
    RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::tools::perf::{BwReport, Endpoint, PerfOptions, Sampler, Test};

const STALL: Duration = Duration::from_secs(30);

/// write_lat: each side WRITEs `size` bytes into the peer's half, the last byte counting;
/// it waits for the peer's count in its own half before the next. The server sends first.
/// Returns the post times.
pub(crate) fn write_pingpong(
    e: &Endpoint<'_>,
    size: usize,
    iters: u32,
    server: bool,
) -> anyhow::Result<Vec<Instant>> {
    let half = e.mr.len() / 2;
    let (post_at, poll_at) = (size - 1, half + size - 1);
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut posts = Vec::with_capacity(iters as usize);
    let mut wcs = Vec::new();
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && server) {
            rcnt += 1;
            let t = Instant::now();
            while e.mr.with(|b| b[poll_at]) != rcnt as u8 {
                if t.elapsed() > STALL {
                    bail!("write-lat: message {rcnt} never arrived");
                }
                std::thread::yield_now();
            }
        }
        if scnt < iters {
            posts.push(Instant::now());
            scnt += 1;
            e.mr.write(post_at, &[scnt as u8])?;
            post_signaled(e, u64::from(scnt), SendOp::Write(remote(e)), size)?;
            wait_one(e, &mut wcs, "write-lat")?;
        }
    }
    Ok(posts)
}

/// The peer's half.
fn remote(e: &Endpoint<'_>) -> RemoteAddr {
    RemoteAddr {
        addr: e.remote.addr,
        rkey: e.remote.rkey,
    }
}

/// Posts one signaled `op` of `size` bytes from the start of this side's half.
fn post_signaled(e: &Endpoint<'_>, wr_id: u64, op: SendOp, size: usize) -> monel_verbs::Result<()> {
    e.qp.post_send(SendWr {
        wr_id,
        op,
        sg_list: vec![e.mr.sge(0, size)],
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    })
}

/// read_lat and atomic_lat (client): one READ (or FETCH_AND_ADD of 8 bytes) at a time.
/// Returns the post times.
pub(crate) fn reads(
    e: &Endpoint<'_>,
    test: Test,
    size: usize,
    iters: u32,
) -> anyhow::Result<Vec<Instant>> {
    let mut posts = Vec::with_capacity(iters as usize);
    let mut wcs = Vec::new();
    for i in 0..iters {
        posts.push(Instant::now());
        let op = if test == Test::AtomicLat {
            SendOp::FetchAdd {
                remote: remote(e),
                add: 1,
            }
        } else {
            SendOp::Read(remote(e))
        };
        post_signaled(e, u64::from(i), op, size)?;
        wait_one(e, &mut wcs, test.name())?;
    }
    Ok(posts)
}

/// send_lat: the server waits for a message before each SEND, the client sends first; sends
/// are signaled every 100th and at the last (perftest's `--cq-mod`). Returns the post times.
pub(crate) fn send_pingpong(
    e: &Endpoint<'_>,
    size: usize,
    iters: u32,
    client: bool,
    mut posted: u32,
) -> anyhow::Result<Vec<Instant>> {
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut posts = Vec::with_capacity(iters as usize);
    let mut wcs: Vec<WorkCompletion> = Vec::new();
    let mut pending_send = false;
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && client) {
            let t = Instant::now();
            let mut got = false;
            while !got {
                wcs.clear();
                if e.cq.poll_into(16, &mut wcs) == 0 {
                    e.cq.wait(Duration::from_millis(20));
                }
                for wc in &wcs {
                    if wc.status != WcStatus::Success {
                        bail!("send-lat: completion {:?}", wc.status);
                    }
                    if wc.opcode == WcOpcode::Recv {
                        rcnt += 1;
                        got = true;
                        if posted < iters {
                            post_recvs(e, size, 1)?;
                            posted += 1;
                        }
                    } else {
                        pending_send = false;
                    }
                }
                if t.elapsed() > STALL {
                    bail!("send-lat: message {} never arrived", rcnt + 1);
                }
            }
        }
        if scnt < iters {
            posts.push(Instant::now());
            scnt += 1;
            let signaled = scnt % 100 == 0 || scnt == iters;
            e.qp.post_send(SendWr {
                wr_id: u64::from(scnt),
                op: SendOp::Send,
                sg_list: vec![e.mr.sge(0, size)],
                flags: SendFlags {
                    signaled,
                    ..SendFlags::default()
                },
            })?;
            pending_send |= signaled;
        }
    }
    // The last signaled send's completion.
    let t = Instant::now();
    while pending_send && t.elapsed() < STALL {
        wcs.clear();
        if e.cq.poll_into(16, &mut wcs) == 0 {
            e.cq.wait(Duration::from_millis(20));
        }
        pending_send &= !wcs.iter().any(|w| w.opcode == WcOpcode::Send);
    }
    Ok(posts)
}

/// Waits for one send completion, which must be a success.
fn wait_one(e: &Endpoint<'_>, wcs: &mut Vec<WorkCompletion>, what: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        wcs.clear();
        if e.cq.poll_into(1, wcs) == 1 {
            if wcs[0].status != WcStatus::Success {
                bail!("{what}: completion {:?}", wcs[0].status);
            }
            return Ok(());
        }
        if t.elapsed() > STALL {
            bail!("{what}: no completion for {STALL:?}");
        }
        e.cq.wait(Duration::from_millis(20));
    }
}

/// perftest's latency row (`REPORT_FMT_LAT`) from the post times: the gaps between
/// consecutive posts over `rtt_factor` (2 for ping-pongs: one way), sorted, the two largest
/// left out; t_typical is the median.
pub(crate) fn lat_row(size: usize, iters: u32, posts: &[Instant], rtt_factor: f64) -> String {
    let mut d: Vec<f64> = posts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    d.sort_by(f64::total_cmp);
    d.truncate(d.len().saturating_sub(2).max(1.min(d.len())));
    let n = d.len();
    if n == 0 {
        return format!(" {size:<7} {iters}          (too few iterations)");
    }
    let median = if n % 2 == 0 {
        (d[n / 2] + d[n / 2 - 1]) / 2.0
    } else {
        d[n / 2]
    };
    let avg = d.iter().sum::<f64>() / n as f64;
    let sd = (d.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / n as f64).sqrt();
    let pct = |p: f64| d[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
    format!(
        " {size:<7} {iters}          {:<7.2}        {:<7.2}      {median:<7.2}  \t       {avg:<7.2}     \t{sd:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        d[0],
        d[n - 1],
        pct(0.99),
        pct(0.999)
    )
}

/// Posts `n` receives of `size` bytes; returns `n`.
pub(crate) fn post_recvs(e: &Endpoint<'_>, size: usize, n: u32) -> anyhow::Result<u32> {
    for i in 0..n {
        e.qp.post_recv(RecvWr {
            wr_id: u64::from(i),
            sg_list: vec![e.mr.sge(0, size)],
        })?;
    }
    Ok(n)
}

/// The next completions into `wcs` (waiting a little when there are none: then `Ok(false)`);
/// an error once nothing has completed for 30 s since `last`, or on a failed completion.
fn next_completions(
    cq: &monel_verbs::CompletionQueue,
    wcs: &mut Vec<WorkCompletion>,
    last: &mut Instant,
    what: &str,
) -> anyhow::Result<bool> {
    wcs.clear();
    if cq.poll_into(64, wcs) == 0 {
        cq.wait(Duration::from_millis(20));
        if last.elapsed() > Duration::from_secs(30) {
            bail!("{what}: nothing completed for 30 s");
        }
        return Ok(false);
    }
    *last = Instant::now();
    if let Some(wc) = wcs.iter().find(|w| w.status != WcStatus::Success) {
        bail!("{what}: completion {:?} ({:?})", wc.status, wc.opcode);
    }
    Ok(true)
}

/// A whole-run report: `count` messages of `size` since `start`.
fn whole_run(size: usize, count: u64, start: Option<Instant>) -> BwReport {
    let seconds = start.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-9);
    BwReport {
        size,
        iters: count,
        seconds,
        peak_mbs: count as f64 * size as f64 / seconds / f64::from(1 << 20),
    }
}

/// `send-bw -b`: each side SENDs `iters` messages on each QP while it receives as many,
/// reposting a receive on its QP while more are due; the server starts sending at its first
/// arrival (perftest's `run_iter_bi`). With a duration, both run for it and count what this
/// side sent between the margins. The report is this side's sends.
pub(crate) fn both_ways(
    eps: &[Endpoint<'_>],
    o: &PerfOptions,
    posted: u32,
    client: bool,
) -> anyhow::Result<BwReport> {
    let cq = eps[0].cq;
    let qpns: Vec<_> = eps.iter().map(|e| e.qp.qp_num()).collect();
    let n = eps.len();
    let (mut sent, mut done, mut got) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    let mut rposted = vec![u64::from(posted); n];
    let per = if o.duration.is_some() {
        u64::MAX
    } else {
        u64::from(o.iters)
    };
    let cq_mod = u64::from(o.cq_mod.clamp(1, o.tx_depth));
    let mut start = client.then(Instant::now);
    let mut sampler = Sampler::new(o, start);
    let mut wcs = Vec::new();
    let mut last = Instant::now();
    loop {
        let stop = sampler
            .as_mut()
            .is_some_and(|s| s.tick(done.iter().sum(), Instant::now()));
        let sending = start.is_some() && !stop;
        let mut busy = o.duration.is_some() && !stop;
        for (k, e) in eps.iter().enumerate() {
            while sending && sent[k] < per && sent[k] - done[k] < u64::from(o.tx_depth) {
                let sig = (sent[k] + 1) % cq_mod == 0 || sent[k] + 1 == per;
                match e.qp.post_send(SendWr {
                    wr_id: sent[k] + 1,
                    op: SendOp::Send,
                    sg_list: vec![e.mr.sge(0, o.size)],
                    flags: SendFlags {
                        signaled: sig,
                        ..SendFlags::default()
                    },
                }) {
                    Ok(()) => sent[k] += 1,
                    Err(monel_verbs::VerbsError {
                        kind: monel_verbs::ErrorKind::Post(_),
                        ..
                    }) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            // Unsignaled sends at the end of a timed run complete with the next signaled
            // one: the run ends when the last signaled one has.
            let owed = if stop {
                sent[k] - sent[k] % cq_mod
            } else {
                sent[k]
            };
            busy |= done[k] < owed || (o.duration.is_none() && (sent[k] < per || got[k] < per));
        }
        if !busy {
            break;
        }
        if !next_completions(cq, &mut wcs, &mut last, "send-bw -b")? {
            continue;
        }
        for wc in &wcs {
            let Some(k) = qpns.iter().position(|&q| q == wc.qp_num) else {
                continue;
            };
            if wc.opcode == WcOpcode::Recv {
                if start.is_none() {
                    start = Some(Instant::now());
                    sampler = Sampler::new(o, start);
                }
                got[k] += 1;
                if rposted[k] < per {
                    post_recvs(&eps[k], o.size, 1)?;
                    rposted[k] += 1;
                }
            } else {
                done[k] = done[k].max(wc.wr_id);
            }
        }
    }
    Ok(sampler
        .and_then(|s| s.report(o.size))
        .unwrap_or_else(|| whole_run(o.size, done.iter().sum(), start)))
}

/// `send-bw` server: counts `iters` receives on each QP (each began with `posted` posted),
/// reposting on a QP while more are due there; the clock runs from the first arrival. With a
/// duration: receives until it has passed since the first arrival, counting what arrives
/// between the margins (perftest's `-D`).
pub(crate) fn recv_run(
    eps: &[Endpoint<'_>],
    o: &PerfOptions,
    posted: u32,
) -> anyhow::Result<BwReport> {
    let cq = eps[0].cq;
    let qpns: Vec<_> = eps.iter().map(|e| e.qp.qp_num()).collect();
    let mut posted = vec![posted; eps.len()];
    let total = u64::from(o.iters) * eps.len() as u64;
    let (mut got, mut start) = (0u64, None::<Instant>);
    let mut sampler = Sampler::new(o, None);
    let mut wcs = Vec::new();
    let mut last = Instant::now();
    loop {
        let done = match sampler.as_mut() {
            Some(s) => s.tick(got, Instant::now()),
            None => got >= total,
        };
        if done {
            break;
        }
        if !next_completions(cq, &mut wcs, &mut last, "send-bw")? {
            continue;
        }
        for wc in &wcs {
            if start.is_none() {
                start = Some(Instant::now());
                sampler = Sampler::new(o, start);
            }
            got += 1;
            let Some(k) = qpns.iter().position(|&q| q == wc.qp_num) else {
                continue;
            };
            if o.duration.is_some() || posted[k] < o.iters {
                post_recvs(&eps[k], o.size, 1)?;
                posted[k] += 1;
            }
        }
    }
    Ok(sampler
        .and_then(|s| s.report(o.size))
        .unwrap_or_else(|| whole_run(o.size, got, start)))
}
