//! Bounded liveness. While a call waits on peers and nothing moves, it asks the peers it
//! waits on whether they are alive (each rank's status endpoint answers at once from a
//! thread of its own), so a frozen rank, a partition or a dead host is named within a bound
//! (`MONEL_LIVENESS`, 10 s by default) instead of after `MONEL_TIMEOUT`. A peer that
//! answers is alive, however slow its part of the call: it is waited for as long as the
//! timeout allows.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::error::{CclError, ErrorKind, Result};

/// Asks one rank's status endpoint; true if it answered.
pub(crate) type Probe<'a> = &'a dyn Fn(SocketAddr) -> bool;

/// The liveness check of one call.
pub(crate) struct Liveness<'a> {
    /// Each rank's status endpoint, by rank.
    status: &'a [SocketAddr],
    /// A peer silent this long is named.
    bound: Duration,
    probe: Probe<'a>,
    /// When the peers waited on were last asked.
    probed_at: Option<Instant>,
    /// Since when each peer has not answered (`None`: it answered last time).
    silent_since: Vec<Option<Instant>>,
}

impl<'a> Liveness<'a> {
    /// Names peers silent for `bound`, asking them with `probe`.
    pub(crate) fn new(status: &'a [SocketAddr], bound: Duration, probe: Probe<'a>) -> Self {
        Self {
            status,
            bound,
            probe,
            probed_at: None,
            silent_since: Vec::new(),
        }
    }

    /// How often the peers waited on are asked once a call stalls.
    fn every(&self) -> Duration {
        (self.bound / 5).max(Duration::from_millis(100))
    }

    /// True when [`Self::check`] has something to do: the call has been idle since
    /// `idle_since` long enough, and the peers were not asked too recently. Cheap: for the
    /// executor's idle loop.
    pub(crate) fn due(&self, now: Instant, idle_since: Instant) -> bool {
        let every = self.every();
        now.duration_since(idle_since) >= every
            && self
                .probed_at
                .is_none_or(|t| now.duration_since(t) >= every)
    }

    /// Called while the call `what` has been idle since `idle_since`, waiting on the peers
    /// in `waiting`: asks them every [`Self::every`] once the stall is that long, and fails
    /// with [`ErrorKind::PeerLost`] naming the first peer that has not answered for the
    /// bound.
    pub(crate) fn check(
        &mut self,
        now: Instant,
        idle_since: Instant,
        waiting: &[usize],
        what: &str,
    ) -> Result<()> {
        let every = self.every();
        if !self.due(now, idle_since) {
            return Ok(());
        }
        self.probed_at = Some(now);
        if self.silent_since.len() != self.status.len() {
            self.silent_since = vec![None; self.status.len()];
        }
        for &p in waiting {
            let Some(&addr) = self.status.get(p) else {
                continue;
            };
            if (self.probe)(addr) {
                self.silent_since[p] = None;
                continue;
            }
            let since = *self.silent_since[p].get_or_insert(now);
            if now.duration_since(since) + every >= self.bound {
                return Err(CclError::new(
                    ErrorKind::PeerLost,
                    format!(
                        "{what}: rank {p} has not answered for {:.0} s (frozen, cut off by \
                         the network, or its host is gone)",
                        self.bound.as_secs_f64()
                    ),
                )
                .with_ranks(vec![p]));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: SocketAddr) -> bool {
        false
    }
    fn always(_: SocketAddr) -> bool {
        true
    }

    #[test]
    fn a_silent_peer_is_named_within_the_bound_and_an_answering_one_never() {
        let addrs: Vec<SocketAddr> = (0..3)
            .map(|i| format!("127.0.0.1:{}", 9000 + i).parse().unwrap())
            .collect();
        let bound = Duration::from_secs(10);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        // Answering peers: never named, however long the stall.
        let mut l = Liveness::new(&addrs, bound, &always);
        for ms in (0..120_000).step_by(500) {
            l.check(at(ms), t0, &[1, 2], "call").unwrap();
        }
        // A silent peer: asked from 2 s into the stall, named by 10 s.
        let mut l = Liveness::new(&addrs, bound, &never);
        let mut named = None;
        for ms in (0..20_000).step_by(100) {
            if let Err(e) = l.check(at(ms), t0, &[2], "all_reduce #7") {
                named = Some((ms, e));
                break;
            }
        }
        let (ms, e) = named.expect("the silent peer is named");
        assert!((2_000..=10_000).contains(&ms), "named after {ms} ms");
        assert_eq!(e.kind, ErrorKind::PeerLost);
        assert_eq!(e.ranks, vec![2]);
        assert!(e.message.contains("rank 2 has not answered"), "{e}");
        // Not asked before the stall is long enough.
        let mut l = Liveness::new(&addrs, bound, &never);
        l.check(at(1_000), t0, &[2], "x").unwrap();
        assert!(l.probed_at.is_none());
    }
}
