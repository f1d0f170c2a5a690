//! perftest-style measurements (`ib_write_bw`, `ib_send_lat`, ...) over Monel verbs, with
//! perftest's report conventions: MB/s means 2^20 bytes per second; latency is one-way for
//! SEND/WRITE ping-pong (round trip / 2) and the full round trip for READ and atomics;
//! t_typical is the median.

use std::time::{Duration, Instant};

use monel_verbs::CompletionQueue;
use monel_verbs::MemoryRegion;
use monel_verbs::cm::{BufferInfo, Connection};
use monel_verbs::{AccessFlags, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, WcStatus};
use monel_verbs::{ErrorKind, Result, VerbsError};
use monel_verbs::{ProtectionDomain, QueuePair};

/// The test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Test {
    /// RDMA WRITE bandwidth.
    WriteBw,
    /// SEND bandwidth.
    SendBw,
    /// RDMA READ bandwidth.
    ReadBw,
    /// RDMA WRITE ping-pong latency.
    WriteLat,
    /// SEND ping-pong latency.
    SendLat,
    /// RDMA READ latency.
    ReadLat,
    /// FETCH_ADD latency.
    AtomicLat,
    /// FETCH_ADD bandwidth.
    AtomicBw,
}

impl Test {
    /// Parses `write-bw`, `send-lat`, ...
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "write-bw" => Self::WriteBw,
            "send-bw" => Self::SendBw,
            "read-bw" => Self::ReadBw,
            "write-lat" => Self::WriteLat,
            "send-lat" => Self::SendLat,
            "read-lat" => Self::ReadLat,
            "atomic-lat" => Self::AtomicLat,
            "atomic-bw" => Self::AtomicBw,
            _ => return None,
        })
    }
    /// The name [`Self::parse`] takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::WriteBw => "write-bw",
            Self::SendBw => "send-bw",
            Self::ReadBw => "read-bw",
            Self::WriteLat => "write-lat",
            Self::SendLat => "send-lat",
            Self::ReadLat => "read-lat",
            Self::AtomicLat => "atomic-lat",
            Self::AtomicBw => "atomic-bw",
        }
    }
    /// True for the bandwidth tests.
    pub(crate) fn is_bw(self) -> bool {
        matches!(
            self,
            Self::WriteBw | Self::SendBw | Self::ReadBw | Self::AtomicBw
        )
    }
}

/// Options (perftest's flags).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerfOptions {
    /// `-s`: message size.
    pub(crate) size: usize,
    /// `-n`: iterations.
    pub(crate) iters: u32,
    /// `-D`: run for this long instead of `iters`.
    pub(crate) duration: Option<Duration>,
    /// With a duration: count only what completes this long after the start and before the
    /// end (perftest's margin, a quarter of the duration).
    pub(crate) margin: Option<Duration>,
    /// `-t`: send queue depth (bandwidth tests).
    pub(crate) tx_depth: u32,
    /// Signal every this many sends (perftest `--cq-mod`, default 100).
    pub(crate) cq_mod: u32,
}

impl Default for PerfOptions {
    fn default() -> Self {
        Self {
            size: 65536,
            iters: 1000,
            duration: None,
            margin: None,
            tx_depth: 128,
            cq_mod: 100,
        }
    }
}

/// A bandwidth result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BwReport {
    /// Message size.
    pub(crate) size: usize,
    /// Messages completed.
    pub(crate) iters: u64,
    /// Seconds.
    pub(crate) seconds: f64,
    /// Best rate over any tenth of the run, in MB/s (2^20 B/s).
    pub(crate) peak_mbs: f64,
}

impl BwReport {
    /// Average MB/s (2^20 B/s).
    pub(crate) fn avg_mbs(&self) -> f64 {
        self.size as f64 * self.iters as f64 / self.seconds / f64::from(1 << 20)
    }
    /// Gb/s (10^9 bit/s).
    pub(crate) fn gbps(&self) -> f64 {
        self.size as f64 * self.iters as f64 * 8.0 / self.seconds / 1e9
    }
    /// perftest's header.
    pub(crate) const HEADER: &str =
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
    /// One row, as perftest prints it (`REPORT_FMT`).
    pub(crate) fn row(&self) -> String {
        bw_row(
            self.size as u64,
            self.iters,
            self.peak_mbs,
            self.avg_mbs(),
            self.iters as f64 / self.seconds / 1e6,
        )
    }
}

