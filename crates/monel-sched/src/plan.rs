//! From a collective call to a schedule: which algorithms each collective has, the buffer
//! layout it needs (NCCL's, in-place conventions included) and the schedule for one rank.

use std::fmt;

use crate::dtype::{DataType, RedOp};
use crate::error::{Result, SchedError};
use crate::schedule::{self as sch, Schedule};

/// A collective operation with its arguments (other than buffers, count and type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// `ncclAllReduce`.
    AllReduce(RedOp),
    /// `ncclBroadcast` from a root.
    Broadcast(usize),
    /// `ncclReduce` to a root.
    Reduce(RedOp, usize),
    /// `ncclAllGather` (count = elements per rank).
    AllGather,
    /// `ncclReduceScatter` (count = elements per rank).
    ReduceScatter(RedOp),
    /// `ncclAlltoAll` (count = elements per pair).
    AllToAll,
    /// `ncclGather` to a root (count = elements per rank).
    Gather(usize),
    /// `ncclScatter` from a root (count = elements per rank).
    Scatter(usize),
    /// A barrier.
    Barrier,
}

/// A collective without its arguments: the one home of each collective's wire code, name
/// and spellings, shared by the frames, the logs, the CLI, the planner and Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclBroadcast`.
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
    /// A barrier.
    Barrier,
}

impl CollectiveKind {
    /// Every collective, in code order.
    pub const ALL: [Self; 9] = [
        Self::AllReduce,
        Self::Broadcast,
        Self::Reduce,
        Self::AllGather,
        Self::ReduceScatter,
        Self::AllToAll,
        Self::Gather,
        Self::Scatter,
        Self::Barrier,
    ];

    /// The wire code (stable: it is part of the collective frames and window signatures).
    pub const fn code(self) -> u8 {
        match self {
            Self::AllReduce => 1,
            Self::Broadcast => 2,
            Self::Reduce => 3,
            Self::AllGather => 4,
            Self::ReduceScatter => 5,
            Self::AllToAll => 6,
            Self::Gather => 7,
            Self::Scatter => 8,
            Self::Barrier => 9,
        }
    }

