//! The cost model that picks an algorithm: time = steps x alpha + bytes on the critical path
//! / beta (NCCL's `lat * steps + bytes / bw`), with alpha and beta per transport, calibrated
//! on this project's 2-core development machine with `monel bench` and `MONEL_ALGO` forced
//! to each algorithm (see `docs/collectives.md`). `MONEL_ALGO` overrides the choice.

use crate::plan::{Algorithm, Collective};

/// The transports a link can run on, each priced by the cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Shared-memory rings between processes on one host.
    Shm,
    /// RDMA (RoCEv2) through the verbs API.
    Roce,
    /// A TCP connection.
    Tcp,
}

impl TransportKind {
    /// The name users write and read in settings and bindings: `shm`, `rdma`, `tcp`
    /// (`MONEL_TRANSPORT`, the transfer engine's `transport`).
    pub const fn setting(self) -> &'static str {
        match self {
            Self::Shm => "shm",
            Self::Roce => "rdma",
            Self::Tcp => "tcp",
        }
    }

    /// The name the logs print (`SHM`, `RoCE`, `TCP`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Shm => "SHM",
            Self::Roce => "RoCE",
            Self::Tcp => "TCP",
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A transport's latency per message and bandwidth per link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// Seconds per step.
    pub alpha: f64,
    /// Bytes per second per link.
    pub beta: f64,
}

impl Costs {
    /// TCP over loopback: about 15 us per message, 2 GB/s.
    pub const TCP: Self = Self {
        alpha: 15e-6,
        beta: 2e9,
    };
    /// Shared memory with a core per rank: 0.5 us per step (a cache-line hand-over plus
    /// the executor), 5 GB/s (copy into the ring, reduce out of it).
    pub const SHM: Self = Self {
        alpha: 0.5e-6,
        beta: 5e9,
    };

    /// The soft RNIC over loopback: about 30 us per message (a RoCE WRITE, its ACK and the
    /// credit, each a datagram through the kernel), 1 GB/s.
    pub const ROCE: Self = Self {
        alpha: 30e-6,
        beta: 1e9,
    };

    /// A transport's costs.
    pub const fn of_kind(kind: TransportKind) -> Self {
        match kind {
            TransportKind::Shm => Self::SHM,
            TransportKind::Roce => Self::ROCE,
            TransportKind::Tcp => Self::TCP,
        }
    }

    /// The costs of a communicator whose links are of `kinds` (the slowest latency and the
    /// slowest bandwidth among them; shared memory alone when there are none), on a host
    /// where `oversubscribed` ranks share cores: each step then waits for a time slice, and
    /// the cores' bandwidth is split.
    pub fn of(kinds: impl IntoIterator<Item = TransportKind>, oversubscription: f64) -> Self {
        let base = kinds
            .into_iter()
            .map(Self::of_kind)
            .fold(Self::SHM, |a, b| Self {
                alpha: a.alpha.max(b.alpha),
                beta: a.beta.min(b.beta),
            });
        let k = oversubscription.max(1.0);
        Self {
            alpha: base.alpha * k * k,
            beta: base.beta / k,
        }
    }
}