/// perftest's bandwidth row: size, iterations, peak and average MB/s, million messages/s.
pub(crate) fn bw_row(size: u64, iters: u64, peak: f64, avg: f64, rate: f64) -> String {
    format!(" {size:<7}    {iters:<10}       {peak:<7.2}            {avg:<7.2}\t\t   {rate:<7.6}")
}

/// A latency result (microseconds).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LatReport {
    /// Message size.
    pub(crate) size: usize,
    /// Sorted samples, in microseconds.
    pub(crate) samples: Vec<f64>,
}

impl LatReport {
    fn pct(&self, p: f64) -> f64 {
        let n = self.samples.len();
        if n == 0 {
            return f64::NAN;
        }
        self.samples[((n as f64 * p).ceil() as usize).clamp(1, n) - 1]
    }
    /// Median.
    pub(crate) fn typical(&self) -> f64 {
        self.samples
            .get(self.samples.len() / 2)
            .copied()
            .unwrap_or(f64::NAN)
    }
    /// perftest's header.
    pub(crate) const HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";
    /// One row.
    pub(crate) fn row(&self) -> String {
        let n = self.samples.len() as f64;
        let avg = self.samples.iter().sum::<f64>() / n;
        let sd = (self.samples.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / n).sqrt();
        // perftest's REPORT_FMT_LAT.
        format!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            self.size,
            self.samples.len(),
            self.samples.first().copied().unwrap_or(f64::NAN),
            self.samples.last().copied().unwrap_or(f64::NAN),
            self.typical(),
            avg,
            sd,
            self.pct(0.99),
            self.pct(0.999)
        )
    }
}

/// One side's resources for a test.
#[derive(Debug)]
pub(crate) struct Endpoint<'a> {
    /// The connected QP.
    pub(crate) qp: &'a QueuePair,
    /// Its CQ (send and receive).
    pub(crate) cq: &'a CompletionQueue,
    /// Its buffer (at least `size` bytes; registered with remote read/write/atomic).
    pub(crate) mr: &'a MemoryRegion,
    /// The peer's buffer.
    pub(crate) remote: BufferInfo,
}

/// Registers a perf buffer for messages of `size` bytes: twice that (at least 8 each), the
/// first half the source of what this side sends, the second what the peer writes.
pub(crate) fn buffer(pd: &ProtectionDomain, size: usize) -> Result<MemoryRegion> {
    pd.reg_mr(
        vec![0u8; 2 * size.max(8)],
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
    )
}

const V: &str = "perf";

fn check(wc: &monel_verbs::WorkCompletion) -> Result<()> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(VerbsError::invalid(
            V,
            format!("completion {:?} for wr {}", wc.status, wc.wr_id),
        ))
    }
}

/// The next completion; `got` is scratch space, reused so the loop allocates nothing.
fn wait(
    cq: &CompletionQueue,
    busy: bool,
    got: &mut Vec<monel_verbs::WorkCompletion>,
) -> Result<monel_verbs::WorkCompletion> {
    // A completion already queued is taken without a clock read or a wait.
    got.clear();
    let mut deadline = None;
    loop {
        if cq.poll_queued(1, got) == 1 || (busy && cq.poll_into(1, got) == 1) {
            let wc = got.pop().expect("one completion");
            check(&wc)?;
            return Ok(wc);
        }
        let now = Instant::now();
        if now > *deadline.get_or_insert(now + Duration::from_secs(30)) {
            return Err(VerbsError::new(
                V,
                ErrorKind::Timeout("no completion in 30 s".into()),
            ));
        }
        // Sleeping: the wait returns at once when a completion is queued, and otherwise
        // looks at the sockets only when ppoll finds them readable.
        if !busy {
            cq.wait(Duration::from_millis(100));
        }
    }
}

