//! The simulated network: hosts with RC QPs, each on its own pair of links to one switch.
//!
//! ```text
//!  host 0 --uplink--> +--------+ --downlink--> host 0
//!  host 1 --uplink--> | switch | --downlink--> host 1
//!    ...              +--------+      ...
//! ```
//! Every packet is a real RoCEv2 datagram: IPv4, UDP to port 4791, BTH and the rest, and an
//! ICRC computed as rxe does. Receivers check the IPv4 header checksum and the ICRC and drop
//! what fails, as a NIC would; ECN-CE marks made by switch queues reach the engine. Time is
//! virtual and every random choice comes from per-link seeded generators, so a run is a pure
//! function of its seed.

use core::time::Duration;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;

use monel_rc::memory::VecMemory;
use monel_rc::{
    AddressVector, CongestionConfig, Instant, Mtu, QpAttr, QpCaps, QpState, RcQp, WorkCompletion,
};
use monel_wire::frame::{FrameRepr, IpAddress, IpFrame, Ipv4Header};
use monel_wire::pcap::{LINKTYPE_RAW, PcapWriter};
use monel_wire::{Psn, Qpn, ROCE_V2_UDP_PORT};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::link::{Fate, Link, LinkConfig, LinkStats, Node};

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A packet reaches the far end of a link.
    Arrive { link: usize, frame: Vec<u8> },
    /// A link finished serializing its head packet.
    TxDone { link: usize },
    /// A host's QP timers may be due.
    Timer { host: usize },
}

/// A host: memory, QPs, and its NIC's view of them.
#[derive(Debug)]
pub struct Host {
    /// IPv4 address (10.0.0.x).
    pub ip: [u8; 4],
    /// Registered memory.
    pub mem: VecMemory,
    /// QPs, indexed by local handle.
    pub qps: Vec<RcQp>,
    /// Completions seen, with the handle of their QP.
    pub completions: Vec<(usize, WorkCompletion)>,
    /// Packets dropped at receive: bad IP checksum, bad ICRC, unparseable, unknown QP.
    pub rx_dropped: u64,
    /// Of those, ICRC failures.
    pub icrc_drops: u64,
    peers: Vec<[u8; 4]>,
    by_qpn: HashMap<u32, usize>,
    uplink: usize,
    rr: usize,
    timer_at: Option<Instant>,
    next_qpn: u32,
    ident: u16,
}

/// The network and everything on it.
pub struct Network {
    now: Instant,
    seq: u64,
    events: BinaryHeap<Reverse<(Instant, u64, Event)>>,
    links: Vec<Link>,
    hosts: Vec<Host>,
    rng: ChaCha8Rng,
    pcap: Option<PcapWriter<Box<dyn Write>>>,
    buf: Vec<u8>,
    /// Events processed.
    pub events_processed: u64,
}

impl core::fmt::Debug for Network {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Network")
            .field("now", &self.now)
            .field("hosts", &self.hosts.len())
            .finish()
    }
}

/// How to connect two QPs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectConfig {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Retries after timeouts and sequence NAKs.
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code the responder sends.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomics each way.
    pub rd_atomic: u8,
    /// Queue sizes and engine tuning.
    pub caps: QpCaps,
    /// Congestion control.
    pub cc: CongestionConfig,
}

impl Default for ConnectConfig {
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu4096,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            caps: QpCaps::default(),
            cc: CongestionConfig::None,
        }
    }
}

impl Network {
    /// `hosts` hosts on a star, every link configured alike, faults seeded by `seed`.
    pub fn star(hosts: usize, link: LinkConfig, seed: u64) -> Self {
        Self::star_with(hosts, |_, _| link, seed)
    }