/// Predicted seconds for `coll` over `n` ranks with `algo` on `bytes` (the count in bytes).
pub fn predict(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    bytes: usize,
    chunk: usize,
    c: &Costs,
) -> f64 {
    let (nf, s) = (n as f64, bytes as f64);
    let (alpha, beta) = (c.alpha, c.beta);
    if n <= 1 {
        return 0.0;
    }
    match (coll, algo) {
        // Two ranks reduce the whole vector each, straight into the output.
        (Collective::AllReduce(_), Algorithm::Direct) if n == 2 => alpha + 1.1 * s / beta,
        // More land every vector in scratch, then reduce them all: two passes.
        (Collective::AllReduce(_), Algorithm::Direct) => alpha + 2.0 * (nf - 1.0) * s / beta,
        // Folding ranks beyond a power of two costs a step before and after; every step
        // moves the whole vector and reduces it. Both start with a local copy of the input
        // (a quarter of a link's cost per byte).
        (Collective::AllReduce(_), Algorithm::Doubling) => {
            let (lg, fold) = folding(n);
            (lg + fold) * (alpha + 1.5 * s / beta) + 0.25 * s / beta
        }
        (Collective::AllReduce(_), Algorithm::Halving) => {
            let (lg, fold) = folding(n);
            let p = lg.exp2();
            2.0 * lg * alpha
                + 2.0 * (p - 1.0) / p * s / beta
                + fold * (alpha + 1.5 * s / beta)
                + 0.25 * s / beta
        }
        // Two trees of depth log2 n, each carrying half the vector up and down in slices;
        // an interior rank moves three slices per step per tree.
        (Collective::AllReduce(_), Algorithm::Tree) => {
            let half = s / 2.0;
            let m = ((bytes / 2).div_ceil(chunk.max(1))).max(1) as f64;
            let depth = f64::from(n.ilog2());
            (m + 2.0 * depth) * (alpha + 3.0 * (half / m) / beta)
        }
        // The ring runs on pieces of n chunks in turn (see `allreduce_ring_pipelined`): the
        // same bytes, a latency per step of every piece.
        (Collective::AllReduce(_), Algorithm::Ring) => {
            let pieces = crate::schedule::ring_pieces(n, bytes, chunk) as f64;
            2.0 * (nf - 1.0) * pieces * alpha + 2.0 * (nf - 1.0) / nf * s / beta
        }
        (Collective::AllReduce(_), _) => {
            2.0 * (nf - 1.0) * alpha + 2.0 * (nf - 1.0) / nf * s / beta
        }
        (Collective::Broadcast(_) | Collective::Reduce(..), Algorithm::Ring) => {
            let m = (bytes.div_ceil(chunk.max(1))).max(1) as f64;
            (m + nf - 2.0) * (alpha + (s / m) / beta)
        }
        (Collective::Broadcast(_) | Collective::Reduce(..), _) => alpha + (nf - 1.0) * s / beta,
        (Collective::AllGather | Collective::ReduceScatter(_), Algorithm::Ring) => {
            (nf - 1.0) * (alpha + s / beta)
        }
        (Collective::AllGather | Collective::ReduceScatter(_), _) => alpha + (nf - 1.0) * s / beta,
        _ => alpha + (nf - 1.0) * s / beta,
    }
}

/// log2 of the power of two `n` folds onto, and the extra steps folding costs (0 or 2).
fn folding(n: usize) -> (f64, f64) {
    let lg = n.ilog2();
    (f64::from(lg), if n.is_power_of_two() { 0.0 } else { 2.0 })
}

/// How the ranks sit on hosts, for the hierarchical AllReduce: `per_host` ranks on each
/// host, links inside a host costing `local` and links between hosts `net`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hosts {
    /// Ranks on each host (every host has as many).
    pub per_host: usize,
    /// The links inside a host.
    pub local: Costs,
    /// The links between hosts.
    pub net: Costs,
}

/// Predicted seconds of the hierarchical AllReduce ([`Algorithm::Hier`]): a ring inside each
/// host on the whole vector around a ring between hosts on a host's share of it, both
/// pipelined in the pieces of the flat ring. Infinite where the layout has no hierarchy (one
/// host, or one rank per host).
pub fn predict_hier(n: usize, bytes: usize, chunk: usize, h: &Hosts) -> f64 {
    let l = h.per_host;
    if l < 2 || l >= n || n % l != 0 {
        return f64::INFINITY;
    }
    let pieces = crate::schedule::ring_pieces(n, bytes, chunk) as f64;
    let ring = |m: usize, s: f64, c: &Costs| {
        let mf = m as f64;
        2.0 * (mf - 1.0) * pieces * c.alpha + 2.0 * (mf - 1.0) / mf * s / c.beta
    };
    let s = bytes as f64;
    ring(l, s, &h.local) + ring(n / l, s / l as f64, &h.net)
}

/// The cheapest algorithm `coll` has for this size on links costing `c`; with `hosts`, the
/// hierarchical AllReduce too, where it beats the flat choice.
pub fn choose_on(
    coll: Collective,
    n: usize,
    bytes: usize,
    chunk: usize,
    c: &Costs,
    hosts: Option<&Hosts>,
) -> Algorithm {
    let flat = choose(coll, n, bytes, chunk, c);
    match hosts {
        Some(h)
            if matches!(coll, Collective::AllReduce(_))
                && predict_hier(n, bytes, chunk, h) < predict(coll, flat, n, bytes, chunk, c) =>
        {
            Algorithm::Hier
        }
        _ => flat,
    }
}

