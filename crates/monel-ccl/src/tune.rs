//! The cost model that picks an algorithm: time = steps x alpha + bytes on the critical path
//! / beta (NCCL's `lat * steps + bytes / bw`), with alpha and beta per transport. The
//! constants are the TCP loopback figures of this project's development machine (about 15 us
//! per message and 2 GB/s); `MONEL_ALGO` overrides the choice.

use crate::plan::{Algorithm, Collective};

/// Per-message latency, seconds.
const ALPHA: f64 = 15e-6;
/// Per-link bandwidth, bytes per second.
const BETA: f64 = 2e9;

/// Predicted seconds for `coll` over `n` ranks with `algo` on `bytes` (the count in bytes).
pub fn predict(coll: Collective, algo: Algorithm, n: usize, bytes: usize, chunk: usize) -> f64 {
    let (nf, s) = (n as f64, bytes as f64);
    if n <= 1 {
        return 0.0;
    }
    match (coll, algo) {
        (Collective::AllReduce(_), Algorithm::Direct) => ALPHA + (nf - 1.0) * s / BETA,
        (Collective::AllReduce(_), _) => {
            2.0 * (nf - 1.0) * ALPHA + 2.0 * (nf - 1.0) / nf * s / BETA
        }
        (Collective::Broadcast(_) | Collective::Reduce(..), Algorithm::Ring) => {
            let m = (bytes.div_ceil(chunk.max(1))).max(1) as f64;
            (m + nf - 2.0) * (ALPHA + (s / m) / BETA)
        }
        (Collective::Broadcast(_) | Collective::Reduce(..), _) => ALPHA + (nf - 1.0) * s / BETA,
        (Collective::AllGather | Collective::ReduceScatter(_), Algorithm::Ring) => {
            (nf - 1.0) * (ALPHA + s / BETA)
        }
        (Collective::AllGather | Collective::ReduceScatter(_), _) => ALPHA + (nf - 1.0) * s / BETA,
        _ => ALPHA + (nf - 1.0) * s / BETA,
    }
}

/// The cheapest algorithm `coll` has for this size.
pub fn choose(coll: Collective, n: usize, bytes: usize, chunk: usize) -> Algorithm {
    coll.algorithms()
        .iter()
        .copied()
        .filter(|&a| a != Algorithm::Deterministic)
        .min_by(|&a, &b| {
            predict(coll, a, n, bytes, chunk).total_cmp(&predict(coll, b, n, bytes, chunk))
        })
        .unwrap_or(Algorithm::Direct)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedOp;

    #[test]
    fn small_goes_direct_large_goes_ring() {
        let ar = Collective::AllReduce(RedOp::Sum);
        assert_eq!(choose(ar, 4, 8, 1 << 19), Algorithm::Direct);
        assert_eq!(choose(ar, 4, 32 << 20, 1 << 19), Algorithm::Ring);
        assert_eq!(
            choose(Collective::Broadcast(0), 4, 64 << 20, 1 << 19),
            Algorithm::Ring
        );
        assert_eq!(
            choose(Collective::AllToAll, 4, 1 << 20, 1 << 19),
            Algorithm::Direct
        );
    }
}
