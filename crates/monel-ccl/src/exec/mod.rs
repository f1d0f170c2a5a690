//! Runs one rank's schedule over its links: each step's local operations, then its sends and
//! receives, all driven without blocking and in posting order per peer; sleeps in poll(2)
//! when nothing moves. Every frame carries the collective's signature, so a rank that called
//! something else is caught at the first message; an idle link is watched for a peer's abort
//! or death, so no rank waits out the timeout for a failure another rank already saw.
//!
//! ```text
//! mod.rs    run: a schedule's steps over the links; which sends may stay in place; sleeping
//! ctx       what a call runs under (signature, deadline, liveness, point-to-point numbers)
//! links     the links to every peer; the tiny path's one exchange outside a schedule
//! send      one send in flight          recv   one receive in flight (copy or reduce)
//! p2p       which peer's message is first, for receives from any of several
//! abort     abort frames and goodbyes: telling peers of a failure, and reading theirs
//! ```

use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

mod abort;
mod ctx;
mod links;
mod p2p;
mod recv;
mod send;

pub(crate) use abort::{gave_up_in, send_abort, send_close};
pub(crate) use ctx::{Ctx, Name, P2P_CODE, P2pSeqs};
pub(crate) use links::Links;
pub(crate) use p2p::wait_p2p;

use abort::{reason_behind, watch_idle};
use ctx::lost;
use recv::RecvSt;
use send::SendSt;

use crate::error::{CclError, ErrorKind, Result};
use crate::frame::HEADER_LEN;
use monel_sched::buffers::Buffers;
use monel_sched::schedule::{Buf, Op, Schedule, Span};

/// Largest payload per frame: bigger messages go as several frames.
const FRAME_MAX: usize = 16 << 20;
/// Most bytes reduced straight out of a shared-memory ring before releasing them, so the
/// writer refills the ring while this side works.
const RING_PIECE: usize = 64 << 10;
/// Staging for receives that reduce: received in pieces of this size, then reduced.
const STAGE: usize = 256 << 10;

/// What the executor keeps between calls, so a call allocates nothing it had before.
#[derive(Default)]
pub(crate) struct Pool {
    sends: Vec<SendSt>,
    recvs: Vec<RecvSt>,
    /// Staging for reducing receives, one per peer (one receive per peer is in flight).
    stages: Vec<Vec<u8>>,
    early: Vec<bool>,
    /// Per peer, one past the last step that sends to or receives from it (0: none).
    last: Vec<usize>,
    driven: Vec<u8>,
    armed: Vec<(usize, i32, PollFlags)>,
    /// With stable sends: the schedule's writes (step, by a receive, address range).
    writes: Vec<Write>,
    /// Per peer: stable sends went to it, so the call ends by settling its link.
    settle: Vec<bool>,
}

