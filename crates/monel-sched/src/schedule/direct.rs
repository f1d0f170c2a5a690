//! Direct algorithms: every rank exchanges with every other in one step (small messages,
//! gathers, scatters, all-to-all, the barrier), and the deterministic AllReduce.

use std::ops::Range;

use super::*;

/// AllReduce, direct: every rank sends its whole input to every other and reduces all n
/// vectors in rank order. One step of latency, n-1 times the data: for tiny counts.
/// Bitwise deterministic across runs. Two ranks each reduce the other's vector straight into
/// their own (`mine op theirs`: the same bits on both for every operation but min and max
/// of NaNs and signed zeros, as with the ring).
/// In place, the input is staged in scratch first (the result overwrites it while it is
/// still being sent).
pub fn allreduce_direct(n: usize, r: usize, count: usize, avg: bool, in_place: bool) -> Schedule {
    if n == 2 {
        let all = Span::of(Buf::Output, 0..count);
        let mut s = Schedule {
            scratch: if in_place { count } else { 0 },
            ..Schedule::default()
        };
        let ops = s.step();
        let mut mine = Span::of(Buf::Input, 0..count);
        if in_place {
            let staged = Span::of(Buf::Scratch, 0..count);
            ops.push(Op::Copy {
                src: mine,
                dst: staged,
            });
            mine = staged;
        }
        ops.push(Op::Send {
            peer: 1 - r,
            src: mine,
        });
        ops.push(Op::RecvReduce {
            peer: 1 - r,
            acc: mine,
            dst: all,
        });
        finish_avg(&mut s, avg, all);
        return s;
    }
    let all: Vec<Range<usize>> = vec![0..count; n];
    gather_then_reduce(n, r, &all, 0, avg)
}

/// AllReduce with a fixed reduction order: rank k gathers chunk k from every rank and reduces
/// the n contributions in rank order (0, 1, ..., n-1), then a ring all-gather. The bits of
/// the result depend only on the inputs and n, never on timing or on the size-based choice of
/// algorithm. Sends the same bytes as the ring.
pub fn allreduce_deterministic(n: usize, r: usize, count: usize, avg: bool) -> Schedule {
    let chunks = split(count, n);
    let mut s = gather_then_reduce(n, r, &chunks, chunks[r].start, avg);
    if n > 1 {
        ring_all_gather_steps(&mut s, n, r, &chunks, Buf::Output);
    }
    s
}

/// Every rank p sends `want[q]` of its input to rank q; each rank reduces the n copies of
/// its own `want[r]` in rank order into `Output` at `out`. Scratch holds the n copies (this
/// rank's own staged first, so in place the input is read before it is overwritten).
pub(super) fn gather_then_reduce(
    n: usize,
    r: usize,
    want: &[Range<usize>],
    out: usize,
    avg: bool,
) -> Schedule {
    let sends: Vec<(usize, Range<usize>)> = (0..n)
        .filter(|&p| p != r)
        .map(|p| (p, want[p].clone()))
        .collect();
    let len = want[r].len();
    let mut s = collect_slots(n, r, want[r].clone(), &sends);
    reduce_slots(
        &mut s,
        n,
        Span {
            buf: Buf::Output,
            off: out,
            len,
        },
        avg,
    );
    s
}

/// One step that stages this rank's `own` elements of the input in scratch slot r, makes
/// `sends` (peer, input range), and receives every other rank's contribution into its slot
/// (slot p at `p * own.len()`).
pub(super) fn collect_slots(
    n: usize,
    r: usize,
    own: Range<usize>,
    sends: &[(usize, Range<usize>)],
) -> Schedule {
    let len = own.len();
    let slot = |p: usize| Span {
        buf: Buf::Scratch,
        off: p * len,
        len,
    };
    let mut s = Schedule {
        scratch: n * len,
        ..Schedule::default()
    };
    let ops = s.step();
    ops.push(Op::Copy {
        src: Span::of(Buf::Input, own),
        dst: slot(r),
    });
    for (peer, range) in sends {
        ops.push(Op::Send {
            peer: *peer,
            src: Span::of(Buf::Input, range.clone()),
        });
    }
    for p in (0..n).filter(|&p| p != r) {
        ops.push(Op::Recv {
            peer: p,
            dst: slot(p),
            reduce: false,
        });
    }
    s
}

/// A step that reduces the n scratch slots (slot p at `p * dst.len`) in rank order into `dst`.
pub(super) fn reduce_slots(s: &mut Schedule, n: usize, dst: Span, avg: bool) {
    let slot = |p: usize| Span {
        buf: Buf::Scratch,
        off: p * dst.len,
        len: dst.len,
    };
    let ops = s.step();
    ops.push(Op::Copy { src: slot(0), dst });
    for p in 1..n {
        ops.push(Op::Reduce { src: slot(p), dst });
    }
    finish_avg(s, avg, dst);
}

/// ReduceScatter, direct: rank r receives block r from every rank and reduces the n copies
/// in rank order (deterministic).
pub fn reduce_scatter_direct(n: usize, r: usize, count: usize, avg: bool) -> Schedule {
    let blocks: Vec<Range<usize>> = (0..n).map(|k| k * count..(k + 1) * count).collect();
    gather_then_reduce(n, r, &blocks, 0, avg)
}