fn post_op(e: &Endpoint<'_>, test: Test, size: usize, wr_id: u64, signaled: bool) -> Result<()> {
    let half = if test == Test::WriteLat {
        size.max(8) as u64
    } else {
        0
    };
    let remote = RemoteAddr {
        addr: e.remote.addr + half,
        rkey: e.remote.rkey,
    };
    let op = match test {
        Test::WriteBw | Test::WriteLat => SendOp::Write(remote),
        Test::SendBw | Test::SendLat => SendOp::Send,
        Test::ReadBw | Test::ReadLat => SendOp::Read(remote),
        Test::AtomicLat | Test::AtomicBw => SendOp::FetchAdd { remote, add: 1 },
    };
    let len = if matches!(test, Test::AtomicLat | Test::AtomicBw) {
        8
    } else {
        size
    };
    e.qp.post_send(SendWr {
        wr_id,
        op,
        sg_list: vec![e.mr.sge(0, len)],
        flags: SendFlags {
            signaled,
            ..SendFlags::default()
        },
    })
}

/// A timed run's clock (perftest's `-D`): it starts at `start` (the server's at its first
/// arrival), counts what completes between the margins, and ends after the duration.
pub(crate) struct Sampler {
    duration: Duration,
    margin: Duration,
    start: Option<Instant>,
    opened: Option<(u64, Instant)>,
    closed: Option<(u64, Instant)>,
}

impl Sampler {
    pub(crate) fn new(o: &PerfOptions, start: Option<Instant>) -> Option<Self> {
        Some(Self {
            duration: o.duration?,
            margin: o.margin.unwrap_or_default(),
            start,
            opened: None,
            closed: None,
        })
    }
    /// Notes the count at `now`; true once the duration has passed.
    pub(crate) fn tick(&mut self, count: u64, now: Instant) -> bool {
        let Some(t0) = self.start else {
            return false;
        };
        if self.opened.is_none() && now >= t0 + self.margin {
            self.opened = Some((count, now));
        }
        if self.closed.is_none() && now >= t0 + self.duration.saturating_sub(self.margin) {
            self.closed = Some((count, now));
        }
        now >= t0 + self.duration
    }
    /// What the window held, as perftest reports a timed run (no peak).
    pub(crate) fn report(&self, size: usize) -> Option<BwReport> {
        let ((a, ta), (b, tb)) = (self.opened?, self.closed?);
        Some(BwReport {
            size,
            iters: b - a,
            seconds: (tb - ta).as_secs_f64().max(1e-9),
            peak_mbs: 0.0,
        })
    }
}

