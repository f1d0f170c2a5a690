//! A one-way link: a drop-tail egress queue with RED-style ECN marking, a serializer at the
//! link rate, a propagation delay, and seeded faults (loss, reordering, duplication,
//! corruption).

use core::time::Duration;
use std::collections::VecDeque;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Where a link delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Node {
    Switch,
    Host(usize),
}

/// ECN marking by queue depth (DCQCN's congestion point): probability 0 below `kmin` bytes,
/// rising linearly to `pmax` at `kmax`, 1 above.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EcnConfig {
    /// Queue bytes where marking starts.
    pub kmin: usize,
    /// Queue bytes where marking probability reaches `pmax`; above it every packet is marked.
    pub kmax: usize,
    /// Marking probability at `kmax`.
    pub pmax: f64,
}

impl EcnConfig {
    /// The production values HPCC's simulator uses, scaled by link rate (100 KB / 400 KB /
    /// 0.2 at 25 Gb/s).
    pub fn for_rate(bps: f64) -> Self {
        let k = bps / 25e9;
        Self {
            kmin: (100_000.0 * k) as usize,
            kmax: (400_000.0 * k) as usize,
            pmax: 0.2,
        }
    }

    /// Marking probability at queue depth `q` bytes.
    pub fn probability(&self, q: usize) -> f64 {
        if q <= self.kmin {
            0.0
        } else if q > self.kmax {
            1.0
        } else {
            self.pmax * (q - self.kmin) as f64 / (self.kmax - self.kmin).max(1) as f64
        }
    }
}

/// Everything about a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Serialization rate in bits per second.
    pub bandwidth_bps: f64,
    /// Egress queue limit in bytes (drop-tail beyond).
    pub queue_limit: usize,
    /// ECN marking, if any.
    pub ecn: Option<EcnConfig>,
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet is delayed by up to `reorder_delay` extra (so later ones pass it).
    pub reorder: f64,
    /// Largest extra delay of a reordered packet.
    pub reorder_delay: Duration,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that one bit of a packet is flipped.
    pub corrupt: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(1),
            bandwidth_bps: 25e9,
            queue_limit: 4 << 20,
            ecn: None,
            loss: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(5),
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }
}

/// Counters of a link.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// Packets put on the wire.
    pub tx_packets: u64,
    /// Bytes put on the wire.
    pub tx_bytes: u64,
    /// Packets lost by the loss model.
    pub lost: u64,
    /// Packets dropped because the queue was full.
    pub overflow_drops: u64,
    /// Packets marked ECN-CE.
    pub ecn_marked: u64,
    /// Packets reordered.
    pub reordered: u64,
    /// Packets duplicated.
    pub duplicated: u64,
    /// Packets corrupted.
    pub corrupted: u64,
    /// Deepest queue seen, in bytes.
    pub max_queue: usize,
}

/// What happens to a packet when it leaves the serializer.
pub(crate) enum Fate {
    Lost,
    Deliver { extra: Duration, copies: usize },
}

#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) cfg: LinkConfig,
    pub(crate) queue: VecDeque<Vec<u8>>,
    pub(crate) queued_bytes: usize,
    pub(crate) busy: bool,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) stats: LinkStats,
    /// Where packets arriving at the far end go.
    pub(crate) to: Node,
    /// Where the IP header starts in a frame (0 for IP datagrams, 14 for Ethernet frames).
    pub(crate) l3_offset: usize,
}

impl Link {
    /// Queues a packet (possibly marking it), or drops it when full. Returns false on drop.
    pub(crate) fn enqueue(&mut self, mut frame: Vec<u8>) -> bool {
        if self.queued_bytes + frame.len() > self.cfg.queue_limit {
            self.stats.overflow_drops += 1;
            return false;
        }
        if let Some(ecn) = self.cfg.ecn {
            let p = ecn.probability(self.queued_bytes);
            if p > 0.0
                && self.rng.gen_bool(p.min(1.0))
                && frame.len() > self.l3_offset
                && monel_wire::frame::mark_ce(&mut frame[self.l3_offset..])
            {
                self.stats.ecn_marked += 1;
            }
        }
        self.queued_bytes += frame.len();
        self.stats.max_queue = self.stats.max_queue.max(self.queued_bytes);
        self.queue.push_back(frame);
        true
    }

    /// Serialization time of `bytes`.
    pub(crate) fn tx_time(&self, bytes: usize) -> Duration {
        Duration::from_nanos((bytes as f64 * 8.0 * 1e9 / self.cfg.bandwidth_bps).ceil() as u64)
    }

    /// Draws the fate of a departing packet and applies corruption in place.
    pub(crate) fn fate(&mut self, frame: &mut [u8]) -> Fate {
        if self.cfg.loss > 0.0 && self.rng.gen_bool(self.cfg.loss) {
            self.stats.lost += 1;
            return Fate::Lost;
        }
        if self.cfg.corrupt > 0.0 && self.rng.gen_bool(self.cfg.corrupt) && !frame.is_empty() {
            let at = self.rng.gen_range(0..frame.len());
            frame[at] ^= 1 << self.rng.gen_range(0..8);
            self.stats.corrupted += 1;
        }
        let mut extra = Duration::ZERO;
        if self.cfg.reorder > 0.0 && self.rng.gen_bool(self.cfg.reorder) {
            let max = self.cfg.reorder_delay.as_nanos() as u64;
            extra = Duration::from_nanos(self.rng.gen_range(0..=max));
            self.stats.reordered += 1;
        }
        let mut copies = 1;
        if self.cfg.duplicate > 0.0 && self.rng.gen_bool(self.cfg.duplicate) {
            copies = 2;
            self.stats.duplicated += 1;
        }
        Fate::Deliver { extra, copies }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn red_probability() {
        let e = EcnConfig {
            kmin: 100,
            kmax: 300,
            pmax: 0.2,
        };
        assert_eq!(e.probability(50), 0.0);
        assert_eq!(e.probability(100), 0.0);
        assert!((e.probability(200) - 0.1).abs() < 1e-12);
        assert!((e.probability(300) - 0.2).abs() < 1e-12);
        assert_eq!(e.probability(301), 1.0);
        let hpcc = EcnConfig::for_rate(100e9);
        assert_eq!((hpcc.kmin, hpcc.kmax), (400_000, 1_600_000));
    }
}
