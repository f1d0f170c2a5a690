//! Ring algorithms: reduce-scatter and all-gather around a ring of ranks, whole or in
//! pipelined pieces.

use std::ops::Range;

use super::*;

/// Where a ring reduce-scatter reads and writes.
pub(super) struct RingRs {
    /// Where chunk c's own contribution is (the input).
    pub(super) acc: Buf,
    /// Where the partial sum of chunk c received at step k waits to be sent at step k+1:
    /// `slot(k, chunks, c)`.
    pub(super) slot: fn(usize, &[Range<usize>], usize) -> Span,
    /// Where chunk r, the finished one, lands.
    pub(super) last: Span,
}

/// Ring reduce-scatter (NCCL's ring): over n-1 steps rank r sends chunk r-1-s and receives
/// and reduces chunk r-2-s; after the last step the full reduction of chunk r is at
/// `rs.last`. Every receive reduces the incoming partial sum with this rank's own input
/// (`RecvReduce`), so nothing is copied beforehand; step 0 sends straight from the input.
pub(super) fn ring_reduce_scatter_steps(
    s: &mut Schedule,
    n: usize,
    r: usize,
    chunks: &[Range<usize>],
    rs: &RingRs,
) {
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for k in 0..n - 1 {
        let send = modn(r as isize - 1 - k as isize, n);
        let recv = modn(r as isize - 2 - k as isize, n);
        let src = if k == 0 {
            Span::of(rs.acc, chunks[send].clone())
        } else {
            (rs.slot)(k - 1, chunks, send)
        };
        let dst = if k == n - 2 {
            rs.last
        } else {
            (rs.slot)(k, chunks, recv)
        };
        let ops = s.step();
        ops.push(Op::Send { peer: next, src });
        ops.push(Op::RecvReduce {
            peer: prev,
            acc: Span::of(rs.acc, chunks[recv].clone()),
            dst,
        });
    }
}

/// Chunk c of `Output`, at its own offset (partial sums of AllReduce live where the result
/// will be).
pub(super) fn output_slot(_step: usize, chunks: &[Range<usize>], c: usize) -> Span {
    Span::of(Buf::Output, chunks[c].clone())
}

/// Chunk c of `Input`, at its own offset (in-place ReduceScatter works on the input).
pub(super) fn input_slot(_step: usize, chunks: &[Range<usize>], c: usize) -> Span {
    Span::of(Buf::Input, chunks[c].clone())
}

/// Two scratch slots of one chunk each, alternating by step: a partial sum received at step
/// k is sent at step k+1 while step k+1 receives into the other slot.
pub(super) fn alternating_slot(step: usize, chunks: &[Range<usize>], c: usize) -> Span {
    let len = chunks[c].len();
    Span {
        buf: Buf::Scratch,
        off: (step % 2) * len,
        len,
    }
}

/// Ring all-gather over `buf`, where rank r starts with chunk r: sends chunk r-s at step s and
/// receives chunk r-1-s.
pub(super) fn ring_all_gather_steps(
    s: &mut Schedule,
    n: usize,
    r: usize,
    chunks: &[Range<usize>],
    buf: Buf,
) {
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for k in 0..n - 1 {
        let send = modn(r as isize - k as isize, n);
        let recv = modn(r as isize - 1 - k as isize, n);
        let ops = s.step();
        ops.push(Op::Send {
            peer: next,
            src: Span::of(buf, chunks[send].clone()),
        });
        ops.push(Op::Recv {
            peer: prev,
            dst: Span::of(buf, chunks[recv].clone()),
            reduce: false,
        });
    }
}

/// AllReduce by ring: reduce-scatter then all-gather, 2(n-1) steps, each rank sending
/// 2(n-1)/n of the data. Result in `Output`.
pub fn allreduce_ring(n: usize, r: usize, count: usize, avg: bool) -> Schedule {
    let mut s = Schedule::default();
    let all = Span::of(Buf::Output, 0..count);
    if n == 1 {
        s.step().push(Op::Copy {
            src: Span::of(Buf::Input, 0..count),
            dst: all,
        });
    }
    if n > 1 {
        let chunks = split(count, n);
        let rs = RingRs {
            acc: Buf::Input,
            slot: output_slot,
            last: Span::of(Buf::Output, chunks[r].clone()),
        };
        ring_reduce_scatter_steps(&mut s, n, r, &chunks, &rs);
        finish_avg(&mut s, avg, Span::of(Buf::Output, chunks[r].clone()));
        ring_all_gather_steps(&mut s, n, r, &chunks, Buf::Output);
    } else {
        finish_avg(&mut s, avg, all);
    }
    s
}

