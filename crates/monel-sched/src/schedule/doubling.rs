//! Recursive doubling and halving-doubling AllReduce, with non-powers of two folded in.

use super::*;

/// How `n` ranks fold onto a power of two for the recursive algorithms (MPICH's scheme):
/// with `pow` the largest power of two <= n and `rem = n - pow`, each even rank below
/// `2 rem` hands its vector to the odd rank above it and sits out; the others take part
/// as rank `folded`.
pub(super) struct Fold {
    pow: usize,
    rem: usize,
}

impl Fold {
    fn new(n: usize) -> Self {
        let pow = if n == 0 { 1 } else { 1 << n.ilog2() };
        Self { pow, rem: n - pow }
    }
    /// Rank r's place among the `pow` participants, or None if it sits out.
    fn folded(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem {
            (r % 2 == 1).then_some(r / 2)
        } else {
            Some(r - self.rem)
        }
    }
    /// The rank that has place `f`.
    fn unfold(&self, f: usize) -> usize {
        if f < self.rem {
            2 * f + 1
        } else {
            f + self.rem
        }
    }
}

/// The parts of a folded AllReduce around its core: the first step (stage the input in
/// `Output`; a rank that sits out sends it to its partner, which receives it into scratch)
/// and the end (averaging, and the result back to the rank that sat out). `core` adds the
/// participants' steps; it finds a partner's vector, if any, waiting in scratch 0..count to
/// be reduced into `Output` first.
pub(super) fn folded_allreduce(
    n: usize,
    r: usize,
    count: usize,
    avg: bool,
    core: impl FnOnce(&mut Schedule, &Fold, usize, bool),
) -> Schedule {
    let all = Span::of(Buf::Output, 0..count);
    let fold = Fold::new(n);
    let mut s = Schedule {
        scratch: count,
        ..Schedule::default()
    };
    s.step().push(Op::Copy {
        src: Span::of(Buf::Input, 0..count),
        dst: all,
    });
    if n == 1 || count == 0 {
        finish_avg(&mut s, avg, all);
        return s;
    }
    let Some(f) = fold.folded(r) else {
        // Sits out: hands its vector over, gets the result back.
        let ops = &mut s.steps[0].ops;
        ops.push(Op::Send {
            peer: r + 1,
            src: all,
        });
        s.step().push(Op::Recv {
            peer: r + 1,
            dst: all,
            reduce: false,
        });
        return s;
    };
    let partner = r < 2 * fold.rem;
    if partner {
        s.steps[0].ops.push(Op::Recv {
            peer: r - 1,
            dst: Span::of(Buf::Scratch, 0..count),
            reduce: false,
        });
    }
    core(&mut s, &fold, f, partner);
    finish_avg(&mut s, avg, all);
    if partner {
        s.step().push(Op::Send {
            peer: r - 1,
            src: all,
        });
    }
    s
}

/// AllReduce by recursive doubling: log2 n steps, each exchanging the whole vector with the
/// rank whose number differs in one bit and reducing it in (small messages: the fewest
/// steps, n log n data). Ranks beyond a power of two fold in first (`Fold`).
pub fn allreduce_doubling(n: usize, r: usize, count: usize, avg: bool) -> Schedule {
    folded_allreduce(n, r, count, avg, |s, fold, f, partner| {
        let all = Span::of(Buf::Output, 0..count);
        let incoming = Span::of(Buf::Scratch, 0..count);
        let mut pending = partner;
        let mut d = 1;
        while d < fold.pow {
            let peer = fold.unfold(f ^ d);
            let ops = s.step();
            if pending {
                ops.push(Op::Reduce {
                    src: incoming,
                    dst: all,
                });
            }
            ops.push(Op::Send { peer, src: all });
            ops.push(Op::Recv {
                peer,
                dst: incoming,
                reduce: false,
            });
            pending = true;
            d *= 2;
        }
        if pending {
            s.step().push(Op::Reduce {
                src: incoming,
                dst: all,
            });
        }
    })
}

/// AllReduce by recursive halving then doubling (Rabenseifner): a reduce-scatter that
/// halves the vector each step (the rank keeps the half its bit selects and reduces the
/// partner's copy of it straight in), then an all-gather that doubles it back: 2 log2 n
/// steps sending 2 (n-1)/n of the data, as the ring does in 2 (n-1) steps. Ranks beyond a
/// power of two fold in first (`Fold`).
pub fn allreduce_halving(n: usize, r: usize, count: usize, avg: bool) -> Schedule {
    folded_allreduce(n, r, count, avg, |s, fold, f, partner| {
        let p = fold.pow;
        let chunks = split(count, p);
        let block = |start: usize, len: usize| {
            Span::of(
                Buf::Output,
                chunks[start].start..chunks[start + len - 1].end,
            )
        };
        if partner {
            s.step().push(Op::Reduce {
                src: Span::of(Buf::Scratch, 0..count),
                dst: Span::of(Buf::Output, 0..count),
            });
        }
        // Reduce-scatter: at distance d the rank holds blocks [lo, lo + 2d) and keeps the
        // half its bit d selects.
        let mut lo = 0;
        let mut d = p / 2;
        while d >= 1 {
            let peer = fold.unfold(f ^ d);
            let (keep, give) = if f & d == 0 {
                (lo, lo + d)
            } else {
                (lo + d, lo)
            };
            let ops = s.step();
            let give = block(give, d);
            if give.len > 0 {
                ops.push(Op::Send { peer, src: give });
            }
            let keep_span = block(keep, d);
            if keep_span.len > 0 {
                ops.push(Op::RecvReduce {
                    peer,
                    acc: keep_span,
                    dst: keep_span,
                });
            }
            lo = keep;
            d /= 2;
        }
        // All-gather: the rank holds block f; at distance d it trades its d blocks for the
        // partner's.
        let mut d = 1;
        while d < p {
            let peer = fold.unfold(f ^ d);
            let mine = f - f % d;
            let theirs = (f ^ d) - (f ^ d) % d;
            let ops = s.step();
            let (m, t) = (block(mine, d), block(theirs, d));
            if m.len > 0 {
                ops.push(Op::Send { peer, src: m });
            }
            if t.len > 0 {
                ops.push(Op::Recv {
                    peer,
                    dst: t,
                    reduce: false,
                });
            }
            d *= 2;
        }
    })
}