/// Reduce, direct: the root receives every input and reduces them in rank order.
pub fn reduce_direct(n: usize, r: usize, count: usize, root: usize, avg: bool) -> Schedule {
    if r != root {
        let mut s = Schedule::default();
        s.step().push(Op::Send {
            peer: root,
            src: Span::of(Buf::Input, 0..count),
        });
        return s;
    }
    let mut s = collect_slots(n, r, 0..count, &[]);
    reduce_slots(&mut s, n, Span::of(Buf::Output, 0..count), avg);
    s
}

/// Broadcast, direct: the root sends to every rank (one step; for small counts).
pub fn broadcast_direct(n: usize, r: usize, count: usize, root: usize) -> Schedule {
    let mut s = Schedule::default();
    let ops = s.step();
    if r == root {
        ops.push(Op::Copy {
            src: Span::of(Buf::Input, 0..count),
            dst: Span::of(Buf::Output, 0..count),
        });
        for p in (0..n).filter(|&p| p != root) {
            ops.push(Op::Send {
                peer: p,
                src: Span::of(Buf::Input, 0..count),
            });
        }
    } else {
        ops.push(Op::Recv {
            peer: root,
            dst: Span::of(Buf::Output, 0..count),
            reduce: false,
        });
    }
    s
}

/// AllGather, direct: every rank sends its input to every other (one step).
pub fn all_gather_direct(n: usize, r: usize, count: usize) -> Schedule {
    let blk = |k: usize| k * count..(k + 1) * count;
    let mut s = Schedule::default();
    let ops = s.step();
    ops.push(Op::Copy {
        src: Span::of(Buf::Input, 0..count),
        dst: Span::of(Buf::Output, blk(r)),
    });
    for p in (0..n).filter(|&p| p != r) {
        ops.push(Op::Send {
            peer: p,
            src: Span::of(Buf::Input, 0..count),
        });
        ops.push(Op::Recv {
            peer: p,
            dst: Span::of(Buf::Output, blk(p)),
            reduce: false,
        });
    }
    s
}

/// AlltoAll, direct: block j of the input (count elements) goes to rank j's output block r.
pub fn alltoall_direct(n: usize, r: usize, count: usize) -> Schedule {
    let blk = |k: usize| k * count..(k + 1) * count;
    let mut s = Schedule::default();
    let ops = s.step();
    ops.push(Op::Copy {
        src: Span::of(Buf::Input, blk(r)),
        dst: Span::of(Buf::Output, blk(r)),
    });
    // Pairwise order (r+k, r-k) spreads the load instead of every rank hitting rank 0 first.
    for k in 1..n {
        ops.push(Op::Send {
            peer: (r + k) % n,
            src: Span::of(Buf::Input, blk((r + k) % n)),
        });
        ops.push(Op::Recv {
            peer: (r + n - k) % n,
            dst: Span::of(Buf::Output, blk((r + n - k) % n)),
            reduce: false,
        });
    }
    s
}

/// Gather, direct: the root's output block k receives rank k's input.
pub fn gather_direct(n: usize, r: usize, count: usize, root: usize) -> Schedule {
    let mut s = Schedule::default();
    let ops = s.step();
    if r == root {
        ops.push(Op::Copy {
            src: Span::of(Buf::Input, 0..count),
            dst: Span::of(Buf::Output, root * count..(root + 1) * count),
        });
        for p in (0..n).filter(|&p| p != root) {
            ops.push(Op::Recv {
                peer: p,
                dst: Span::of(Buf::Output, p * count..(p + 1) * count),
                reduce: false,
            });
        }
    } else {
        ops.push(Op::Send {
            peer: root,
            src: Span::of(Buf::Input, 0..count),
        });
    }
    s
}

/// Scatter, direct: rank k's output receives the root's input block k.
pub fn scatter_direct(n: usize, r: usize, count: usize, root: usize) -> Schedule {
    let mut s = Schedule::default();
    let ops = s.step();
    if r == root {
        ops.push(Op::Copy {
            src: Span::of(Buf::Input, root * count..(root + 1) * count),
            dst: Span::of(Buf::Output, 0..count),
        });
        for p in (0..n).filter(|&p| p != root) {
            ops.push(Op::Send {
                peer: p,
                src: Span::of(Buf::Input, p * count..(p + 1) * count),
            });
        }
    } else {
        ops.push(Op::Recv {
            peer: root,
            dst: Span::of(Buf::Output, 0..count),
            reduce: false,
        });
    }
    s
}

/// Barrier: an empty message to and from every other rank.
pub fn barrier(n: usize, r: usize) -> Schedule {
    let mut s = Schedule::default();
    let ops = s.step();
    let none = Span {
        buf: Buf::Output,
        off: 0,
        len: 0,
    };
    for p in (0..n).filter(|&p| p != r) {
        ops.push(Op::Send { peer: p, src: none });
        ops.push(Op::Recv {
            peer: p,
            dst: none,
            reduce: false,
        });
    }
    s
}
