//! Schedules: a collective as plain data. For each rank, a list of steps; each step runs its
//! local operations in order, then all of its sends and receives concurrently, to completion.
//! Offsets and lengths count elements. The executor (`exec`) runs a schedule over real
//! transports; the simulator ([`crate::sim`]) runs every rank's schedule in memory, which is
//! how the property tests check each algorithm without a network and how the fabric planner
//! can replay the same steps.

use std::ops::Range;

/// The buffer a span lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// The send buffer (read-only out of place; in place, the part of the user's buffer that
    /// holds this rank's contribution).
    Input,
    /// The receive buffer.
    Output,
    /// Scratch space the executor allocates ([`Schedule::scratch`] elements).
    Scratch,
    /// The send buffer of a point-to-point group's `i`-th send (bytes).
    SendPart(u16),
    /// The receive buffer of a point-to-point group's `i`-th receive (bytes).
    RecvPart(u16),
}

/// `len` elements at `off` in `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Which buffer.
    pub buf: Buf,
    /// First element.
    pub off: usize,
    /// Elements.
    pub len: usize,
}

impl Span {
    /// `buf[r]`.
    pub fn of(buf: Buf, r: Range<usize>) -> Self {
        Self {
            buf,
            off: r.start,
            len: r.end - r.start,
        }
    }
    /// One past the last element.
    pub fn end(&self) -> usize {
        self.off + self.len
    }
}

/// One operation of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sends `src` to `peer` (one message).
    Send {
        /// Destination rank.
        peer: usize,
        /// What to send.
        src: Span,
    },
    /// Receives one message of `dst.len` elements from `peer` into `dst`, or, with `reduce`,
    /// combines it into `dst` (`dst = dst op incoming`).
    Recv {
        /// Source rank.
        peer: usize,
        /// Where it lands.
        dst: Span,
        /// Reduce instead of copy.
        reduce: bool,
    },
    /// Receives one message of `dst.len` elements from `peer` and reduces it with `acc` into
    /// `dst` (`dst = acc op incoming`): the first touch of a chunk, which spares copying the
    /// input to the output beforehand. `acc` may be `dst` itself.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// The local operand.
        acc: Span,
        /// Where the result lands.
        dst: Span,
    },
    /// Local copy (a no-op when both spans are the same memory).
    Copy {
        /// From.
        src: Span,
        /// To.
        dst: Span,
    },
    /// Local reduction `dst = dst op src`.
    Reduce {
        /// Operand.
        src: Span,
        /// Accumulator.
        dst: Span,
    },
    /// Divides `dst` by the rank count (the end of an average).
    Divide {
        /// The span.
        dst: Span,
    },
}

impl Op {
    /// Moves every input and output span `by` elements (scratch spans stay).
    fn shift(&mut self, by: usize) {
        let mv = |sp: &mut Span| {
            if sp.buf != Buf::Scratch {
                sp.off += by;
            }
        };
        match self {
            Self::Send { src, .. } => mv(src),
            Self::Recv { dst, .. } | Self::Divide { dst } => mv(dst),
            Self::RecvReduce { acc, dst, .. } => {
                mv(acc);
                mv(dst);
            }
            Self::Copy { src, dst } | Self::Reduce { src, dst } => {
                mv(src);
                mv(dst);
            }
        }
    }
}

/// Local operations, then communication.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// The operations.
    pub ops: Vec<Op>,
}

/// One rank's part of a collective.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// In order.
    pub steps: Vec<Step>,
    /// Scratch elements needed.
    pub scratch: usize,
}