/// How many pieces [`allreduce_ring_pipelined`] cuts `count` into (any unit, as long as
/// `count` and `slice` share it).
pub fn ring_pieces(n: usize, count: usize, slice: usize) -> usize {
    count.div_ceil(n.saturating_mul(slice.max(1)).max(1)).max(1)
}

/// AllReduce, ring, pipelined for large counts: the buffer is cut into pieces of about
/// `n * slice` elements and the ring runs on each in turn, so a piece's reduced part is sent
/// on while it is still in cache (the plain ring re-reads the whole reduced part from memory
/// for its all-gather). Each piece is [`allreduce_ring`] of its own elements, so an element's
/// ranks are added in a different order than in one ring over the whole buffer (use the
/// deterministic algorithm for bits that never depend on the algorithm).
pub fn allreduce_ring_pipelined(
    n: usize,
    r: usize,
    count: usize,
    slice: usize,
    avg: bool,
) -> Schedule {
    if n == 1 || ring_pieces(n, count, slice) <= 1 {
        return allreduce_ring(n, r, count, avg);
    }
    in_pieces(n, count, slice, |len| allreduce_ring(n, r, len, avg))
}

/// The pieces of [`ring_pieces`] in turn: `piece(len)` is the schedule of one piece of `len`
/// elements, its spans moved to where the piece lies.
pub(super) fn in_pieces(
    n: usize,
    count: usize,
    slice: usize,
    piece: impl Fn(usize) -> Schedule,
) -> Schedule {
    let pieces = ring_pieces(n, count, slice);
    let mut s = Schedule::default();
    for k in 0..pieces {
        let lo = count * k / pieces;
        let hi = count * (k + 1) / pieces;
        let sub = piece(hi - lo);
        s.scratch = s.scratch.max(sub.scratch);
        for mut step in sub.steps {
            for op in &mut step.ops {
                op.shift(lo);
            }
            s.steps.push(step);
        }
    }
    s
}

/// ReduceScatter by ring: `Input` holds n * count elements, `Output` receives rank r's count.
/// In place the partial sums live in the input itself (the result lands at `r * count`,
/// where the output is); out of place in two scratch slots of one chunk, and the last
/// reduction lands straight in the output.
pub fn reduce_scatter_ring(
    n: usize,
    r: usize,
    count: usize,
    avg: bool,
    in_place: bool,
) -> Schedule {
    let chunks: Vec<Range<usize>> = (0..n).map(|k| k * count..(k + 1) * count).collect();
    let out = Span::of(Buf::Output, 0..count);
    let mut s = Schedule {
        scratch: if in_place || n < 3 { 0 } else { 2 * count },
        ..Schedule::default()
    };
    if n > 1 {
        let rs = RingRs {
            acc: Buf::Input,
            slot: if in_place {
                input_slot
            } else {
                alternating_slot
            },
            last: out,
        };
        ring_reduce_scatter_steps(&mut s, n, r, &chunks, &rs);
    } else {
        s.step().push(Op::Copy {
            src: Span::of(Buf::Input, chunks[r].clone()),
            dst: out,
        });
    }
    finish_avg(&mut s, avg, out);
    s
}

/// AllGather by ring: `Input` holds count elements, `Output` n * count.
pub fn all_gather_ring(n: usize, r: usize, count: usize) -> Schedule {
    let chunks: Vec<Range<usize>> = (0..n).map(|k| k * count..(k + 1) * count).collect();
    let mut s = Schedule::default();
    s.step().push(Op::Copy {
        src: Span::of(Buf::Input, 0..count),
        dst: Span::of(Buf::Output, chunks[r].clone()),
    });
    if n > 1 {
        ring_all_gather_steps(&mut s, n, r, &chunks, Buf::Output);
    }
    s
}