/// Waits briefly without sleeping: one pause hint (about 70 ns on recent Intel cores), and
/// every `every` rounds a yield, so a peer that shares this core runs.
fn spin_pause(round: u32, every: u32) {
    if round % every.max(1) == every.max(1) - 1 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Runs `sched` on `bufs` over `ctx`'s links.
pub(crate) fn run(
    ctx: &mut Ctx<'_>,
    sched: &Schedule,
    bufs: &mut Buffers<'_>,
    pool: &mut Pool,
) -> Result<()> {
    bufs.reserve_scratch(sched.scratch);
    let es = bufs.elem();
    let npeers = ctx.links.links.len();
    let Pool {
        sends,
        recvs,
        stages,
        early,
        last,
        driven,
        armed,
        writes,
        settle,
    } = pool;
    stages.resize_with(npeers, Vec::new);
    early.clear();
    early.resize(npeers, false);
    driven.resize(npeers, 0);
    last.clear();
    last.resize(npeers, 0);
    for (i, step) in sched.steps.iter().enumerate() {
        for op in &step.ops {
            if let Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } = *op
            {
                if let Some(l) = last.get_mut(peer) {
                    *l = i + 1;
                }
            }
        }
    }
    writes.clear();
    settle.clear();
    settle.resize(npeers, false);
    if ctx.stable_sends {
        note_writes(sched, bufs, writes)?;
    }
    for (now_at, step) in sched.steps.iter().enumerate() {
        for op in &step.ops {
            match *op {
                Op::Copy { src, dst } => bufs.copy(src, dst)?,
                Op::Reduce { src, dst } => bufs.reduce(src, dst)?,
                Op::Divide { dst } => bufs.divide(dst)?,
                _ => {}
            }
        }
        sends.clear();
        recvs.clear();
        for op in &step.ops {
            let (peer, dst, acc) = match *op {
                Op::Send { peer, src } => {
                    let stable = ctx.stable_sends && stays(writes, now_at, src, bufs)?;
                    if stable {
                        if let Some(s) = settle.get_mut(peer) {
                            *s = true;
                        }
                    }
                    sends.push(SendSt {
                        peer,
                        sig: ctx.next_sig(peer, src.len * es, true, src.buf),
                        src,
                        total: src.len * es,
                        sent: 0,
                        hdr: [0; HEADER_LEN],
                        hdr_sent: 0,
                        frame_left: 0,
                        in_frame: false,
                        stable,
                        done: false,
                    });
                    continue;
                }
                Op::Recv { peer, dst, reduce } => (peer, dst, reduce.then_some(dst)),
                Op::RecvReduce { peer, acc, dst } => (peer, dst, Some(acc)),
                _ => continue,
            };
            recvs.push(RecvSt {
                peer,
                sig: ctx.next_sig(peer, dst.len * es, false, dst.buf),
                dst,
                acc,
                total: dst.len * es,
                got: 0,
                hdr: [0; HEADER_LEN],
                hdr_got: 0,
                frame_left: 0,
                in_frame: false,
                stage_len: if acc.is_some() {
                    let len = (STAGE - STAGE % es).min(dst.len * es).max(es);
                    if stages[peer].len() < len {
                        stages[peer].resize(len, 0);
                    }
                    len
                } else {
                    0
                },
                fill: 0,
                done: false,
            });
        }
        let mut idle_since: Option<Instant> = None;
        // Since when nothing moved at all (sleeps included), for the liveness check.
        let mut stalled_since: Option<Instant> = None;
        let mut round = 0u32;
        loop {
            // One send and one receive in flight per peer, in posting order. `driven[p]`
            // ends the pass with bit 1 set if a send to p is still pending, bit 2 a receive.
            let mut progress = false;
            driven.fill(0);
            for s in sends.iter_mut().filter(|s| !s.done) {
                if driven[s.peer] & 1 != 0 {
                    continue;
                }
                progress |= match s.drive(ctx, bufs) {
                    Ok(p) => p,
                    Err(e) if e.kind == ErrorKind::PeerLost => {
                        // Where this side stands in the peer's incoming stream: the frame
                        // boundary the unread bytes start from, if any.
                        let skip = recvs.iter().find(|r| r.peer == s.peer && !r.done).map_or(
                            Some(0),
                            |r| match (r.hdr_got, r.in_frame) {
                                (0, true) => Some(r.frame_left),
                                (0, false) => Some(0),
                                _ => None,
                            },
                        );
                        return Err(skip
                            .and_then(|k| reason_behind(ctx, s.peer, k))
                            .unwrap_or(e));
                    }
                    Err(e) => return Err(e),
                };
                ctx.links.mid_frame[s.peer] = s.in_frame || s.hdr_sent > 0;
                if !s.done {
                    driven[s.peer] |= 1;
                }
            }
            for r in recvs.iter_mut().filter(|r| !r.done) {
                if driven[r.peer] & 2 != 0 {
                    continue;
                }
                progress |= r.drive(ctx, bufs, &mut stages[r.peer])?;
                if !r.done {
                    driven[r.peer] |= 2;
                }
            }
            if driven.iter().all(|&d| d == 0) {
                break;
            }
            if progress {
                idle_since = None;
                stalled_since = None;
                continue;
            }
            let now = Instant::now();
            let deadline = *ctx.deadline.get_or_insert(now + ctx.timeout);
            if now >= deadline {
                let waiting: Vec<usize> = (0..npeers).filter(|&p| driven[p] != 0).collect();
                return Err(CclError::new(
                    ErrorKind::Timeout,
                    format!(
                        "{}: Timed out waiting {} ms for ranks {waiting:?}",
                        ctx.name.what(),
                        ctx.timeout.as_millis()
                    ),
                )
                .with_ranks(waiting));
            }
            // Nothing moved: spin a while (a peer is usually a moment behind), then sleep
            // until something can move, watching the idle links too.
            let since = *idle_since.get_or_insert(now);
            let stalled = *stalled_since.get_or_insert(now);
            if ctx.liveness.as_ref().is_some_and(|l| l.due(now, stalled)) {
                let waiting: Vec<usize> = (0..npeers).filter(|&p| driven[p] != 0).collect();
                let what = ctx.name.what();
                let links = &ctx.links.links;
                let progress = |p: usize| {
                    links
                        .get(p)
                        .and_then(Option::as_ref)
                        .and_then(|l| l.path_progress())
                };
                if let Some(l) = ctx.liveness.as_mut() {
                    l.check(now, stalled, &waiting, &what, &progress)?;
                }
            }
            if now - since < ctx.spin {
                spin_pause(round, ctx.yield_every);
                round = round.wrapping_add(1);
                continue;
            }
            armed.clear();
            let mut ready = false;
            for p in 0..npeers {
                let Some(l) = ctx.links.links[p].as_mut() else {
                    continue;
                };
                let recv = driven[p] & 2 != 0;
                let idle = !recv && !early[p] && !ctx.links.closed[p];
                let write = driven[p] & 1 != 0;
                if !(recv || idle || write) {
                    continue;
                }
                match l.arm(recv || idle, write) {
                    Some(f) => armed.push((p, l.fd(), f)),
                    None if idle && !write => {
                        // Something waits on a link this step does not read: look at it.
                        early[p] = watch_idle(ctx, p, last[p] <= now_at + 1)?;
                        ready = true;
                    }
                    None => ready = true,
                }
            }
            let mut woke: Vec<usize> = Vec::new();
            if !ready {
                let fired = sleep_on(armed.iter().map(|&(_, fd, f)| (fd, f)), deadline - now);
                woke = armed
                    .iter()
                    .zip(fired)
                    .filter(|&(&(p, _, _), fired)| fired && driven[p] & 2 == 0)
                    .map(|(&(p, _, _), _)| p)
                    .collect();
            }
            for &(p, _, _) in armed.iter() {
                if let Some(l) = ctx.links.links[p].as_mut() {
                    l.disarm();
                }
            }
            // An idle link that became readable: a peer's abort, goodbye or death, or data
            // for a later step (not watched again this step).
            for p in woke {
                early[p] = watch_idle(ctx, p, last[p] <= now_at + 1)?;
            }
            idle_since = None;
        }
    }
    // The transports may still read bytes sent in place: the caller gets them back once the
    // peers have them.
    for (p, _) in settle.iter().enumerate().filter(|(_, s)| **s) {
        let deadline = *ctx
            .deadline
            .get_or_insert_with(|| Instant::now() + ctx.timeout);
        let what = ctx.name.what();
        ctx.links
            .link(p)?
            .settle(deadline)
            .map_err(|e| lost(p, &what, &e))?;
    }
    Ok(())
}

