//! The switch's logic, sans-IO: MAC learning, flooding, and an impaired egress queue per port
//! for UDP ([`monel_netsim::Port`], the simulator's link model on the caller's clock). Other
//! traffic (ARP, neighbour discovery, the TCP of connection setup) passes unimpaired.

use core::time::Duration;
use std::collections::{HashMap, VecDeque};

use monel_netsim::{LinkConfig, LinkStats, Port};

const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;

/// Counters of one port beyond its egress model's.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortCounters {
    /// Frames received on the port.
    pub rx_frames: u64,
    /// UDP frames received (these are the impaired ones).
    pub rx_udp: u64,
    /// Frames sent out unimpaired (not UDP).
    pub tx_bypass: u64,
    /// Frames too short to be Ethernet, dropped.
    pub runts: u64,
}

/// Everything the switch knows about one port.
#[derive(Debug)]
struct SwitchPort {
    egress: Port,
    bypass: VecDeque<Vec<u8>>,
    counters: PortCounters,
}

impl SwitchPort {
    /// UDP goes through the impaired egress model; everything else straight out.
    fn queue(&mut self, now: Duration, udp: bool, frame: Vec<u8>) {
        if udp {
            self.egress.enqueue(now, frame);
        } else {
            self.bypass.push_back(frame);
        }
    }
}

/// A learning Ethernet switch with an impaired egress model on every port.
#[derive(Debug)]
pub struct Switch {
    ports: Vec<SwitchPort>,
    macs: HashMap<[u8; 6], usize>,
}

/// True for an IPv4 or IPv6 frame carrying UDP (no IPv4 options or fragments, no IPv6
/// extension headers: what RoCEv2 sends).
fn is_udp(frame: &[u8]) -> bool {
    if frame.len() < ETH_HEADER + 28 {
        return false;
    }
    let ip = &frame[ETH_HEADER..];
    match u16::from_be_bytes([frame[12], frame[13]]) {
        ETHERTYPE_IPV4 => ip[0] == 0x45 && ip[9] == 17,
        ETHERTYPE_IPV6 => ip.len() >= 48 && ip[0] >> 4 == 6 && ip[6] == 17,
        _ => false,
    }
}

impl Switch {
    /// A switch of `ports` ports whose egress queues all follow `link`; port `i`'s faults
    /// come from a generator seeded with `seed + i`.
    pub fn new(ports: usize, link: LinkConfig, seed: u64) -> Self {
        Self {
            ports: (0..ports)
                .map(|i| SwitchPort {
                    egress: Port::new(link, seed.wrapping_add(i as u64), ETH_HEADER),
                    bypass: VecDeque::new(),
                    counters: PortCounters::default(),
                })
                .collect(),
            macs: HashMap::new(),
        }
    }

    /// Number of ports.
    pub fn ports(&self) -> usize {
        self.ports.len()
    }

    /// A frame arrived on port `from` at `now`: learn its source, then queue it on the port
    /// its destination was learned on, or on every other port (broadcast, multicast, unknown).
    pub fn ingress(&mut self, now: Duration, from: usize, mut frame: Vec<u8>) {
        let Some(p) = self.ports.get_mut(from) else {
            return;
        };
        p.counters.rx_frames += 1;
        if frame.len() < ETH_HEADER {
            p.counters.runts += 1;
            return;
        }
        let dst: [u8; 6] = frame[0..6].try_into().unwrap_or_default();
        let src: [u8; 6] = frame[6..12].try_into().unwrap_or_default();
        if src[0] & 1 == 0 {
            self.macs.insert(src, from);
        }
        let udp = is_udp(&frame);
        p.counters.rx_udp += u64::from(udp);
        if matches!(
            u16::from_be_bytes([frame[12], frame[13]]),
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6
        ) {
            // Frames captured on the sending side of a veth may carry a partial UDP or TCP
            // checksum (offload), which the receiving kernel would drop. Complete it (RoCE's
            // ICRC does not cover the UDP checksum).
            monel_wire::frame::fill_l4_checksum(&mut frame[ETH_HEADER..]);
        }
        match self.macs.get(&dst) {
            Some(&to) if dst[0] & 1 == 0 => {
                if to != from {
                    self.ports[to].queue(now, udp, frame);
                }
            }
            _ => {
                // Broadcast, multicast or unknown: every other port gets a copy.
                let n = self.ports.len();
                for to in (0..n).filter(|&i| i != from) {
                    self.ports[to].queue(now, udp, frame.clone());
                }
            }
        }
    }

    /// The next frame to send by `now`: (port, frame).
    pub fn poll_egress(&mut self, now: Duration) -> Option<(usize, Vec<u8>)> {
        for (i, p) in self.ports.iter_mut().enumerate() {
            if let Some(f) = p.bypass.pop_front() {
                p.counters.tx_bypass += 1;
                return Some((i, f));
            }
            if let Some(f) = p.egress.poll_deliver(now) {
                return Some((i, f));
            }
        }
        None
    }