    /// Like [`star`](Self::star) with a config per link: `f(host, uplink)` where `uplink` is
    /// true for the host-to-switch direction.
    pub fn star_with(hosts: usize, f: impl Fn(usize, bool) -> LinkConfig, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut links = Vec::new();
        let mut hs = Vec::new();
        for h in 0..hosts {
            for up in [true, false] {
                links.push(Link {
                    cfg: f(h, up),
                    queue: Default::default(),
                    queued_bytes: 0,
                    busy: false,
                    rng: ChaCha8Rng::seed_from_u64(rng.r#gen()),
                    stats: LinkStats::default(),
                    to: if up { Node::Switch } else { Node::Host(h) },
                    l3_offset: 0,
                });
            }
            hs.push(Host {
                ip: [10, 0, 0, h as u8 + 1],
                mem: VecMemory::new(),
                qps: Vec::new(),
                completions: Vec::new(),
                rx_dropped: 0,
                icrc_drops: 0,
                peers: Vec::new(),
                by_qpn: HashMap::new(),
                uplink: 2 * h,
                rr: 0,
                timer_at: None,
                next_qpn: 0x11 + 0x100 * h as u32,
                ident: 0,
            });
        }
        Self {
            now: Instant::ZERO,
            seq: 0,
            events: BinaryHeap::new(),
            links,
            hosts: hs,
            rng,
            pcap: None,
            buf: vec![0; 9000],
            events_processed: 0,
        }
    }

    /// Records every packet a host sends, as raw IP, to `out`.
    pub fn capture(&mut self, out: Box<dyn Write>) -> std::io::Result<()> {
        self.pcap = Some(PcapWriter::new(out, LINKTYPE_RAW)?);
        Ok(())
    }

    /// Current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }
    /// Number of hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }
    /// A host.
    pub fn host(&self, h: usize) -> &Host {
        &self.hosts[h]
    }
    /// A host, mutable (post work, read memory). Call [`kick`](Self::kick) after posting.
    pub fn host_mut(&mut self, h: usize) -> &mut Host {
        &mut self.hosts[h]
    }
    /// Counters of host `h`'s uplink (`true`) or downlink.
    pub fn link_stats(&self, h: usize, uplink: bool) -> LinkStats {
        self.links[2 * h + usize::from(!uplink)].stats
    }
    /// The bytes queued now on host `h`'s downlink (the switch egress port towards it).
    pub fn downlink_queue(&self, h: usize) -> usize {
        self.links[2 * h + 1].queued_bytes
    }

    /// Creates and connects a QP on host `a` to a new QP on host `b`. Returns their handles.
    pub fn connect(&mut self, a: usize, b: usize, cfg: &ConnectConfig) -> (usize, usize) {
        let qa = self.new_qp(a, cfg);
        let qb = self.new_qp(b, cfg);
        let psn_a = Psn::new(self.rng.r#gen());
        let psn_b = Psn::new(self.rng.r#gen());
        let (ip_a, ip_b) = (self.hosts[a].ip, self.hosts[b].ip);
        let (qpn_a, qpn_b) = (self.hosts[a].qps[qa].qpn(), self.hosts[b].qps[qb].qpn());
        bring_up(&mut self.hosts[a].qps[qa], qpn_b, psn_a, psn_b, ip_b, cfg);
        bring_up(&mut self.hosts[b].qps[qb], qpn_a, psn_b, psn_a, ip_a, cfg);
        self.hosts[a].peers[qa] = ip_b;
        self.hosts[b].peers[qb] = ip_a;
        (qa, qb)
    }

    fn new_qp(&mut self, h: usize, cfg: &ConnectConfig) -> usize {
        let host = &mut self.hosts[h];
        let qpn = host.next_qpn;
        host.next_qpn += 1;
        host.qps.push(RcQp::new(Qpn::new(qpn), cfg.caps, cfg.cc));
        host.peers.push([0; 4]);
        host.by_qpn.insert(qpn, host.qps.len() - 1);
        host.qps.len() - 1
    }

    fn push(&mut self, at: Instant, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, e)));
    }

    /// Lets host `h` send what its QPs have (call after posting work).
    pub fn kick(&mut self, h: usize) {
        self.pump(h);
        self.schedule_timer(h);
    }