/// The byte addresses a span's bytes take.
fn span_range(b: &[u8]) -> std::ops::Range<usize> {
    let p = b.as_ptr() as usize;
    p..p + b.len()
}

/// A write of a schedule: its step, whether a receive makes it, the addresses it writes.
type Write = (usize, bool, std::ops::Range<usize>);

/// True when a send of `src` at step `now_at` may leave its bytes in place: they are not
/// scratch, and none of `writes` touches them once the step's local operations have run (its
/// sends go after them): no later step writes them, nor a receive of this step.
fn stays(writes: &[Write], now_at: usize, src: Span, bufs: &Buffers<'_>) -> Result<bool> {
    if src.buf == Buf::Scratch {
        return Ok(false);
    }
    let at = span_range(bufs.bytes(src)?);
    Ok(!writes.iter().any(|(k, by_recv, w)| {
        (*k > now_at || (*k == now_at && *by_recv)) && w.start < at.end && at.start < w.end
    }))
}

/// Collects every write of `sched` outside scratch: its step, whether a receive makes it,
/// and the addresses it writes.
fn note_writes(sched: &Schedule, bufs: &Buffers<'_>, out: &mut Vec<Write>) -> Result<()> {
    for (k, step) in sched.steps.iter().enumerate() {
        for op in &step.ops {
            let (dst, by_recv) = match *op {
                Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } => (dst, true),
                Op::Copy { dst, .. } | Op::Reduce { dst, .. } | Op::Divide { dst } => (dst, false),
                Op::Send { .. } => continue,
            };
            if dst.buf != Buf::Scratch && dst.len > 0 {
                out.push((k, by_recv, span_range(bufs.bytes(dst)?)));
            }
        }
    }
    Ok(())
}