    /// When [`poll_egress`](Self::poll_egress) next has something, if anything is pending
    /// (a time already past means now).
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.ports
            .iter()
            .filter_map(|p| {
                if p.bypass.is_empty() {
                    p.egress.poll_timeout()
                } else {
                    Some(Duration::ZERO)
                }
            })
            .min()
    }

    /// Port `i`'s egress model counters (drops, marks, faults, deepest queue).
    pub fn egress_stats(&self, i: usize) -> LinkStats {
        self.ports[i].egress.stats()
    }

    /// Port `i`'s ingress and bypass counters.
    pub fn counters(&self, i: usize) -> PortCounters {
        self.ports[i].counters
    }

    /// Bytes queued now on port `i`'s egress.
    pub fn queued_bytes(&self, i: usize) -> usize {
        self.ports[i].egress.queued_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const BCAST: [u8; 6] = [0xff; 6];

    fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst);
        f.extend_from_slice(&src);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// An IPv4/UDP frame with ECT(0) and a wrong UDP checksum.
    fn udp(dst: [u8; 6], src: [u8; 6], tag: u8) -> Vec<u8> {
        let mut ip = vec![
            0x45, 0x02, 0, 33, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x12, 0x34,
            0x12, 0xb7, 0, 13, 0xde, 0xad,
        ];
        ip.extend_from_slice(&[tag; 5]);
        monel_wire::frame::Ipv4Header::new_unchecked(&mut ip[..20]).fill_checksum();
        eth(dst, src, ETHERTYPE_IPV4, &ip)
    }

    fn drain(s: &mut Switch, now: Duration) -> Vec<(usize, Vec<u8>)> {
        std::iter::from_fn(|| s.poll_egress(now)).collect()
    }

    #[test]
    fn learns_floods_and_forwards() {
        let mut s = Switch::new(3, LinkConfig::default(), 1);
        let now = Duration::ZERO;
        // Unknown destination: flooded to the other two ports.
        s.ingress(now, 0, eth(BCAST, A, 0x0806, &[1; 28]));
        let out = drain(&mut s, now);
        assert_eq!(out.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [1, 2]);
        // B answers from port 2: now both are known, unicast goes to one port only.
        s.ingress(now, 2, eth(A, B, 0x0806, &[2; 28]));
        assert_eq!(
            drain(&mut s, now)
                .iter()
                .map(|(p, _)| *p)
                .collect::<Vec<_>>(),
            [0]
        );
        s.ingress(now, 0, udp(B, A, 7));
        let later = Duration::from_millis(1);
        let out = drain(&mut s, later);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 2);
        assert_eq!(s.counters(0).rx_udp, 1);
        assert_eq!(s.egress_stats(2).tx_packets, 1);
        assert_eq!(s.counters(2).tx_bypass, 1, "the ARP reply bypassed");
        // The UDP checksum was completed on the way.
        let mut f = out[0].1.clone();
        let sent = [f[40], f[41]];
        assert!(monel_wire::frame::fill_l4_checksum(&mut f[14..]));
        assert_eq!(sent, [f[40], f[41]]);
        assert_ne!(sent, [0xde, 0xad]);
        // A frame for a MAC on its own ingress port is filtered; runts are dropped.
        s.ingress(now, 2, udp(B, B, 1));
        s.ingress(now, 1, vec![0; 5]);
        assert!(drain(&mut s, later).is_empty());
        assert_eq!(s.counters(1).runts, 1);
    }

    #[test]
    fn udp_is_impaired_and_marked_others_are_not() {
        let link = LinkConfig {
            latency: Duration::ZERO,
            loss: 1.0,
            ..LinkConfig::default()
        };
        let mut s = Switch::new(2, link, 5);
        let now = Duration::ZERO;
        s.ingress(now, 1, eth(BCAST, B, 0x0806, &[0; 28]));
        for i in 0..10 {
            s.ingress(now, 0, udp(B, A, i));
            s.ingress(now, 0, eth(B, A, ETHERTYPE_IPV4, &[0x45; 40]));
        }
        let out = drain(&mut s, Duration::from_secs(1));
        // Every UDP frame lost, every non-UDP one through.
        assert_eq!(out.iter().filter(|(p, _)| *p == 1).count(), 10);
        assert!(out.iter().all(|(_, f)| !is_udp(f)));
        assert_eq!(s.egress_stats(1).lost, 10);
    }

    #[test]
    fn queue_depth_marks_ect_frames() {
        let link = LinkConfig {
            latency: Duration::ZERO,
            bandwidth_bps: 1e6,
            ecn: Some(monel_netsim::EcnConfig {
                kmin: 0,
                kmax: 1,
                pmax: 1.0,
            }),
            ..LinkConfig::default()
        };
        let mut s = Switch::new(2, link, 5);
        let now = Duration::ZERO;
        s.ingress(now, 1, eth(BCAST, B, 0x0806, &[0; 28]));
        for i in 0..5 {
            s.ingress(now, 0, udp(B, A, i));
        }
        assert!(s.queued_bytes(1) > 0);
        let out = drain(&mut s, Duration::from_secs(1));
        let ce: Vec<bool> = out
            .iter()
            .filter(|(_, f)| is_udp(f))
            .map(|(_, f)| f[15] & 3 == 3)
            .collect();
        // The first found an empty queue; the rest found it deeper than kmax.
        assert_eq!(ce, [false, true, true, true, true]);
        assert_eq!(s.egress_stats(1).ecn_marked, 4);
        for (_, f) in &out {
            assert!(
                !is_udp(f)
                    || monel_wire::frame::Ipv4Header::new_unchecked(&f[14..34]).verify_checksum()
            );
        }
    }
}