    /// Processes one event. Returns false if none is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse((at, _, ev))) = self.events.pop() else {
            return false;
        };
        self.now = self.now.max(at);
        self.events_processed += 1;
        match ev {
            Event::TxDone { link } => self.tx_done(link),
            Event::Arrive { link, frame } => match self.links[link].to {
                Node::Switch => self.switch(frame),
                Node::Host(h) => self.receive(h, &frame),
            },
            Event::Timer { host } => {
                if self.hosts[host].timer_at == Some(at) {
                    self.hosts[host].timer_at = None;
                }
                let now = self.now;
                for qp in &mut self.hosts[host].qps {
                    if qp.poll_timeout().is_some_and(|t| t <= now) {
                        qp.handle_timeout(now);
                    }
                }
                self.collect(host);
                self.pump(host);
                self.schedule_timer(host);
            }
        }
        true
    }

    /// Runs until `done` holds, no event is left, or virtual time passes `deadline`.
    /// Returns true if `done` held.
    pub fn run_until(&mut self, deadline: Instant, mut done: impl FnMut(&Self) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.events.peek() {
                Some(Reverse((t, _, _))) if *t <= deadline => {
                    self.step();
                }
                _ => return done(self),
            }
        }
    }

    fn collect(&mut self, h: usize) {
        let host = &mut self.hosts[h];
        for (i, qp) in host.qps.iter_mut().enumerate() {
            while let Some(wc) = qp.poll_completion() {
                host.completions.push((i, wc));
            }
        }
    }

    fn schedule_timer(&mut self, h: usize) {
        let t = self.hosts[h]
            .qps
            .iter()
            .filter_map(RcQp::poll_timeout)
            .min();
        if let Some(t) = t {
            let t = t.max(self.now);
            if self.hosts[h].timer_at.is_none_or(|s| t < s) {
                self.hosts[h].timer_at = Some(t);
                self.push(t, Event::Timer { host: h });
            }
        }
    }

    /// The NIC pulls packets from its QPs while its uplink has room for about two packets.
    fn pump(&mut self, h: usize) {
        let now = self.now;
        loop {
            let up = self.hosts[h].uplink;
            if self.links[up].queued_bytes > 2 * 4200 {
                return;
            }
            let host = &mut self.hosts[h];
            let n = host.qps.len();
            let mut sent = None;
            for k in 0..n {
                let i = (host.rr + k) % n;
                let hdr = 28;
                if let Some(t) = host.qps[i].poll_transmit(now, &mut self.buf[hdr..], &host.mem) {
                    host.rr = (i + 1) % n;
                    host.ident = host.ident.wrapping_add(1);
                    let attr = host.qps[i].attr();
                    let av = attr.ah_attr;
                    let framing = FrameRepr {
                        src: IpAddress::V4(host.ip),
                        dst: IpAddress::V4(host.peers[i]),
                        src_port: udp_sport(host.qps[i].qpn(), attr.dest_qp_num),
                        dst_port: ROCE_V2_UDP_PORT,
                        traffic_class: av.traffic_class,
                        hop_limit: av.hop_limit,
                        ident: host.ident,
                        flow_label: 0,
                    };
                    let total = framing
                        .emit(&mut self.buf, t.len)
                        .expect("engine packets fit");
                    sent = Some(self.buf[..total].to_vec());
                    break;
                }
            }
            self.collect(h);
            let Some(frame) = sent else { return };
            if let Some(p) = &mut self.pcap {
                let _ = p.write_packet(now.as_nanos(), &frame);
            }
            self.send_on(up, frame);
        }
    }

    fn send_on(&mut self, link: usize, frame: Vec<u8>) {
        if self.links[link].enqueue(frame) && !self.links[link].busy {
            self.start_tx(link);
        }
    }

    fn start_tx(&mut self, link: usize) {
        let l = &mut self.links[link];
        let Some(head) = l.queue.front() else { return };
        l.busy = true;
        let d = l.tx_time(head.len());
        let at = self.now + d;
        self.push(at, Event::TxDone { link });
    }

    fn tx_done(&mut self, link: usize) {
        let l = &mut self.links[link];
        l.busy = false;
        let Some(mut frame) = l.queue.pop_front() else {
            return;
        };
        l.queued_bytes -= frame.len();
        l.stats.tx_packets += 1;
        l.stats.tx_bytes += frame.len() as u64;
        let latency = l.cfg.latency;
        if let Fate::Deliver { extra, copies } = l.fate(&mut frame) {
            let at = self.now + latency + extra;
            if copies > 1 {
                self.push(
                    at + Duration::from_nanos(1),
                    Event::Arrive {
                        link,
                        frame: frame.clone(),
                    },
                );
            }
            self.push(at, Event::Arrive { link, frame });
        }
        self.start_tx(link);
        if let Node::Switch = self.links[link].to {
            // An uplink drained a little: the host may send more.
            let h = link / 2;
            self.pump(h);
            self.schedule_timer(h);
        }
    }

    fn switch(&mut self, frame: Vec<u8>) {
        let Ok(h) = Ipv4Header::new_checked(&frame[..]) else {
            return;
        };
        let dst = h.dst();
        if let Some(i) = self.hosts.iter().position(|x| x.ip == dst) {
            self.send_on(2 * i + 1, frame);
        }
    }

    fn receive(&mut self, h: usize, frame: &[u8]) {
        let now = self.now;
        let host = &mut self.hosts[h];
        let parsed = Ipv4Header::new_checked(frame)
            .ok()
            .filter(|ip| ip.verify_checksum())
            .and_then(|_| IpFrame::parse(frame).ok());
        let Some(f) = parsed else {
            host.rx_dropped += 1;
            return;
        };
        if f.check_icrc().is_err() {
            host.rx_dropped += 1;
            host.icrc_drops += 1;
            return;
        }
        let qpn = f.roce().bth().dest_qp().value();
        let Some(&i) = host.by_qpn.get(&qpn) else {
            host.rx_dropped += 1;
            return;
        };
        host.qps[i].handle_packet(now, f.roce().as_bytes(), f.ecn_ce(), &mut host.mem);
        self.collect(h);
        self.pump(h);
        self.schedule_timer(h);
    }
}

