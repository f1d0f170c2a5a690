//! Bounded liveness. While a call waits on peers and nothing moves, it asks the peers it
//! waits on whether they are alive (each rank's status endpoint answers at once from a
//! thread of its own), so a frozen rank, a partition or a dead host is named within a bound
//! (`MONEL_LIVENESS`, 10 s by default) instead of after `MONEL_TIMEOUT`. A peer that
//! answers is alive, however slow its part of the call: it is waited for as long as the
//! timeout allows, unless it says it gave up on this very call, or the RDMA path to it is
//! blocked (its status answers over TCP, but for the bound nothing has come from it over
//! RDMA while this side's retransmissions time out).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::error::{CclError, ErrorKind, Result};

/// What a rank's status endpoint said: the call it is in (or last was) and whether it
/// failed there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerState {
    pub(crate) seq: u64,
    pub(crate) failed: bool,
}

/// Asks one rank's status endpoint; `None` if it did not answer.
pub(crate) type Probe<'a> = &'a dyn Fn(SocketAddr) -> Option<PeerState>;

/// A link's path counters: retransmission timeouts, and packets taken from the peer
/// (`None` for links without a path of their own to watch, such as TCP).
pub(crate) type PathProgress<'a> = &'a dyn Fn(usize) -> Option<(u64, u64)>;

/// One look at a peer's path: its counters, when, and since when it has looked blocked.
type PathLook = ((u64, u64), Instant, Option<Instant>);

/// The liveness check of one call.
pub(crate) struct Liveness<'a> {
    /// Each rank's status endpoint, by rank.
    status: &'a [SocketAddr],
    /// A peer silent this long is named.
    bound: Duration,
    probe: Probe<'a>,
    /// The call being watched.
    seq: u64,
    /// When the peers waited on were last asked.
    probed_at: Option<Instant>,
    /// Since when each peer has not answered (`None`: it answered last time).
    silent_since: Vec<Option<Instant>>,
    /// Each peer's path counters at the last look, when that was, and since when its path
    /// has looked blocked.
    paths: Vec<Option<PathLook>>,
}