    /// The collective with wire code `code`, if any.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The name nccl-tests uses (`all_reduce`, `alltoall`, ...), as the logs and the CLI
    /// print it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllToAll => "alltoall",
            Self::Gather => "gather",
            Self::Scatter => "scatter",
            Self::Barrier => "barrier",
        }
    }

    /// Parses any common spelling: nccl-tests' (`all_reduce`, `alltoall`, `all_reduce_perf`),
    /// torch's (`all_to_all`), NCCL's (`AllReduce`), with `-`, `_` or nothing between words,
    /// in any case.
    pub fn parse(s: &str) -> Option<Self> {
        let key = squash(s.strip_suffix("_perf").unwrap_or(s));
        Self::ALL.into_iter().find(|k| squash(k.name()) == key)
    }

    /// The known name nearest to a misspelled `s` (for a "did you mean" hint), if any is
    /// close enough to be a plausible typo.
    pub fn nearest(s: &str) -> Option<Self> {
        let key = squash(s);
        Self::ALL
            .into_iter()
            .map(|k| (strsim::levenshtein(&key, &squash(k.name())), k))
            .filter(|&(d, _)| d <= 3)
            .min_by_key(|&(d, _)| d)
            .map(|(_, k)| k)
    }

    /// Whether the collective takes a reduction operator.
    pub const fn has_op(self) -> bool {
        matches!(self, Self::AllReduce | Self::Reduce | Self::ReduceScatter)
    }

    /// Whether the collective has a root.
    pub const fn has_root(self) -> bool {
        matches!(
            self,
            Self::Broadcast | Self::Reduce | Self::Gather | Self::Scatter
        )
    }

    /// The collective with its arguments (`op` and `root` are ignored where it has none).
    pub const fn with(self, op: RedOp, root: usize) -> Collective {
        match self {
            Self::AllReduce => Collective::AllReduce(op),
            Self::Broadcast => Collective::Broadcast(root),
            Self::Reduce => Collective::Reduce(op, root),
            Self::AllGather => Collective::AllGather,
            Self::ReduceScatter => Collective::ReduceScatter(op),
            Self::AllToAll => Collective::AllToAll,
            Self::Gather => Collective::Gather(root),
            Self::Scatter => Collective::Scatter(root),
            Self::Barrier => Collective::Barrier,
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Lower case, without `_`, `-` or spaces.
fn squash(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, '_' | '-' | ' '))
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl Collective {
    /// The collective without its arguments.
    pub const fn kind(self) -> CollectiveKind {
        match self {
            Self::AllReduce(_) => CollectiveKind::AllReduce,
            Self::Broadcast(_) => CollectiveKind::Broadcast,
            Self::Reduce(..) => CollectiveKind::Reduce,
            Self::AllGather => CollectiveKind::AllGather,
            Self::ReduceScatter(_) => CollectiveKind::ReduceScatter,
            Self::AllToAll => CollectiveKind::AllToAll,
            Self::Gather(_) => CollectiveKind::Gather,
            Self::Scatter(_) => CollectiveKind::Scatter,
            Self::Barrier => CollectiveKind::Barrier,
        }
    }
    /// The name nccl-tests uses ([`CollectiveKind::name`]).
    pub const fn name(self) -> &'static str {
        self.kind().name()
    }
    /// The wire code ([`CollectiveKind::code`]).
    pub const fn code(self) -> u8 {
        self.kind().code()
    }
    /// The root, for rooted collectives.
    pub const fn root(self) -> Option<usize> {
        match self {
            Self::Broadcast(r) | Self::Reduce(_, r) | Self::Gather(r) | Self::Scatter(r) => Some(r),
            _ => None,
        }
    }
    /// The reduction, for reducing collectives.
    pub const fn op(self) -> Option<RedOp> {
        match self {
            Self::AllReduce(o) | Self::Reduce(o, _) | Self::ReduceScatter(o) => Some(o),
            _ => None,
        }
    }
    /// (input, output) elements on rank `r` of `n` for `count`.
    pub fn sizes(self, n: usize, r: usize, count: usize) -> (usize, usize) {
        match self {
            Self::AllReduce(_) | Self::Broadcast(_) | Self::Reduce(..) => (count, count),
            Self::AllGather => (count, n * count),
            Self::ReduceScatter(_) => (n * count, count),
            Self::AllToAll => (n * count, n * count),
            Self::Gather(root) => (count, if r == root { n * count } else { 0 }),
            Self::Scatter(root) => (if r == root { n * count } else { 0 }, count),
            Self::Barrier => (0, 0),
        }
    }
    /// In place (NCCL's conventions): the single buffer's length and where the input and
    /// the output start in it, in elements; None if the collective has no in-place form.
    pub fn in_place_layout(
        self,
        n: usize,
        r: usize,
        count: usize,
    ) -> Option<(usize, usize, usize)> {
        Some(match self {
            Self::AllReduce(_) | Self::Broadcast(_) | Self::Reduce(..) => (count, 0, 0),
            Self::AllGather => (n * count, r * count, 0),
            Self::ReduceScatter(_) => (n * count, 0, r * count),
            Self::Gather(root) if r == root => (n * count, root * count, 0),
            Self::Scatter(root) if r == root => (n * count, 0, root * count),
            Self::Gather(_) | Self::Scatter(_) => (count, 0, 0),
            Self::AllToAll => return None,
            Self::Barrier => (0, 0, 0),
        })
    }
    /// The algorithms this collective has.
    pub fn algorithms(self) -> &'static [Algorithm] {
        match self {
            Self::AllReduce(_) => &[
                Algorithm::Ring,
                Algorithm::Direct,
                Algorithm::Doubling,
                Algorithm::Halving,
                Algorithm::Tree,
                Algorithm::Hier,
                Algorithm::Deterministic,
            ],
            Self::Broadcast(_) | Self::Reduce(..) => &[Algorithm::Ring, Algorithm::Direct],
            Self::AllGather | Self::ReduceScatter(_) => &[Algorithm::Ring, Algorithm::Direct],
            Self::AllToAll | Self::Gather(_) | Self::Scatter(_) | Self::Barrier => {
                &[Algorithm::Direct]
            }
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        if let Some(o) = self.op() {
            write!(f, "({o})")?;
        }
        if let Some(r) = self.root() {
            write!(f, "(root {r})")?;
        }
        Ok(())
    }
}

/// An algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring (all-reduce, all-gather, reduce-scatter) or pipelined chain along the ring
    /// (broadcast, reduce).
    Ring,
    /// One step: every rank talks to every rank it needs directly (small messages).
    Direct,
    /// AllReduce with a fixed reduction order, whatever the size (see
    /// [`sch::allreduce_deterministic`]).
    Deterministic,
    /// AllReduce by recursive doubling: log2 n steps of whole vectors (small messages).
    Doubling,
    /// AllReduce by recursive halving and doubling (Rabenseifner): 2 log2 n steps, ring
    /// bandwidth (mid sizes).
    Halving,
    /// AllReduce over a double binary tree, pipelined: log2 n latency, ring-like data.
    Tree,
    /// AllReduce across hosts, hierarchical: rings inside each host around a ring between
    /// the hosts (see [`sch::allreduce_hier`]); the ring where all ranks share one host.
    Hier,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Self; 7] = [
        Self::Ring,
        Self::Direct,
        Self::Doubling,
        Self::Halving,
        Self::Tree,
        Self::Hier,
        Self::Deterministic,
    ];
    /// Name as `MONEL_ALGO` takes it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Direct => "direct",
            Self::Deterministic => "deterministic",
            Self::Doubling => "doubling",
            Self::Halving => "halving",
            Self::Tree => "tree",
            Self::Hier => "hier",
        }
    }
    /// A nonzero byte for frame headers: the place in [`Self::ALL`] plus one.
    pub fn code(self) -> u8 {
        Self::ALL
            .iter()
            .position(|&a| a == self)
            .map_or(0, |i| i as u8 + 1)
    }
    /// The algorithm of a [`Self::code`]; `None` for 0 and unknown codes.
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.get(usize::from(c).checked_sub(1)?).copied()
    }
    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == s.to_ascii_lowercase())
    }
}