/// The UDP source port rxe derives from the QP pair (`rdma_get_udp_sport`).
pub fn udp_sport(lqpn: Qpn, rqpn: Qpn) -> u16 {
    let mut v = u64::from(lqpn.value()) * u64::from(rqpn.value());
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xf_ffff) as u32;
    (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16
}

fn bring_up(
    qp: &mut RcQp,
    remote: Qpn,
    sq_psn: Psn,
    rq_psn: Psn,
    peer: [u8; 4],
    cfg: &ConnectConfig,
) {
    use monel_rc::AccessFlags as A;
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: A::REMOTE_WRITE | A::REMOTE_READ | A::REMOTE_ATOMIC,
        path_mtu: cfg.mtu,
        dest_qp_num: remote,
        rq_psn,
        sq_psn,
        ah_attr: AddressVector {
            dgid: IpAddress::V4(peer).to_gid(),
            hop_limit: 64,
            traffic_class: 0x02, // ECT(0): DCQCN needs ECN-capable packets
            ..Default::default()
        },
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: cfg.rnr_retry,
        min_rnr_timer: cfg.min_rnr_timer,
        max_rd_atomic: cfg.rd_atomic,
        max_dest_rd_atomic: cfg.rd_atomic,
        ..Default::default()
    };
    qp.bring_up(&attr)
        .expect("a fresh QP comes up with a complete attribute set");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_sport_is_symmetric_and_in_range() {
        let a = udp_sport(Qpn::new(0x11), Qpn::new(0x122));
        assert_eq!(a, udp_sport(Qpn::new(0x122), Qpn::new(0x11)));
        assert!(a >= 0xc000);
    }
}
