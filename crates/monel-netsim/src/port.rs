//! An impaired egress port on the caller's clock: the same drop-tail queue, serializer, ECN
//! marking and seeded faults as a simulated link, but sans-IO, so a real software switch can
//! drive it with wall-clock time and the simulator's model and the switch's behaviour are one.
//!
//! Feed frames with [`Port::enqueue`], take the ones whose time has come with
//! [`Port::poll_deliver`], and sleep until [`Port::poll_timeout`].

use core::cmp::Reverse;
use core::time::Duration;
use std::collections::BinaryHeap;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::link::{Fate, Link, LinkConfig, LinkStats};

/// One egress port. Times are offsets from any fixed origin the caller chooses; they must
/// not go backwards.
#[derive(Debug)]
pub struct Port {
    link: Link,
    /// When the serializer finishes the packet at the head of the queue's predecessor.
    tx_free_at: Duration,
    /// Frames on the wire: (arrival time, sequence for FIFO ties, frame).
    in_flight: BinaryHeap<Reverse<(Duration, u64, Vec<u8>)>>,
    seq: u64,
}

impl Port {
    /// A port with `cfg`'s rate, queue, ECN and faults, drawing faults from `seed`. ECN marks
    /// the IP header found `l3_offset` bytes into each frame (14 for Ethernet).
    pub fn new(cfg: LinkConfig, seed: u64, l3_offset: usize) -> Self {
        Self {
            link: Link {
                cfg,
                queue: Default::default(),
                queued_bytes: 0,
                busy: false,
                rng: ChaCha8Rng::seed_from_u64(seed),
                stats: LinkStats::default(),
                to: crate::link::Node::Switch,
                l3_offset,
            },
            tx_free_at: Duration::ZERO,
            in_flight: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Queues `frame` at `now` (perhaps marking it CE). Returns false if the queue was full
    /// and the frame was dropped.
    pub fn enqueue(&mut self, now: Duration, frame: Vec<u8>) -> bool {
        self.advance(now);
        if self.link.queue.is_empty() && self.tx_free_at < now {
            self.tx_free_at = now;
        }
        self.link.enqueue(frame)
    }

    /// The next frame that has reached the far end by `now`.
    pub fn poll_deliver(&mut self, now: Duration) -> Option<Vec<u8>> {
        self.advance(now);
        match self.in_flight.peek() {
            Some(Reverse((at, _, _))) if *at <= now => self.in_flight.pop().map(|r| r.0.2),
            _ => None,
        }
    }

    /// When something next happens (a frame leaves the serializer or arrives), if anything
    /// is pending.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let tx = self
            .link
            .queue
            .front()
            .map(|f| self.tx_free_at + self.link.tx_time(f.len()));
        let rx = self.in_flight.peek().map(|r| r.0.0);
        monel_rc::time::earliest(tx, rx)
    }

    /// Bytes waiting in the queue (the one being serialized included).
    pub fn queued_bytes(&self) -> usize {
        self.link.queued_bytes
    }

    /// The port's counters.
    pub fn stats(&self) -> LinkStats {
        self.link.stats
    }

    /// The port's configuration.
    pub fn config(&self) -> &LinkConfig {
        &self.link.cfg
    }

    /// Moves every frame whose serialization has finished by `now` onto the wire, drawing
    /// its fate.
    fn advance(&mut self, now: Duration) {
        while let Some(head) = self.link.queue.front() {
            let done = self.tx_free_at + self.link.tx_time(head.len());
            if done > now {
                break;
            }
            self.tx_free_at = done;
            let Some(mut frame) = self.link.queue.pop_front() else {
                break;
            };
            let l = &mut self.link;
            l.queued_bytes -= frame.len();
            l.stats.tx_packets += 1;
            l.stats.tx_bytes += frame.len() as u64;
            if let Fate::Deliver { extra, copies } = l.fate(&mut frame) {
                let at = done + l.cfg.latency + extra;
                for _ in 1..copies {
                    self.seq += 1;
                    self.in_flight.push(Reverse((at, self.seq, frame.clone())));
                }
                self.seq += 1;
                self.in_flight.push(Reverse((at, self.seq, frame)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EcnConfig;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn drain(p: &mut Port, until: Duration) -> Vec<(Duration, Vec<u8>)> {
        let mut now = Duration::ZERO;
        let mut out = Vec::new();
        loop {
            while let Some(f) = p.poll_deliver(now) {
                out.push((now, f));
            }
            match p.poll_timeout() {
                Some(t) if t <= until => now = t.max(now),
                _ => return out,
            }
        }
    }

    #[test]
    fn serializes_at_the_link_rate_then_adds_latency() {
        // 8 Mb/s: a 1000-byte frame takes 1 ms.
        let cfg = LinkConfig {
            latency: ms(5),
            bandwidth_bps: 8e6,
            ..LinkConfig::default()
        };
        let mut p = Port::new(cfg, 1, 0);
        for i in 0..3u8 {
            assert!(p.enqueue(Duration::ZERO, vec![i; 1000]));
        }
        assert_eq!(p.queued_bytes(), 3000);
        let got = drain(&mut p, ms(100));
        let times: Vec<_> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(times, [ms(6), ms(7), ms(8)]);
        let order: Vec<_> = got.iter().map(|(_, f)| f[0]).collect();
        assert_eq!(order, [0, 1, 2]);
        assert_eq!(p.stats().tx_packets, 3);
        // An idle port starts serializing when the frame arrives, not when it last finished.
        assert!(p.enqueue(ms(50), vec![9; 1000]));
        assert_eq!(p.poll_timeout(), Some(ms(51)));
        assert_eq!(p.poll_deliver(ms(55)), None);
        assert_eq!(p.poll_deliver(ms(56)).map(|f| f[0]), Some(9));
    }

    #[test]
    fn tail_drop_ecn_marking_and_faults_are_counted() {
        let cfg = LinkConfig {
            latency: Duration::ZERO,
            bandwidth_bps: 8e6,
            queue_limit: 10_000,
            ecn: Some(EcnConfig {
                kmin: 2_000,
                kmax: 4_000,
                pmax: 1.0,
            }),
            loss: 0.1,
            duplicate: 0.1,
            ..LinkConfig::default()
        };
        let mut p = Port::new(cfg, 7, 14);
        // Ethernet + ECT(0) IPv4 header so marking has somewhere to go.
        let mut frame = vec![0u8; 1000];
        frame[14] = 0x45;
        frame[15] = 0x02;
        let mut accepted = 0;
        for _ in 0..20 {
            accepted += usize::from(p.enqueue(Duration::ZERO, frame.clone()));
        }
        assert_eq!(accepted, 10, "the 10,000-byte queue holds ten");
        let s = p.stats();
        assert_eq!(s.overflow_drops, 10);
        // Depths 0..=1000 unmarked, 5000+ marked always; 3000 and 4000 marked with p >= 0.5.
        assert!((6..=7).contains(&s.ecn_marked), "{s:?}");
        let got = drain(&mut p, ms(1000));
        let marked = got.iter().filter(|(_, f)| f[15] & 3 == 3).count() as u64;
        let s = p.stats();
        assert_eq!(got.len() as u64, 10 - s.lost + s.duplicated, "{s:?}");
        assert!(marked <= s.ecn_marked + s.duplicated);
    }

    #[test]
    fn reordering_lets_later_frames_pass() {
        let cfg = LinkConfig {
            latency: Duration::ZERO,
            bandwidth_bps: 8e9,
            reorder: 0.3,
            reorder_delay: ms(1),
            ..LinkConfig::default()
        };
        let mut p = Port::new(cfg, 3, 0);
        for i in 0..200u8 {
            p.enqueue(Duration::from_micros(u64::from(i)), vec![i]);
        }
        let got: Vec<u8> = drain(&mut p, ms(10)).iter().map(|(_, f)| f[0]).collect();
        assert_eq!(got.len(), 200);
        let inversions = got.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(inversions > 10, "only {inversions} inversions");
        let mut sorted = got;
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..200).collect::<Vec<u8>>(),
            "nothing lost or invented"
        );
        assert!(p.stats().reordered > 0);
    }
}