impl Schedule {
    fn step(&mut self) -> &mut Vec<Op> {
        self.steps.push(Step::default());
        &mut self.steps.last_mut().expect("pushed").ops
    }
    /// The ranks this schedule sends to or receives from, ascending.
    pub fn peers(&self) -> Vec<usize> {
        let mut p: Vec<usize> = self
            .steps
            .iter()
            .flat_map(|s| s.ops.iter())
            .filter_map(|o| match o {
                Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    Some(*peer)
                }
                _ => None,
            })
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    }
    /// Renames the ranks this schedule talks to: rank `p` becomes `order[p]`. A schedule
    /// built for position `k` of a ring or tree, relabeled with `order`, is rank
    /// `order[k]`'s part of the same algorithm run over the ranks in that order.
    pub fn relabel(&mut self, order: &[usize]) {
        for op in self.steps.iter_mut().flat_map(|s| s.ops.iter_mut()) {
            match op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    *peer = order[*peer];
                }
                Op::Copy { .. } | Op::Reduce { .. } | Op::Divide { .. } => {}
            }
        }
    }
    /// Elements this rank sends in total.
    pub fn sent_elems(&self) -> usize {
        self.steps
            .iter()
            .flat_map(|s| s.ops.iter())
            .map(|o| match o {
                Op::Send { src, .. } => src.len,
                _ => 0,
            })
            .sum()
    }
}

/// `count` elements split into `parts` ranges as evenly as possible (the first
/// `count % parts` ranges one element longer).
pub fn split(count: usize, parts: usize) -> Vec<Range<usize>> {
    let base = count / parts;
    let extra = count % parts;
    let mut out = Vec::with_capacity(parts);
    let mut at = 0;
    for i in 0..parts {
        let len = base + usize::from(i < extra);
        out.push(at..at + len);
        at += len;
    }
    out
}

fn modn(x: isize, n: usize) -> usize {
    x.rem_euclid(n as isize) as usize
}

/// Where a ring reduce-scatter reads and writes.
struct RingRs {
    /// Where chunk c's own contribution is (the input).
    acc: Buf,
    /// Where the partial sum of chunk c received at step k waits to be sent at step k+1:
    /// `slot(k, chunks, c)`.
    slot: fn(usize, &[Range<usize>], usize) -> Span,
    /// Where chunk r, the finished one, lands.
    last: Span,
}