/// The cheapest algorithm `coll` has for this size, the hosts unknown.
pub fn choose(coll: Collective, n: usize, bytes: usize, chunk: usize, c: &Costs) -> Algorithm {
    coll.algorithms()
        .iter()
        .copied()
        .filter(|&a| a != Algorithm::Deterministic && a != Algorithm::Hier)
        .min_by(|&a, &b| {
            predict(coll, a, n, bytes, chunk, c).total_cmp(&predict(coll, b, n, bytes, chunk, c))
        })
        .unwrap_or(Algorithm::Direct)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedOp;

    #[test]
    fn small_goes_direct_mid_goes_logarithmic_large_goes_ring() {
        let ar = Collective::AllReduce(RedOp::Sum);
        for c in [Costs::TCP, Costs::SHM, Costs::of([TransportKind::Shm], 2.0)] {
            assert_eq!(choose(ar, 4, 8, 1 << 19, &c), Algorithm::Direct);
            assert_eq!(choose(ar, 4, 32 << 20, 1 << 19, &c), Algorithm::Ring);
            assert_eq!(
                choose(Collective::Broadcast(0), 4, 64 << 20, 1 << 19, &c),
                Algorithm::Ring
            );
            assert_eq!(
                choose(Collective::AllToAll, 4, 1 << 20, 1 << 19, &c),
                Algorithm::Direct
            );
        }
        // Shared memory with 4 ranks on 2 cores (measured, MONEL_ALGO forced): at 2 KiB
        // doubling 6.4 us beat direct 7.4 and halving 9.4; from 8 KiB direct loses.
        let c = Costs::of([TransportKind::Shm], 2.0);
        assert_eq!(choose(ar, 4, 2 << 10, 1 << 19, &c), Algorithm::Doubling);
        assert_ne!(choose(ar, 4, 8 << 10, 1 << 19, &c), Algorithm::Direct);
        // Three ranks fold onto two: at 8 bytes direct's one step wins.
        assert_eq!(choose(ar, 3, 8, 1 << 19, &c), Algorithm::Direct);
    }

    #[test]
    fn hosts_of_several_ranks_take_the_hierarchy_for_large_allreduces() {
        let ar = Collective::AllReduce(RedOp::Sum);
        let flat = Costs::of([TransportKind::Shm, TransportKind::Roce], 2.0);
        let h = |per_host| Hosts {
            per_host,
            local: Costs::of([TransportKind::Shm], 2.0),
            net: Costs::of([TransportKind::Roce], 2.0),
        };
        let pick = |n, bytes, per_host| choose_on(ar, n, bytes, 1 << 19, &flat, Some(&h(per_host)));
        for n in [4, 6, 8] {
            assert_eq!(pick(n, 16 << 20, 2), Algorithm::Hier, "{n} ranks");
            assert_eq!(pick(n, 1 << 20, 2), Algorithm::Hier, "{n} ranks");
            // Tiny calls stay with the fewest steps.
            assert_ne!(pick(n, 8, 2), Algorithm::Hier, "{n} ranks");
            // No hierarchy: one rank per host, one host, or hosts unknown.
            assert_ne!(pick(n, 16 << 20, 1), Algorithm::Hier);
            assert_ne!(pick(n, 16 << 20, n), Algorithm::Hier);
            assert_eq!(
                choose_on(ar, n, 16 << 20, 1 << 19, &flat, None),
                choose(ar, n, 16 << 20, 1 << 19, &flat)
            );
        }
        // Only AllReduce has it.
        assert_ne!(
            choose_on(
                Collective::AllGather,
                4,
                16 << 20,
                1 << 19,
                &flat,
                Some(&h(2))
            ),
            Algorithm::Hier
        );
        // A host's share crosses: the prediction is below the flat ring's.
        let ring = predict(ar, Algorithm::Ring, 4, 16 << 20, 1 << 19, &flat);
        assert!(predict_hier(4, 16 << 20, 1 << 19, &h(2)) < ring);
    }
}