/// Bandwidth, requester side: keeps `tx_depth` messages in flight on each endpoint's QP
/// (perftest's `-q`: every QP runs `iters` messages, posted round-robin; the endpoints share
/// one CQ). With a duration, the report counts what completed between `margin` after the
/// start and `margin` before the end, over that time (perftest's `-D`); without one, every
/// message over the whole run.
pub(crate) fn bw_client(eps: &[Endpoint<'_>], test: Test, o: &PerfOptions) -> Result<BwReport> {
    let Some(cq) = eps.first().map(|e| e.cq) else {
        return Err(VerbsError::invalid(V, "no QP to run on"));
    };
    let start = Instant::now();
    let end_at = o.duration.map(|d| start + d);
    let total = if end_at.is_some() {
        u64::MAX
    } else {
        u64::from(o.iters)
    };
    let cq_mod = u64::from(o.cq_mod.clamp(1, o.tx_depth));
    // Per QP: messages posted and completed (wr_ids count from 1 on each).
    let mut posted = vec![0u64; eps.len()];
    let mut done = vec![0u64; eps.len()];
    let mut closed = vec![false; eps.len()];
    let qpns: Vec<_> = eps.iter().map(|e| e.qp.qp_num()).collect();
    let (mut all_done, mut marks) = (0u64, Vec::new());
    // perftest's timed run counts only between its margins.
    let mut sampler = o.margin.and_then(|_| Sampler::new(o, Some(start)));
    let mut wcs = Vec::new();
    loop {
        let stop = end_at.is_some_and(|t| Instant::now() >= t);
        let mut busy = false;
        for (k, e) in eps.iter().enumerate() {
            let (p, d) = (&mut posted[k], done[k]);
            while !stop && *p < total && *p - d < u64::from(o.tx_depth) {
                let sig = (*p + 1) % cq_mod == 0 || *p + 1 == total;
                match post_op(e, test, o.size, *p + 1, sig) {
                    Ok(()) => *p += 1,
                    Err(VerbsError {
                        kind: ErrorKind::Post(_),
                        ..
                    }) => break,
                    Err(err) => return Err(err),
                }
            }
            if stop && !closed[k] && *p % cq_mod != 0 && d < *p {
                // Close the run with a signaled message so every posted one is accounted for.
                while post_op(e, test, o.size, *p + 1, true).is_err() {
                    std::thread::yield_now();
                }
                *p += 1;
                closed[k] = true;
            }
            busy |= d < *p || (!stop && *p < total);
        }
        if !busy {
            break;
        }
        wcs.clear();
        if cq.poll_into(64, &mut wcs) == 0 {
            cq.wait(Duration::from_millis(50));
        }
        for wc in &wcs {
            check(wc)?;
            let Some(k) = qpns.iter().position(|&q| q == wc.qp_num) else {
                continue;
            };
            if wc.wr_id > done[k] {
                all_done += wc.wr_id - done[k];
                done[k] = wc.wr_id;
            }
            marks.push((all_done, start.elapsed().as_secs_f64()));
        }
        if let Some(s) = sampler.as_mut() {
            s.tick(all_done, Instant::now());
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if let Some(r) = sampler.and_then(|s| s.report(o.size)) {
        return Ok(r);
    }
    // Peak: best rate over any window holding a tenth of the messages.
    let win = (all_done / 10).max(1);
    let mut peak = 0f64;
    let mut j = 0;
    for i in 0..marks.len() {
        while marks[i].0 - marks[j].0 > win {
            j += 1;
        }
        let dt = marks[i].1 - marks[j].1;
        if dt > 0.0 && marks[i].0 > marks[j].0 {
            peak = peak.max((marks[i].0 - marks[j].0) as f64 * o.size as f64 / dt);
        }
    }
    let avg = all_done as f64 * o.size as f64 / seconds;
    Ok(BwReport {
        size: o.size,
        iters: all_done,
        seconds,
        peak_mbs: peak.max(avg) / f64::from(1 << 20),
    })
}

/// Bandwidth, responder side: for SEND keeps receives posted until `n` messages arrived;
/// for WRITE and READ there is nothing to do but wait for the barrier.
pub(crate) fn bw_server(
    e: &Endpoint<'_>,
    test: Test,
    o: &PerfOptions,
    conn: &mut Connection,
) -> Result<u64> {
    if test != Test::SendBw {
        conn.barrier()?;
        return Ok(0);
    }
    let depth = e.qp.cap().max_recv_wr;
    for i in 0..depth {
        e.qp.post_recv(RecvWr {
            wr_id: u64::from(i),
            sg_list: vec![e.mr.sge(0, o.size)],
        })?;
    }
    // The client says how many it sent through the barrier stream.
    let mut got = 0u64;
    let mut wcs = Vec::new();
    let mut expected: Option<u64> = None;
    conn.stream
        .set_nonblocking(true)
        .map_err(|e| VerbsError::io(V, e))?;
    loop {
        wcs.clear();
        if e.cq.poll_into(64, &mut wcs) == 0 {
            e.cq.wait(Duration::from_millis(5));
        }
        for wc in &wcs {
            check(wc)?;
            got += 1;
            e.qp.post_recv(RecvWr {
                wr_id: wc.wr_id,
                sg_list: vec![e.mr.sge(0, o.size)],
            })?;
        }
        if expected.is_none() {
            let mut b = [0u8; 8];
            use std::io::Read;
            match conn.stream.read_exact(&mut b) {
                Ok(()) => expected = Some(u64::from_be_bytes(b)),
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(VerbsError::io(V, err)),
            }
        }
        if expected.is_some_and(|n| got >= n) {
            break;
        }
    }
    conn.stream
        .set_nonblocking(false)
        .map_err(|e| VerbsError::io(V, e))?;
    Ok(got)
}

/// Tells a SEND-bandwidth server how many messages to expect (others: a barrier).
pub(crate) fn bw_client_finish(test: Test, r: &BwReport, conn: &mut Connection) -> Result<()> {
    if test == Test::SendBw {
        use std::io::Write;
        conn.stream
            .write_all(&r.iters.to_be_bytes())
            .map_err(|e| VerbsError::io(V, e))
    } else {
        conn.barrier()
    }
}

/// Latency. For SEND/WRITE both sides ping-pong (`initiator` sends first); for READ and
/// atomics only the initiator works and the other side returns at once.
pub(crate) fn lat(
    e: &Endpoint<'_>,
    test: Test,
    o: &PerfOptions,
    initiator: bool,
    busy: bool,
) -> Result<LatReport> {
    let n = o.iters as usize;
    let mut samples = Vec::with_capacity(n);
    let mut got = Vec::with_capacity(1);
    match test {
        Test::ReadLat | Test::AtomicLat | Test::AtomicBw => {
            if !initiator {
                return Ok(LatReport {
                    size: o.size,
                    samples,
                });
            }
            for i in 0..n {
                let t = Instant::now();
                post_op(e, test, o.size, i as u64, true)?;
                wait(e.cq, busy, &mut got)?;
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        Test::SendLat => {
            let post_recv = || {
                e.qp.post_recv(RecvWr {
                    wr_id: 0,
                    sg_list: vec![e.mr.sge(0, o.size)],
                })
            };
            post_recv()?;
            post_recv()?;
            let mut t = Instant::now();
            if initiator {
                post_op(e, test, o.size, 1, true)?;
            }
            let mut recvs = 0;
            let mut sends = u32::from(initiator);
            let mut sent_done = 0;
            while recvs < n || sent_done < sends {
                let wc = wait(e.cq, busy, &mut got)?;
                if wc.opcode == monel_verbs::WcOpcode::Send {
                    sent_done += 1;
                    continue;
                }
                recvs += 1;
                post_recv()?;
                if initiator {
                    let now = Instant::now();
                    samples.push((now - t).as_secs_f64() * 1e6 / 2.0);
                    t = now;
                }
                if (initiator && recvs < n) || (!initiator && sends < n as u32) {
                    post_op(e, test, o.size, 1, true)?;
                    sends += 1;
                }
            }
        }
        Test::WriteLat => {
            // As perftest: poll the last byte of our buffer for the peer's counter.
            let last = o.size.max(1) - 1;
            let inbox = o.size.max(8) + last;
            let mut t = Instant::now();
            for i in 0..n {
                let tag = (i % 250 + 1) as u8;
                if initiator {
                    e.mr.write(last, &[tag])?;
                    post_op(e, test, o.size, i as u64, false)?;
                }
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let mut b = [0u8; 1];
                    e.mr.read(inbox, &mut b)?;
                    if b[0] == tag {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(VerbsError::new(
                            V,
                            ErrorKind::Timeout("peer's WRITE never landed".into()),
                        ));
                    }
                    if !busy {
                        std::thread::yield_now();
                    }
                }
                if !initiator {
                    e.mr.write(last, &[tag])?;
                    post_op(e, test, o.size, i as u64, false)?;
                } else {
                    let now = Instant::now();
                    samples.push((now - t).as_secs_f64() * 1e6 / 2.0);
                    t = now;
                }
            }
        }
        _ => return Err(VerbsError::invalid(V, "not a latency test")),
    }
    samples.sort_by(f64::total_cmp);
    Ok(LatReport {
        size: o.size,
        samples,
    })
}