impl<'a> Liveness<'a> {
    /// Names peers silent for `bound` during call `seq`, asking them with `probe`.
    pub(crate) fn new(
        status: &'a [SocketAddr],
        bound: Duration,
        probe: Probe<'a>,
        seq: u64,
    ) -> Self {
        Self {
            status,
            bound,
            probe,
            seq,
            probed_at: None,
            silent_since: Vec::new(),
            paths: Vec::new(),
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
    /// bound, that failed this call, or whose RDMA path (`progress`) looked blocked for the
    /// bound.
    pub(crate) fn check(
        &mut self,
        now: Instant,
        idle_since: Instant,
        waiting: &[usize],
        what: &str,
        progress: PathProgress<'_>,
    ) -> Result<()> {
        let every = self.every();
        if !self.due(now, idle_since) {
            return Ok(());
        }
        self.probed_at = Some(now);
        let n = self.status.len();
        if self.silent_since.len() != n {
            self.silent_since = vec![None; n];
            self.paths = vec![None; n];
        }
        let secs = self.bound.as_secs_f64();
        let lost = |p: usize, why: String| {
            Err(
                CclError::new(ErrorKind::PeerLost, format!("{what}: rank {p} {why}"))
                    .with_ranks(vec![p]),
            )
        };
        for &p in waiting {
            let Some(&addr) = self.status.get(p) else {
                continue;
            };
            match (self.probe)(addr) {
                Some(st) => {
                    self.silent_since[p] = None;
                    if st.failed && st.seq == self.seq {
                        return lost(
                            p,
                            "gave up on this call, and its word of it did not arrive (is the \
                             path between the two blocked?)"
                                .into(),
                        );
                    }
                }
                None => {
                    let since = *self.silent_since[p].get_or_insert(now);
                    if now.duration_since(since) + every >= self.bound {
                        return lost(
                            p,
                            format!(
                                "has not answered for {secs:.0} s (frozen, cut off by the \
                                 network, or its host is gone)"
                            ),
                        );
                    }
                }
            }
            // The path: retransmissions timing out while nothing comes from the peer.
            let Some(now_counts) = progress(p) else {
                continue;
            };
            // Blocked since the look before the first that saw timeouts without packets.
            let blocked_since = match self.paths[p] {
                Some(((timeouts, rx), then, since)) if now_counts.1 == rx => {
                    if now_counts.0 > timeouts {
                        since.or(Some(then))
                    } else {
                        since
                    }
                }
                _ => None,
            };
            self.paths[p] = Some((now_counts, now, blocked_since));
            if let Some(since) = blocked_since {
                if now.duration_since(since) + every >= self.bound {
                    return lost(
                        p,
                        format!(
                            "answers over TCP, but its RDMA path is blocked: nothing has come \
                             from it for {secs:.0} s while this rank's retransmissions time out"
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: SocketAddr) -> Option<PeerState> {
        None
    }
    fn always(_: SocketAddr) -> Option<PeerState> {
        Some(PeerState {
            seq: 7,
            failed: false,
        })
    }
    fn no_path(_: usize) -> Option<(u64, u64)> {
        None
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
        let mut l = Liveness::new(&addrs, bound, &always, 7);
        for ms in (0..120_000).step_by(500) {
            l.check(at(ms), t0, &[1, 2], "call", &no_path).unwrap();
        }
        // A silent peer: asked from 2 s into the stall, named by 10 s.
        let mut l = Liveness::new(&addrs, bound, &never, 7);
        let mut named = None;
        for ms in (0..20_000).step_by(100) {
            if let Err(e) = l.check(at(ms), t0, &[2], "all_reduce #7", &no_path) {
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
        let mut l = Liveness::new(&addrs, bound, &never, 7);
        l.check(at(1_000), t0, &[2], "x", &no_path).unwrap();
        assert!(l.probed_at.is_none());
    }

    #[test]
    fn a_peer_that_gave_up_or_a_blocked_path_is_named_and_a_slow_one_never() {
        let addrs: Vec<SocketAddr> = (0..2)
            .map(|i| format!("127.0.0.1:{}", 9100 + i).parse().unwrap())
            .collect();
        let bound = Duration::from_secs(10);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        // Failed in an earlier call: still waited for; failed in this one: named at once.
        let failed_before = |_: SocketAddr| {
            Some(PeerState {
                seq: 6,
                failed: true,
            })
        };
        let mut l = Liveness::new(&addrs, bound, &failed_before, 7);
        l.check(at(5_000), t0, &[1], "x", &no_path).unwrap();
        let failed_now = |_: SocketAddr| {
            Some(PeerState {
                seq: 7,
                failed: true,
            })
        };
        let mut l = Liveness::new(&addrs, bound, &failed_now, 7);
        let e = l.check(at(5_000), t0, &[1], "x", &no_path).unwrap_err();
        assert!(e.message.contains("rank 1 gave up on this call"), "{e}");
        // Timeouts grow, nothing arrives: named within the bound.
        let ticks = std::cell::Cell::new(0u64);
        let blocked = |_: usize| {
            ticks.set(ticks.get() + 3);
            Some((ticks.get(), 500))
        };
        let mut l = Liveness::new(&addrs, bound, &always, 7);
        let mut named = None;
        for ms in (0..30_000).step_by(500) {
            if let Err(e) = l.check(at(ms), t0, &[1], "x", &blocked) {
                named = Some((ms, e));
                break;
            }
        }
        let (ms, e) = named.expect("the blocked path is named");
        assert!((8_000..=10_000).contains(&ms), "named after {ms} ms");
        assert!(e.message.contains("RDMA path is blocked"), "{e}");
        // Timeouts grow but packets keep coming (a lossy, slow path): never named.
        let rx = std::cell::Cell::new(0u64);
        let lossy = |_: usize| {
            rx.set(rx.get() + 1);
            Some((rx.get() * 2, rx.get()))
        };
        let mut l = Liveness::new(&addrs, bound, &always, 7);
        for ms in (0..120_000).step_by(500) {
            l.check(at(ms), t0, &[1], "x", &lossy).unwrap();
        }
    }
}