/// True if `order` is a permutation of `0..n`.
pub fn is_order(order: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order
            .iter()
            .all(|&x| x < n && !std::mem::replace(&mut seen[x], true))
}

/// One call of a collective as every rank makes it: which one (with its operation and
/// root), on what data type, and how many elements (per rank where the collective counts
/// so; see [`Collective::sizes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The collective, with its reduction and root.
    pub coll: Collective,
    /// The element type.
    pub dtype: DataType,
    /// The element count.
    pub count: usize,
}

impl Call {
    /// The call of `coll` on `count` elements of `dtype`.
    pub const fn new(coll: Collective, dtype: DataType, count: usize) -> Self {
        Self { coll, dtype, count }
    }

    /// The bytes of `count` elements.
    pub const fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

/// What one rank's schedule depends on: the collective and its element count, the
/// algorithm, the pipelining unit, the buffers' form, and where the ranks sit.
///
/// `order[k]` is the rank at place k (ranks of one host next to each other, so a ring
/// crosses between hosts once per host); it is used only where the result does not depend on
/// which rank holds which part: AllReduce by every algorithm but the deterministic one (its
/// reduction order is by rank). Other collectives, and the identity order, get
/// [`schedule`]'s. `per_host` is how many ranks each host has when every host has as many
/// (the places in `order` then go host by host), 0 when not: the hierarchical AllReduce
/// ([`Algorithm::Hier`]) needs it, and is the ring without it.
#[derive(Debug, Clone, Copy)]
pub struct ScheduleRequest<'a> {
    /// The collective.
    pub coll: Collective,
    /// Its algorithm.
    pub algo: Algorithm,
    /// Elements (as [`Call::count`]).
    pub count: usize,
    /// The pipelining unit, in elements (see [`schedule`]).
    pub slice: usize,
    /// The in-place form, where the schedule differs.
    pub in_place: bool,
    /// How many ranks.
    pub ranks: usize,
    /// The rank whose schedule this is.
    pub rank: usize,
    /// The ranks in place order (a permutation of `0..ranks`).
    pub order: &'a [usize],
    /// Ranks per host when every host has as many, else 0.
    pub per_host: usize,
}

impl ScheduleRequest<'_> {
    /// The rank's schedule.
    pub fn build(&self) -> Result<Schedule> {
        let Self {
            coll,
            algo,
            count,
            slice,
            in_place,
            ranks: n,
            rank: r,
            order,
            per_host,
        } = *self;
        if !is_order(order, n) {
            return Err(SchedError::invalid(format!(
                "rank order {order:?} is not a permutation of 0..{n}"
            )));
        }
        let reorders = matches!(coll, Collective::AllReduce(_))
            && algo != Algorithm::Deterministic
            && order.iter().enumerate().any(|(k, &x)| k != x);
        // Only the hierarchy needs the hosts; everything else is `schedule`'s.
        let build = |r: usize| match (coll, algo) {
            (Collective::AllReduce(o), Algorithm::Hier) => Ok(sch::allreduce_hier(
                n,
                r,
                count,
                slice,
                o == RedOp::Avg,
                per_host,
            )),
            _ => schedule(coll, algo, n, r, count, slice, in_place),
        };
        if !reorders {
            return build(r);
        }
        let place = order.iter().position(|&x| x == r).ok_or_else(|| {
            SchedError::invalid(format!("rank {r} is not in the rank order {order:?}"))
        })?;
        let mut s = build(place)?;
        s.relabel(order);
        Ok(s)
    }
}

