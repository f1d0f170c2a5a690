//! Schedules: a collective as plain data. For each rank, a list of steps; each step runs its
//! local operations in order, then all of its sends and receives concurrently, to completion.
//! Offsets and lengths count elements. The executor (`exec`) runs a schedule over real
//! transports; the simulator ([`crate::sim`]) runs every rank's schedule in memory, which is
//! how the property tests check each algorithm without a network and how the fabric planner
//! can replay the same steps.

mod direct;
mod doubling;
mod hier;
mod ring;
mod tree;

use std::ops::Range;

pub use direct::*;
pub use doubling::*;
pub use hier::*;
pub use ring::*;
pub use tree::*;

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

fn finish_avg(s: &mut Schedule, avg: bool, dst: Span) {
    if avg && dst.len > 0 {
        s.step().push(Op::Divide { dst });
    }
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
