//! Trees and chains: the binary-tree AllReduce, and pipelined chain broadcast and reduce.

use std::ops::Range;

use super::*;

/// A binary tree over ranks in heap order of positions: position p has children 2p+1 and
/// 2p+2; `mirror` numbers positions from the last rank down, so the ranks that are leaves in
/// one tree are interior in the other (NCCL's double binary tree).
#[derive(Clone, Copy)]
pub(super) struct HeapTree {
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
pub(super) fn tree_allreduce_steps(
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

/// Position of rank r on a chain that starts at `root` and runs up the ring.
pub(super) fn chain_pos(n: usize, r: usize, root: usize) -> usize {
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