/// Rank `r`'s schedule of `coll` over `n` ranks with `algo`. `slice` is the pipelining unit
/// (elements) of chains and trees, and of the AllReduce ring, which runs on pieces of `n`
/// slices in turn; `in_place` selects the in-place form where the schedule differs. The
/// hosts are unknown here: [`Algorithm::Hier`] is the ring (see [`ScheduleRequest`]).
pub fn schedule(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    r: usize,
    count: usize,
    slice: usize,
    in_place: bool,
) -> Result<Schedule> {
    if !coll.algorithms().contains(&algo) {
        return Err(SchedError::invalid(format!(
            "{} has no {} algorithm",
            coll.name(),
            algo.name()
        )));
    }
    let avg = |o: RedOp| o == RedOp::Avg;
    Ok(match (coll, algo) {
        (Collective::AllReduce(o), Algorithm::Ring) => {
            sch::allreduce_ring_pipelined(n, r, count, slice, avg(o))
        }
        (Collective::AllReduce(o), Algorithm::Direct) => {
            sch::allreduce_direct(n, r, count, avg(o), in_place)
        }
        (Collective::AllReduce(o), Algorithm::Doubling) => {
            sch::allreduce_doubling(n, r, count, avg(o))
        }
        (Collective::AllReduce(o), Algorithm::Halving) => {
            sch::allreduce_halving(n, r, count, avg(o))
        }
        (Collective::AllReduce(o), Algorithm::Tree) => {
            sch::allreduce_tree(n, r, count, slice, avg(o))
        }
        (Collective::AllReduce(o), Algorithm::Hier) => {
            sch::allreduce_hier(n, r, count, slice, avg(o), 0)
        }
        (Collective::AllReduce(o), _) => sch::allreduce_deterministic(n, r, count, avg(o)),
        (Collective::Broadcast(root), Algorithm::Ring) => {
            sch::broadcast_chain(n, r, count, root, slice)
        }
        (Collective::Broadcast(root), _) => sch::broadcast_direct(n, r, count, root),
        (Collective::Reduce(o, root), Algorithm::Ring) => {
            sch::reduce_chain(n, r, count, root, slice, avg(o))
        }
        (Collective::Reduce(o, root), _) => sch::reduce_direct(n, r, count, root, avg(o)),
        (Collective::AllGather, Algorithm::Ring) => sch::all_gather_ring(n, r, count),
        (Collective::AllGather, _) => sch::all_gather_direct(n, r, count),
        (Collective::ReduceScatter(o), Algorithm::Ring) => {
            sch::reduce_scatter_ring(n, r, count, avg(o), in_place)
        }
        (Collective::ReduceScatter(o), _) => sch::reduce_scatter_direct(n, r, count, avg(o)),
        (Collective::AllToAll, _) => sch::alltoall_direct(n, r, count),
        (Collective::Gather(root), _) => sch::gather_direct(n, r, count, root),
        (Collective::Scatter(root), _) => sch::scatter_direct(n, r, count, root),
        (Collective::Barrier, _) => sch::barrier(n, r),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_code_and_name() {
        for k in CollectiveKind::ALL {
            assert_eq!(CollectiveKind::from_code(k.code()), Some(k));
            assert_eq!(CollectiveKind::parse(k.name()), Some(k));
            assert_eq!(k.with(RedOp::Max, 1).kind(), k);
            assert_eq!(k.with(RedOp::Max, 1).op().is_some(), k.has_op());
            assert_eq!(k.with(RedOp::Max, 1).root().is_some(), k.has_root());
        }
        assert_eq!(CollectiveKind::from_code(0), None);
        assert_eq!(CollectiveKind::from_code(10), None);
    }

    #[test]
    fn the_spellings_of_nccl_tests_torch_and_nccl_parse() {
        for s in [
            "all_reduce",
            "allreduce",
            "all-reduce",
            "AllReduce",
            "all_reduce_perf",
        ] {
            assert_eq!(
                CollectiveKind::parse(s),
                Some(CollectiveKind::AllReduce),
                "{s}"
            );
        }
        for s in ["alltoall", "all_to_all", "all-to-all", "AlltoAll"] {
            assert_eq!(
                CollectiveKind::parse(s),
                Some(CollectiveKind::AllToAll),
                "{s}"
            );
        }
        assert_eq!(CollectiveKind::parse("allreduc"), None);
        assert_eq!(CollectiveKind::parse(""), None);
    }

    #[test]
    fn a_typo_suggests_the_nearest_name_and_nonsense_suggests_nothing() {
        assert_eq!(
            CollectiveKind::nearest("allreduc"),
            Some(CollectiveKind::AllReduce)
        );
        assert_eq!(
            CollectiveKind::nearest("all_gahter"),
            Some(CollectiveKind::AllGather)
        );
        assert_eq!(
            CollectiveKind::nearest("brodcast"),
            Some(CollectiveKind::Broadcast)
        );
        assert_eq!(CollectiveKind::nearest("quantum_teleport"), None);
    }
}