/// Ring reduce-scatter (NCCL's ring): over n-1 steps rank r sends chunk r-1-s and receives
/// and reduces chunk r-2-s; after the last step the full reduction of chunk r is at
/// `rs.last`. Every receive reduces the incoming partial sum with this rank's own input
/// (`RecvReduce`), so nothing is copied beforehand; step 0 sends straight from the input.
fn ring_reduce_scatter_steps(
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
fn output_slot(_step: usize, chunks: &[Range<usize>], c: usize) -> Span {
    Span::of(Buf::Output, chunks[c].clone())
}

/// Chunk c of `Input`, at its own offset (in-place ReduceScatter works on the input).
fn input_slot(_step: usize, chunks: &[Range<usize>], c: usize) -> Span {
    Span::of(Buf::Input, chunks[c].clone())
}

/// Two scratch slots of one chunk each, alternating by step: a partial sum received at step
/// k is sent at step k+1 while step k+1 receives into the other slot.
fn alternating_slot(step: usize, chunks: &[Range<usize>], c: usize) -> Span {
    let len = chunks[c].len();
    Span {
        buf: Buf::Scratch,
        off: (step % 2) * len,
        len,
    }
}

/// Ring all-gather over `buf`, where rank r starts with chunk r: sends chunk r-s at step s and
/// receives chunk r-1-s.
fn ring_all_gather_steps(s: &mut Schedule, n: usize, r: usize, chunks: &[Range<usize>], buf: Buf) {
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

fn finish_avg(s: &mut Schedule, avg: bool, dst: Span) {
    if avg && dst.len > 0 {
        s.step().push(Op::Divide { dst });
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
fn in_pieces(n: usize, count: usize, slice: usize, piece: impl Fn(usize) -> Schedule) -> Schedule {
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

/// AllReduce across hosts, hierarchical (NCCL's tree and CollNet idea on rings): the ranks
/// sit host by host, `per_host` on each (positions `h * per_host ..`); each host first
/// reduce-scatters the vector over its own ranks (a ring inside the host), then the ranks
/// holding the same part on every host all-reduce it with a ring between the hosts, then
/// each host all-gathers the parts over its own ranks. A host sends `2 (H-1)/H` of the
/// vector between hosts (H hosts), where a flat ring sends `2 (n-1)/n` of it over each
/// crossing hop; inside a host each rank sends `2 (L-1)/L` of it (L ranks a host), more than
/// the flat ring's hops inside a host carry. Pipelined in pieces as
/// [`allreduce_ring_pipelined`]. With `per_host` 0, 1, `n` or not dividing `n` there is no
/// hierarchy and this is that ring.
pub fn allreduce_hier(
    n: usize,
    r: usize,
    count: usize,
    slice: usize,
    avg: bool,
    per_host: usize,
) -> Schedule {
    if per_host == 0 || n % per_host != 0 || per_host == n || per_host == 1 {
        return allreduce_ring_pipelined(n, r, count, slice, avg);
    }
    in_pieces(n, count, slice, |len| {
        hier_piece(n / per_host, per_host, r, len, avg)
    })
}

/// One piece of [`allreduce_hier`]: `hosts` hosts of `local` ranks, position `p`.
fn hier_piece(hosts: usize, local: usize, p: usize, count: usize, avg: bool) -> Schedule {
    let (h, l) = (p / local, p % local);
    let mut s = Schedule::default();
    // Steps built among `m` ranks, numbered 0..m, then put at their positions.
    let append = |s: &mut Schedule, mut t: Schedule, at: &[usize]| {
        t.relabel(at);
        s.steps.append(&mut t.steps);
    };
    let in_host: Vec<usize> = (0..local).map(|i| h * local + i).collect();
    let across: Vec<usize> = (0..hosts).map(|j| j * local + l).collect();
    // Inside the host: chunk l of the vector, reduced over the host, lands in Output.
    let chunks = split(count, local);
    let mut t = Schedule::default();
    ring_reduce_scatter_steps(
        &mut t,
        local,
        l,
        &chunks,
        &RingRs {
            acc: Buf::Input,
            slot: output_slot,
            last: Span::of(Buf::Output, chunks[l].clone()),
        },
    );
    append(&mut s, t, &in_host);
    // Between hosts: a ring all-reduce of chunk l, in place in Output.
    let mine = &chunks[l];
    let parts: Vec<Range<usize>> = split(mine.len(), hosts)
        .into_iter()
        .map(|x| x.start + mine.start..x.end + mine.start)
        .collect();
    let mut t = Schedule::default();
    ring_reduce_scatter_steps(
        &mut t,
        hosts,
        h,
        &parts,
        &RingRs {
            acc: Buf::Output,
            slot: output_slot,
            last: Span::of(Buf::Output, parts[h].clone()),
        },
    );
    finish_avg(&mut t, avg, Span::of(Buf::Output, parts[h].clone()));
    ring_all_gather_steps(&mut t, hosts, h, &parts, Buf::Output);
    append(&mut s, t, &across);
    // Inside the host again: every chunk to every rank.
    let mut t = Schedule::default();
    ring_all_gather_steps(&mut t, local, l, &chunks, Buf::Output);
    append(&mut s, t, &in_host);
    s
}

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

/// How `n` ranks fold onto a power of two for the recursive algorithms (MPICH's scheme):
/// with `pow` the largest power of two <= n and `rem = n - pow`, each even rank below
/// `2 rem` hands its vector to the odd rank above it and sits out; the others take part
/// as rank `folded`.
struct Fold {
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
fn folded_allreduce(
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

/// A binary tree over ranks in heap order of positions: position p has children 2p+1 and
/// 2p+2; `mirror` numbers positions from the last rank down, so the ranks that are leaves in
/// one tree are interior in the other (NCCL's double binary tree).
#[derive(Clone, Copy)]
struct HeapTree {
    n: usize,
    mirror: bool,
}

impl HeapTree {
    fn rank(&self, pos: usize) -> usize {
        if self.mirror { self.n - 1 - pos } else { pos }
    }
    fn pos(&self, rank: usize) -> usize {
        if self.mirror { self.n - 1 - rank } else { rank }
    }
    fn parent(&self, r: usize) -> Option<usize> {
        let p = self.pos(r);
        (p > 0).then(|| self.rank((p - 1) / 2))
    }
    fn children(&self, r: usize) -> Vec<usize> {
        let p = self.pos(r);
        [2 * p + 1, 2 * p + 2]
            .into_iter()
            .filter(|&c| c < self.n)
            .map(|c| self.rank(c))
            .collect()
    }
    fn depth(&self, r: usize) -> usize {
        (self.pos(r) + 1).ilog2() as usize
    }
}

/// Rank r's part of a pipelined reduce up `tree` then broadcast down it, over `range` of the
/// vector in slices, written into `steps` (grown as needed). Slice k leaves a node at depth d
/// for its parent at step k + D - d (D the tree's depth), once both children's copies are in:
/// the first reduced straight into `Output` with the input, the second landed in scratch and
/// reduced at the next step, so the order of reduction is fixed. The root's result for slice
/// k goes down at step k + D, reaching depth d at step k + D + d - 1.
fn tree_allreduce_steps(
    steps: &mut Vec<Vec<Op>>,
    tree: HeapTree,
    r: usize,
    range: Range<usize>,
    slice: usize,
) {
    let big_d = tree.depth(tree.rank(tree.n - 1));
    let d = tree.depth(r);
    let kids = tree.children(r);
    let parent = tree.parent(r);
    let at = |steps: &mut Vec<Vec<Op>>, t: usize| -> usize {
        if steps.len() <= t {
            steps.resize_with(t + 1, Vec::new);
        }
        t
    };
    for (k, sl) in split_slices(range.len(), slice).into_iter().enumerate() {
        let sl = range.start + sl.start..range.start + sl.end;
        let out = Span::of(Buf::Output, sl.clone());
        let input = Span::of(Buf::Input, sl.clone());
        let up = k + big_d - d;
        // Children's copies arrive the step before this node sends up (or, at the root,
        // before it sends down).
        let ready = match kids.as_slice() {
            [] => {
                let t = at(steps, up);
                steps[t].push(match parent {
                    Some(p) => Op::Send {
                        peer: p,
                        src: input,
                    },
                    None => Op::Copy {
                        src: input,
                        dst: out,
                    },
                });
                out
            }
            [a, rest @ ..] => {
                let t = at(steps, up - 1);
                steps[t].push(Op::RecvReduce {
                    peer: *a,
                    acc: input,
                    dst: out,
                });
                if let [b] = rest {
                    let staged = Span::of(Buf::Scratch, sl.clone());
                    steps[t].push(Op::Recv {
                        peer: *b,
                        dst: staged,
                        reduce: false,
                    });
                    let t = at(steps, up);
                    steps[t].push(Op::Reduce {
                        src: staged,
                        dst: out,
                    });
                }
                if let Some(p) = parent {
                    let t = at(steps, up);
                    steps[t].push(Op::Send { peer: p, src: out });
                }
                out
            }
        };
        // Down: from the parent at k + D + d - 1, to the children at k + D + d.
        if let Some(p) = parent {
            let t = at(steps, k + big_d + d - 1);
            steps[t].push(Op::Recv {
                peer: p,
                dst: ready,
                reduce: false,
            });
        }
        for &c in &kids {
            let t = at(steps, k + big_d + d);
            steps[t].push(Op::Send {
                peer: c,
                src: ready,
            });
        }
    }
}

/// AllReduce over a double binary tree (NCCL's tree): each half of the vector is reduced up
/// one of two binary trees and broadcast back down it, pipelined in slices of `slice`
/// elements; a rank that is a leaf of one tree is interior in the other, so both halves keep
/// every rank busy. log2 n latency, about the data of a ring.
pub fn allreduce_tree(n: usize, r: usize, count: usize, slice: usize, avg: bool) -> Schedule {
    let all = Span::of(Buf::Output, 0..count);
    let mut s = Schedule {
        scratch: count,
        ..Schedule::default()
    };
    if n == 1 || count == 0 {
        s.step().push(Op::Copy {
            src: Span::of(Buf::Input, 0..count),
            dst: all,
        });
        finish_avg(&mut s, avg, all);
        return s;
    }
    let half = count / 2;
    let mut steps: Vec<Vec<Op>> = Vec::new();
    for (tree, range) in [
        (HeapTree { n, mirror: false }, 0..half),
        (HeapTree { n, mirror: true }, half..count),
    ] {
        if !range.is_empty() {
            tree_allreduce_steps(&mut steps, tree, r, range, slice);
        }
    }
    s.steps = steps
        .into_iter()
        .filter(|ops| !ops.is_empty())
        .map(|ops| Step { ops })
        .collect();
    finish_avg(&mut s, avg, all);
    s
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
fn gather_then_reduce(
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
fn collect_slots(
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
fn reduce_slots(s: &mut Schedule, n: usize, dst: Span, avg: bool) {
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

/// Position of rank r on a chain that starts at `root` and runs up the ring.
fn chain_pos(n: usize, r: usize, root: usize) -> usize {
    (r + n - root) % n
}

/// Broadcast down a pipelined chain root -> root+1 -> ... in slices of `slice` elements:
/// a rank forwards slice k while it receives slice k+1.
pub fn broadcast_chain(n: usize, r: usize, count: usize, root: usize, slice: usize) -> Schedule {
    let mut s = Schedule::default();
    if r == root {
        s.step().push(Op::Copy {
            src: Span::of(Buf::Input, 0..count),
            dst: Span::of(Buf::Output, 0..count),
        });
    }
    if n == 1 || count == 0 {
        return s;
    }
    let slices = split_slices(count, slice);
    let m = slices.len();
    let p = chain_pos(n, r, root);
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    // Rank at position p receives slice k at step k + p - 1 and sends it at step k + p.
    for t in 0..m + n - 2 {
        let mut ops = Vec::new();
        if p + 1 < n && t >= p && t - p < m {
            ops.push(Op::Send {
                peer: next,
                src: Span::of(Buf::Output, slices[t - p].clone()),
            });
        }
        if p > 0 && t + 1 >= p && t + 1 - p < m {
            ops.push(Op::Recv {
                peer: prev,
                dst: Span::of(Buf::Output, slices[t + 1 - p].clone()),
                reduce: false,
            });
        }
        if !ops.is_empty() {
            s.steps.push(Step { ops });
        }
    }
    s
}

/// Reduce up a pipelined chain that ends at `root` (root+1 -> root+2 -> ... -> root), in
/// slices: each rank adds its input to the partial result from the previous rank and passes
/// it on. The reduction order is fixed (chain order). Non-roots accumulate in scratch.
pub fn reduce_chain(
    n: usize,
    r: usize,
    count: usize,
    root: usize,
    slice: usize,
    avg: bool,
) -> Schedule {
    let at_root = r == root;
    let work = if at_root { Buf::Output } else { Buf::Scratch };
    let mut s = Schedule {
        scratch: if at_root { 0 } else { count },
        ..Schedule::default()
    };
    s.step().push(Op::Copy {
        src: Span::of(Buf::Input, 0..count),
        dst: Span::of(work, 0..count),
    });
    if n > 1 && count > 0 {
        let slices = split_slices(count, slice);
        let m = slices.len();
        // Position 0 is root+1 (the chain's start), n-1 is the root.
        let p = (r + n - root - 1) % n;
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        for t in 0..m + n - 2 {
            let mut ops = Vec::new();
            if p + 1 < n && t >= p && t - p < m {
                ops.push(Op::Send {
                    peer: next,
                    src: Span::of(work, slices[t - p].clone()),
                });
            }
            if p > 0 && t + 1 >= p && t + 1 - p < m {
                ops.push(Op::Recv {
                    peer: prev,
                    dst: Span::of(work, slices[t + 1 - p].clone()),
                    reduce: true,
                });
            }
            if !ops.is_empty() {
                s.steps.push(Step { ops });
            }
        }
    }
    if at_root {
        finish_avg(&mut s, avg, Span::of(Buf::Output, 0..count));
    }
    s
}

/// Checks a schedule's own consistency: no span outside its buffer's `sizes` (input,
/// output, scratch, in elements), and no step that receives into elements it also sends.
/// `in_place` gives the element offsets of the input and the output inside the one user
/// buffer of an in-place call, where `Input` and `Output` spans can be the same memory.
pub fn validate(
    s: &Schedule,
    sizes: [usize; 3],
    in_place: Option<(usize, usize)>,
) -> Result<(), String> {
    // A span's memory: (which allocation, first element, end).
    let mem = |sp: &Span| -> (u32, usize, usize) {
        match (sp.buf, in_place) {
            (Buf::SendPart(i), _) => (3 + 2 * u32::from(i), sp.off, sp.end()),
            (Buf::RecvPart(i), _) => (4 + 2 * u32::from(i), sp.off, sp.end()),
            (Buf::Input, Some((io, _))) => (1, io + sp.off, io + sp.end()),
            (Buf::Output, Some((_, oo))) => (1, oo + sp.off, oo + sp.end()),
            (Buf::Input, None) => (0, sp.off, sp.end()),
            (Buf::Output, None) => (1, sp.off, sp.end()),
            (Buf::Scratch, _) => (2, sp.off, sp.end()),
        }
    };
    let size = |b: Buf| match b {
        Buf::Input => sizes[0],
        Buf::Output => sizes[1],
        Buf::Scratch => sizes[2].max(s.scratch),
        // Point-to-point groups are sized by their caller's buffers.
        Buf::SendPart(_) | Buf::RecvPart(_) => usize::MAX,
    };
    for (i, st) in s.steps.iter().enumerate() {
        let spans = st.ops.iter().flat_map(|o| match o {
            Op::Send { src, .. } => vec![*src],
            Op::Recv { dst, .. } | Op::Divide { dst } => vec![*dst],
            Op::Copy { src, dst } | Op::Reduce { src, dst } => vec![*src, *dst],
            Op::RecvReduce { acc, dst, .. } => vec![*acc, *dst],
        });
        for sp in spans {
            if sp.len > 0 && sp.end() > size(sp.buf) {
                return Err(format!("step {i}: {sp:?} outside its buffer"));
            }
        }
        for a in &st.ops {
            let (Op::Recv { dst, .. } | Op::RecvReduce { dst, .. }) = a else {
                continue;
            };
            for b in &st.ops {
                if let Op::Send { src, .. } = b {
                    let (a, b) = (mem(dst), mem(src));
                    if dst.len > 0 && src.len > 0 && a.0 == b.0 && b.1 < a.2 && a.1 < b.2 {
                        return Err(format!(
                            "step {i}: receives into {dst:?} while sending {src:?}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn split_slices(count: usize, slice: usize) -> Vec<Range<usize>> {
    let slice = slice.max(1);
    (0..count.div_ceil(slice))
        .map(|k| k * slice..((k + 1) * slice).min(count))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_even_and_covers() {
        assert_eq!(split(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(split(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
    }

    #[test]
    fn ring_sends_2_n_minus_1_over_n() {
        let s = allreduce_ring(4, 1, 400, false);
        assert_eq!(s.sent_elems(), 600);
        assert_eq!(s.peers(), vec![0, 2]);
        assert_eq!(allreduce_deterministic(4, 1, 400, false).sent_elems(), 600);
    }
}