/// Sleeps until one of the armed link descriptors fires, or `left` passes (100 ms at most,
/// so the caller looks at its deadline and the idle links again); says which fired.
fn sleep_on(armed: impl Iterator<Item = (RawFd, PollFlags)>, left: Duration) -> Vec<bool> {
    // SAFETY: every descriptor belongs to a link the calling thread owns, which outlives
    // this poll call; none is closed meanwhile.
    #[allow(unsafe_code)]
    let mut fds: Vec<PollFd<'_>> = armed
        .map(|(fd, f)| PollFd::new(unsafe { BorrowedFd::borrow_raw(fd) }, f))
        .collect();
    let ms = left.as_millis().clamp(1, 100) as u16;
    let _ = poll(&mut fds, PollTimeout::from(ms));
    fds.iter()
        .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which sends of `sched`, in order, may leave their bytes in place.
    fn stable_flags(sched: &Schedule, bufs: &Buffers<'_>) -> Vec<bool> {
        let mut w = Vec::new();
        note_writes(sched, bufs, &mut w).unwrap();
        let mut out = Vec::new();
        for (k, step) in sched.steps.iter().enumerate() {
            for op in &step.ops {
                if let Op::Send { src, .. } = *op {
                    out.push(stays(&w, k, src, bufs).unwrap());
                }
            }
        }
        out
    }

    #[test]
    fn sends_stay_in_place_only_when_nothing_writes_their_bytes_before_the_call_ends() {
        use monel_sched::schedule as sch;
        use monel_sched::{DataType, RedOp};
        let (f32, sum) = (DataType::F32, RedOp::Sum);
        let mut buf = vec![0u8; 4 * 12];
        let input = vec![0u8; 4 * 12];
        // In-place ring AllReduce: the reduce-scatter half sends a chunk that the
        // all-gather half overwrites; the all-gather half sends finished chunks.
        let b = Buffers::in_place(&mut buf, 0, 0, f32, sum, 3);
        let ring = sch::allreduce_ring(3, 0, 12, false);
        assert_eq!(stable_flags(&ring, &b), [false, false, true, true]);
        // Out of place the first send reads the input, which nothing writes.
        let b = Buffers::separate(&input, &mut buf, f32, sum, 3);
        assert_eq!(stable_flags(&ring, &b), [true, false, true, true]);
        // In-place AllToAll: the block sent to a peer is where that peer's block lands, in
        // the same step.
        let a2a = sch::alltoall_direct(3, 0, 4);
        let b = Buffers::in_place(&mut buf, 0, 0, f32, sum, 3);
        assert_eq!(stable_flags(&a2a, &b), [false, false]);
        let b = Buffers::separate(&input, &mut buf, f32, sum, 3);
        assert_eq!(stable_flags(&a2a, &b), [true, true]);
        // A ring AllGather forwards blocks that are never written again.
        let ag = sch::all_gather_ring(3, 0, 4);
        let b = Buffers::separate(&input[..16], &mut buf, f32, sum, 3);
        assert_eq!(stable_flags(&ag, &b), [true, true]);
    }
}
