//! The packet engine: a discrete-event simulation of every packet, for fabrics up to about a
//! thousand endpoints, where the fluid engines cannot see queues, pauses and rate control.
//!
//! * **Links** are output-queued FIFOs with a transmitter: a packet waits in the queue of the
//!   link it leaves on, takes `wire bytes / speed` to serialize and the link's latency to
//!   arrive. Time is integer picoseconds.
//! * **Senders** are NIC queue pairs (one per rank pair, as Monel and NCCL connect them) that
//!   cut their messages into MTU packets; the NIC serves its active QPs round-robin whenever
//!   its port is free, not paused, and the QP's rate limiter allows.
//! * **Switches** share one buffer among their ports. RoCE marks ECN at dequeue with
//!   probability `p(q)` (0 below Kmin, rising to Pmax at Kmax, 1 above) and runs PFC per
//!   ingress port with a dynamic threshold (pause when the port's bytes exceed
//!   `alpha * free buffer`, resume when they fall a resume offset below it); a pause takes
//!   the link's latency to reach the sender, which finishes its packet and stops, so queues
//!   grow upstream and pauses propagate. InfiniBand uses credits: a link sends only while the
//!   receiver has buffer for the packet, and the credit returns one latency after the packet
//!   leaves. Links inside hosts (PCIe, NVLink) always use credits. A packet that finds the
//!   buffer full (lossy RoCE, or PFC without enough headroom) is dropped and its bytes resent
//!   after a timeout (selective repeat).
//! * **DCQCN** is the RC engine's own controller ([`monel_rc::congestion::Dcqcn`], the same
//!   code the soft RNIC runs): the receiver sends a CNP for a CE-marked packet at most once per
//!   `cnp_interval` per QP, the CNP reaches the sender one path latency later (CNPs ride a
//!   high-priority queue, so they are not queued), and the sender paces by its rate.
//! * **Adaptive routing** (InfiniBand AR, Spectrum-X): at every upward hop with a choice, the
//!   packet takes the uplink with the fewest queued bytes; the receiver reassembles out of
//!   order.
//!
//! * **ACKs** (`[fabric] acks = true`): each data packet gets an ACK of the header's size back
//!   along its own links, ahead of data at the NIC and queued with data at switches. Off by
//!   default.
//!
//! Not modelled: go-back-N's waste after a drop, priorities other than the CNP's.
//!
//! This file is longer than the project's thousand-line rule: it is one event loop whose
//! events (a packet's arrival, a transmitter freeing, a pause, a credit, a CNP) all act on the
//! same queues, and splitting it would spread one state machine over files.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use monel_rc::Instant;
use monel_rc::congestion::{Controller, Dcqcn, DcqcnParams};

use crate::cluster::Cluster;
use crate::engine::event::{Job, Message, Progress, ReplayError};
use crate::engine::flow::check_dependencies;
pub use crate::engine::packet_params::*;
use crate::radix::RadixHeap;
use crate::topology::{LinkId, LinkKind};

const NONE: u32 = u32::MAX;
const NEVER: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    TxDone(u32),
    /// A packet reaches the head of the link it crosses (packets travel in their events).
    Arrive(Pkt),
    /// A pause (odd generation) or resume (even) frame; the newest generation wins.
    Pfc(u32, u32),
    Credit(u32, u32),
    Wake(u32),
    Cnp(u32),
    CcTimer(u32),
    Deliver(u32),
    Resend(u32, u32, u32),
    Start(u32),
    Sample,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pkt {
    qp: u32,
    msg: u32,
    payload: u32,
    wire: u32,
    path: u32,
    hop: u16,
    ecn: bool,
    /// The link it arrived on at the node where it now waits.
    ingress: u32,
}

#[derive(Debug, Clone)]
struct Link {
    ps_per_byte: f64,
    latency_ps: u64,
    fc: FlowControl,
    /// Node at its head (`usize::MAX` inside hosts), and whether its tail is a switch.
    head: usize,
    from_switch: bool,
    busy: bool,
    queue: VecDeque<Pkt>,
    queued: u64,
    paused: bool,
    paused_since: u64,
    paused_ps: u64,
    pause_sent: bool,
    pfc_sent: u32,
    pfc_applied: u32,
    ingress_bytes: u64,
    credits: i64,
    wake_at: u64,
    /// QPs starting here whose rate allows a packet, in round-robin order.
    ready: VecDeque<u32>,
    /// QPs starting here waiting for their rate, by when (stale entries skipped).
    waiting: BinaryHeap<Reverse<(u64, u32)>>,
    tx_bytes: u64,
}

/// What the NIC's scheduler touches for every packet a QP sends; the rest is in [`QpInfo`]
/// and its DCQCN state in `Sim::cc`, so that thousands of QPs stay in cache.
struct Qp {
    path: u32,
    /// The message it is sending, and that message's bytes still to send.
    head: u32,
    left: u64,
    active: bool,
    /// When it waits for its rate, the time of its valid `waiting` entry.
    waiting_due: u64,
}

/// A QP's colder state: touched when a message ends, on CNPs and timers.
struct QpInfo {
    src_ep: usize,
    dst_ep: usize,
    sport: u16,
    /// Messages (and resends) queued behind the head.
    more: VecDeque<(u32, u64)>,
    last_cnp: u64,
    timer_at: u64,
    reverse_ps: u64,
    /// The path its receiver's ACKs take back (`NONE` without ACKs).
    ack_path: u32,
    /// Payload bytes delivered (counted only when sampling), and at the last sample.
    delivered: u64,
    sampled: u64,
}

/// A message's sending and receiving ranks (its bytes still to arrive are in `Sim::left`).
struct Msg {
    src: usize,
    dst: usize,
}

enum Driver<'a> {
    Flows {
        left: usize,
        done: Vec<f64>,
        /// Per flow: dependencies not yet delivered, the flows waiting on it, its start.
        waiting: Vec<u32>,
        children: Vec<Vec<u32>>,
        start_ps: Vec<u64>,
    },
    Jobs(Box<Progress<'a>>),
}

struct Sim<'a> {
    cluster: &'a Cluster,
    p: &'a PacketParams,
    now: u64,
    heap: RadixHeap<Kind>,
    links: Vec<Link>,
    used: Vec<u64>,
    buffer: Vec<u64>,
    /// Every path's links, one after another, each path ended by `NONE`; a path's id is
    /// where it starts (so a hop is one lookup).
    hops: Vec<u32>,
    interned: HashMap<Vec<u32>, u32>,
    qps: Vec<Qp>,
    info: Vec<QpInfo>,
    cc: Vec<Option<Dcqcn>>,
    dcqcn: Option<Arc<DcqcnParams>>,
    /// Least time between CNPs for one QP, picoseconds.
    cnp_gap_ps: u64,
    /// When each QP's rate next lets it send, picoseconds.
    due: Vec<u64>,
    tails: Vec<usize>,
    qp_of: HashMap<(usize, usize, usize), u32>,
    msgs: Vec<Msg>,
    /// Each message's bytes still to arrive.
    left: Vec<u64>,
    rng: u64,
    overhead_ps: u64,
    driver: Driver<'a>,
    later: Vec<Message>,
    open: usize,
    out: PacketReport,
    scratch: Vec<LinkId>,
}

/// When a DCQCN pacer next allows a packet, picoseconds (0: now).
fn due_ps(c: &Dcqcn) -> u64 {
    c.next_send_time().map_or(0, |t| t.as_nanos() * 1000)
}

fn ps(s: f64) -> u64 {
    (s * 1e12).round() as u64
}

impl<'a> Sim<'a> {
    fn new(cluster: &'a Cluster, p: &'a PacketParams, driver: Driver<'a>, overhead_s: f64) -> Self {
        let f = &cluster.fabric;
        let tails = f.tails();
        let endpoints = f.hosts();
        let pkt = u64::from(p.mtu + p.header_bytes);
        let links = (0..f.links())
            .map(|l| {
                let bps = f.capacity[l];
                let fc = if f.kind[l] == LinkKind::Host {
                    FlowControl::Credits
                } else {
                    p.flow_control
                };
                let lat = ps(f.latency[l]);
                let bdp = (f.latency[l] * bps / 8.0 * 4.0) as u64;
                let credits = p.credit_bytes.unwrap_or((bdp + 4 * pkt).max(4 * pkt));
                Link {
                    ps_per_byte: 8e12 / bps,
                    latency_ps: lat,
                    fc,
                    head: f.head(l),
                    from_switch: tails[l] != usize::MAX && tails[l] >= endpoints,
                    busy: false,
                    queue: VecDeque::new(),
                    queued: 0,
                    paused: false,
                    paused_since: 0,
                    paused_ps: 0,
                    pause_sent: false,
                    pfc_sent: 0,
                    pfc_applied: 0,
                    ingress_bytes: 0,
                    credits: credits as i64,
                    wake_at: NEVER,
                    ready: VecDeque::new(),
                    waiting: BinaryHeap::new(),
                    tx_bytes: 0,
                }
            })
            .collect();
        let buffer = (0..f.nodes())
            .map(|n| {
                if n < endpoints {
                    p.nic_buffer_bytes
                } else {
                    p.switch_buffer_bytes
                }
            })
            .collect();
        Self {
            cluster,
            p,
            now: 0,
            heap: RadixHeap::new(),
            links,
            used: vec![0; f.nodes()],
            buffer,
            hops: Vec::new(),
            interned: HashMap::new(),
            qps: Vec::new(),
            info: Vec::new(),
            cc: Vec::new(),
            dcqcn: p.dcqcn.map(Arc::new),
            cnp_gap_ps: p
                .dcqcn
                .map_or(0, |d| d.cnp_interval.as_nanos() as u64 * 1000),
            due: Vec::new(),
            tails,
            qp_of: HashMap::new(),
            msgs: Vec::new(),
            left: Vec::new(),
            rng: p.seed ^ 0x9e37_79b9_7f4a_7c15,
            overhead_ps: ps(overhead_s),
            driver,
            later: Vec::new(),
            open: 0,
            out: PacketReport::default(),
            scratch: Vec::new(),
        }
    }

    fn push(&mut self, t: u64, kind: Kind) {
        self.heap.push(t, kind);
    }

    fn random(&mut self) -> f64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn intern(&mut self, path: &[LinkId]) -> u32 {
        let key: Vec<u32> = path.iter().map(|&l| l as u32).collect();
        if let Some(&id) = self.interned.get(&key) {
            return id;
        }
        let id = self.hops.len() as u32;
        self.hops.extend_from_slice(&key);
        self.hops.push(NONE);
        self.interned.insert(key, id);
        id
    }

    /// Posts a message; returns false when it needs no packets (delivered by the caller).
    fn post(&mut self, key: (usize, usize, usize), m: &Message) -> bool {
        self.scratch.clear();
        let mut path = std::mem::take(&mut self.scratch);
        self.cluster.route(m.from, m.to, m.rail, m.sport, &mut path);
        let id = self.msgs.len() as u32;
        self.msgs.push(Msg {
            src: m.src,
            dst: m.dst,
        });
        self.left.push(m.bytes);
        self.open += 1;
        if path.is_empty() || m.bytes == 0 {
            let at = self.now + ps(self.cluster.latency(&path)) + self.overhead_ps;
            self.scratch = path;
            self.push(at, Kind::Deliver(id));
            return false;
        }
        let qp = match self.qp_of.get(&key) {
            Some(&q) => q,
            None => {
                let f = &self.cluster.fabric;
                let fabric: Vec<LinkId> = path
                    .iter()
                    .copied()
                    .filter(|&l| f.kind[l] != LinkKind::Host)
                    .collect();
                let tails_src = fabric.first().map(|&l| self.tails[l]);
                let cc = (self.dcqcn.as_ref())
                    .filter(|_| !fabric.is_empty())
                    .map(|p| Dcqcn::shared(p.clone()));
                let q = self.qps.len() as u32;
                let pid = self.intern(&path);
                let ack_path = if self.p.acks {
                    let back = self.cluster.reverse(&path);
                    self.intern(&back)
                } else {
                    NONE
                };
                self.info.push(QpInfo {
                    src_ep: tails_src.unwrap_or(usize::MAX),
                    dst_ep: fabric.last().map_or(usize::MAX, |&l| f.head(l)),
                    sport: m.sport,
                    more: VecDeque::new(),
                    last_cnp: 0,
                    timer_at: NEVER,
                    reverse_ps: ps(self.cluster.latency(&path)),
                    ack_path,
                    delivered: 0,
                    sampled: 0,
                });
                self.cc.push(cc);
                self.qps.push(Qp {
                    path: pid,
                    head: NONE,
                    left: 0,
                    active: false,
                    waiting_due: NEVER,
                });
                self.qp_of.insert(key, q);
                self.due.push(0);
                q
            }
        };
        self.scratch = path;
        self.enqueue_bytes(qp, id, m.bytes, false);
        true
    }

    /// Caches when `qp`'s rate next lets it send (its rate changed, or it sent).
    fn refresh_due(&mut self, qp: u32) {
        self.due[qp as usize] = self.cc[qp as usize].as_ref().map_or(0, due_ps);
    }

    fn enqueue_bytes(&mut self, qp: u32, msg: u32, bytes: u64, front: bool) {
        let q = &mut self.qps[qp as usize];
        let src = self.hops[q.path as usize] as usize;
        if q.active {
            let more = &mut self.info[qp as usize].more;
            if front {
                more.push_front((q.head, q.left));
                (q.head, q.left) = (msg, bytes);
            } else {
                more.push_back((msg, bytes));
            }
        } else {
            (q.head, q.left) = (msg, bytes);
            q.active = true;
            self.line_up(src, qp);
        }
        self.kick(src);
    }

    /// Puts an active QP in its link's ready list, or its waiting heap until its rate allows.
    fn line_up(&mut self, l: usize, qp: u32) {
        let due = self.due[qp as usize];
        let q = &mut self.qps[qp as usize];
        let link = &mut self.links[l];
        if due <= self.now {
            q.waiting_due = NEVER;
            link.ready.push_back(qp);
        } else {
            q.waiting_due = due;
            link.waiting.push(Reverse((due, qp)));
        }
    }

    /// `qp`'s rate changed: re-files it if it waits.
    fn rate_changed(&mut self, qp: u32) {
        self.refresh_due(qp);
        let q = &self.qps[qp as usize];
        if q.active && q.waiting_due != NEVER && q.waiting_due != self.due[qp as usize] {
            let src = self.source(qp);
            self.line_up(src, qp);
        }
    }

    /// Starts the next transmission on link `l` if it can.
    fn kick(&mut self, l: usize) {
        let link = &self.links[l];
        if link.busy || link.paused {
            return;
        }
        if let Some(pk) = link.queue.front() {
            let wire = pk.wire;
            if link.fc == FlowControl::Credits && link.credits < i64::from(wire) {
                return;
            }
            let link = &mut self.links[l];
            let mut pk = link.queue.pop_front().expect("checked");
            let before = link.queued;
            link.queued -= u64::from(wire);
            if link.from_switch
                && let Some(e) = self.p.ecn
            {
                let prob = e.probability(before);
                if prob > 0.0 && (prob >= 1.0 || self.random() < prob) {
                    pk.ecn = true;
                    self.out.ecn_marks += 1;
                }
            }
            self.release(pk.ingress as usize, wire);
            self.transmit(l, pk);
            return;
        }
        // The NIC serves its QPs round-robin, each when its rate allows.
        let now = self.now;
        let link = &mut self.links[l];
        while let Some(&Reverse((due, qp))) = link.waiting.peek() {
            if due > now {
                break;
            }
            link.waiting.pop();
            let q = &mut self.qps[qp as usize];
            if q.active && q.waiting_due == due {
                q.waiting_due = NEVER;
                link.ready.push_back(qp);
            }
        }
        let qp = loop {
            let Some(&qp) = self.links[l].ready.front() else {
                let next = self.links[l].waiting.peek().map(|r| r.0.0);
                if let Some(at) = next
                    && self.links[l].wake_at != at
                {
                    self.links[l].wake_at = at;
                    self.push(at, Kind::Wake(l as u32));
                }
                return;
            };
            if self.due[qp as usize] <= now {
                break qp;
            }
            // Its rate was cut since it lined up.
            self.links[l].ready.pop_front();
            self.line_up(l, qp);
        };
        let now_ns = Instant::from_nanos(now / 1000);
        let q = &self.qps[qp as usize];
        let (msg, left) = (q.head, q.left);
        let payload = left.min(u64::from(self.p.mtu)) as u32;
        let wire = payload + self.p.header_bytes;
        let link = &self.links[l];
        if link.fc == FlowControl::Credits && link.credits < i64::from(wire) {
            return;
        }
        self.links[l].ready.pop_front();
        let path = q.path;
        if let Some(c) = self.cc[qp as usize].as_mut() {
            c.on_sent(now_ns, wire as usize);
            self.due[qp as usize] = due_ps(c);
        }
        let q = &mut self.qps[qp as usize];
        q.left -= u64::from(payload);
        let more = q.left > 0
            || match self.info[qp as usize].more.pop_front() {
                Some(next) => {
                    (q.head, q.left) = next;
                    true
                }
                None => false,
            };
        if more {
            self.line_up(l, qp);
        } else {
            q.active = false;
            q.waiting_due = NEVER;
        }
        let pkt = Pkt {
            qp,
            msg,
            payload,
            wire,
            path,
            hop: 0,
            ecn: false,
            ingress: NONE,
        };
        self.out.packets += 1;
        self.transmit(l, pkt);
    }

    fn transmit(&mut self, l: usize, pk: Pkt) {
        let wire = pk.wire;
        let link = &mut self.links[l];
        link.busy = true;
        if link.fc == FlowControl::Credits {
            link.credits -= i64::from(wire);
        }
        link.tx_bytes += u64::from(wire);
        let ser = (f64::from(wire) * link.ps_per_byte).round() as u64;
        let (done, arrive) = (self.now + ser, self.now + ser + link.latency_ps);
        self.push(done, Kind::TxDone(l as u32));
        self.push(arrive, Kind::Arrive(pk));
    }

    fn xoff(&self, node: usize) -> u64 {
        if let Some(x) = self.p.pfc_xoff_bytes {
            return x;
        }
        (self.p.pfc_alpha * self.buffer[node].saturating_sub(self.used[node]) as f64) as u64
    }

    /// A packet that arrived on `ingress` left its node.
    fn release(&mut self, ingress: usize, wire: u32) {
        if ingress == NONE as usize {
            return;
        }
        let w = u64::from(wire);
        let link = &self.links[ingress];
        match link.fc {
            FlowControl::Credits => {
                let at = self.now + link.latency_ps;
                self.push(at, Kind::Credit(ingress as u32, wire));
            }
            FlowControl::Lossy => self.used[link.head] -= w,
            FlowControl::Pfc => {
                let node = link.head;
                self.used[node] -= w;
                self.links[ingress].ingress_bytes -= w;
                let link = &self.links[ingress];
                if link.pause_sent
                    && (link.ingress_bytes == 0
                        || link.ingress_bytes + self.p.pfc_resume_bytes <= self.xoff(node))
                {
                    let at = self.now + link.latency_ps;
                    let link = &mut self.links[ingress];
                    link.pause_sent = false;
                    link.pfc_sent += 1;
                    let generation = link.pfc_sent;
                    self.push(at, Kind::Pfc(ingress as u32, generation));
                }
            }
        }
    }

    /// A packet arrived at the node at the head of `ingress`; false if it was dropped.
    fn admit(&mut self, ingress: usize, wire: u32) -> bool {
        let link = &self.links[ingress];
        if link.fc == FlowControl::Credits {
            return true;
        }
        let node = link.head;
        let w = u64::from(wire);
        if self.used[node] + w > self.buffer[node] {
            self.out.drops += 1;
            return false;
        }
        self.used[node] += w;
        if node >= self.cluster.fabric.hosts() {
            self.out.max_buffer_bytes = self.out.max_buffer_bytes.max(self.used[node]);
        }
        if link.fc == FlowControl::Pfc {
            self.links[ingress].ingress_bytes += w;
            let link = &self.links[ingress];
            if !link.pause_sent && link.ingress_bytes > self.xoff(node) {
                let at = self.now + link.latency_ps;
                let link = &mut self.links[ingress];
                link.pause_sent = true;
                link.pfc_sent += 1;
                let generation = link.pfc_sent;
                self.out.pauses += 1;
                self.push(at, Kind::Pfc(ingress as u32, generation));
            }
        }
        true
    }

    fn arrive(&mut self, mut p: Pkt) {
        let at = p.path as usize + p.hop as usize;
        let (l, next) = (self.hops[at] as usize, self.hops[at + 1]);
        let hop = p.hop as usize + 1;
        if next == NONE {
            // At the receiving GPU.
            if self.links[l].fc == FlowControl::Credits {
                let at = self.now + self.links[l].latency_ps;
                self.push(at, Kind::Credit(l as u32, p.wire));
            }
            if p.msg == NONE {
                return; // an ACK, home
            }
            self.acknowledge(&p);
            if self.p.sample_s.is_some() {
                self.info[p.qp as usize].delivered += u64::from(p.payload);
            }
            self.out.bytes += u64::from(p.payload);
            if p.ecn && self.cc[p.qp as usize].is_some() {
                let q = &mut self.info[p.qp as usize];
                if q.last_cnp == 0 || self.now >= q.last_cnp + self.cnp_gap_ps {
                    q.last_cnp = self.now.max(1);
                    self.out.cnps += 1;
                    let at = self.now + q.reverse_ps;
                    self.push(at, Kind::Cnp(p.qp));
                }
            }
            let left = &mut self.left[p.msg as usize];
            *left -= u64::from(p.payload);
            if *left == 0 {
                let at = self.now + self.overhead_ps;
                self.push(at, Kind::Deliver(p.msg));
            }
            return;
        };
        let mut next = next as usize;
        if !self.admit(l, p.wire) {
            if p.msg == NONE {
                return; // a lost ACK: the next one covers it
            }
            let at = self.now + ps(self.p.rto_s);
            self.push(at, Kind::Resend(p.qp, p.msg, p.payload));
            return;
        }
        if self.p.adaptive_routing {
            next = self.adapt(&mut p, l, hop, next);
        }
        p.hop = hop as u16;
        p.ingress = l as u32;
        let link = &mut self.links[next];
        link.queue.push_back(p);
        link.queued += u64::from(p.wire);
        self.out.max_queue_bytes = self.out.max_queue_bytes.max(link.queued);
        self.kick(next);
    }

    /// Sends the ACK of data packet `p`, which just reached its receiver, ahead of the
    /// receiver's own data at its NIC.
    fn acknowledge(&mut self, p: &Pkt) {
        let path = self.info[p.qp as usize].ack_path;
        if path == NONE || self.hops[path as usize] == NONE {
            return;
        }
        let ack = Pkt {
            qp: p.qp,
            msg: NONE,
            payload: 0,
            wire: self.p.header_bytes.max(1),
            path,
            hop: 0,
            ecn: false,
            ingress: NONE,
        };
        let l = self.hops[path as usize] as usize;
        let link = &mut self.links[l];
        link.queue.push_back(ack);
        link.queued += u64::from(ack.wire);
        self.out.acks += 1;
        self.kick(l);
    }

    /// Adaptive routing at the node `l` leads to: the least-loaded uplink, if `next` is one.
    fn adapt(&mut self, p: &mut Pkt, l: usize, hop: usize, next: usize) -> usize {
        let f = &self.cluster.fabric;
        let node = self.links[l].head;
        if node == usize::MAX {
            return next;
        }
        let ups = f.up_links(node);
        if ups.len() < 2 || !ups.contains(&next) {
            return next;
        }
        let load = |x: usize| self.links[x].queued + u64::from(self.links[x].busy);
        let best = ups
            .iter()
            .copied()
            .min_by_key(|&x| (load(x), x != next))
            .expect("two or more");
        if best == next {
            return next;
        }
        let q = &self.info[p.qp as usize];
        let old = self.path(p.path);
        let mut path: Vec<LinkId> = old[..hop].iter().map(|&x| x as usize).collect();
        path.push(best);
        f.route_from(f.head(best), q.src_ep, q.dst_ep, q.sport, &mut path);
        if let Some(&last) = old.last()
            && f.kind[last as usize] == LinkKind::Host
        {
            path.push(last as usize);
        }
        let id = self.intern(&path);
        p.path = id;
        best
    }

    /// When `qp`'s DCQCN timer is due, picoseconds.
    fn timer_due(&self, qp: u32) -> u64 {
        self.cc[qp as usize]
            .as_ref()
            .and_then(|c| c.poll_timeout())
            .map_or(NEVER, |t| (t.as_nanos() * 1000).max(self.now))
    }

    /// Makes sure a timer event wakes `qp` no later than its DCQCN timer is due. A timer
    /// that moved later keeps its earlier event (which then finds nothing due and re-arms),
    /// so each QP has about one event in the queue instead of one per rate cut.
    fn arm(&mut self, qp: u32) {
        let at = self.timer_due(qp);
        let q = &mut self.info[qp as usize];
        if at < q.timer_at {
            q.timer_at = at;
            self.push(at, Kind::CcTimer(qp));
        }
    }

    /// The links of path `id`.
    fn path(&self, id: u32) -> &[u32] {
        let rest = &self.hops[id as usize..];
        &rest[..rest.iter().position(|&l| l == NONE).expect("ended")]
    }

    fn source(&self, qp: u32) -> usize {
        self.hops[self.qps[qp as usize].path as usize] as usize
    }

    fn deliver(&mut self, msg: u32, posted: &mut Vec<Message>) {
        self.open -= 1;
        self.out.messages += 1;
        self.out.time_s = self.now as f64 * 1e-12;
        let (src, dst) = (self.msgs[msg as usize].src, self.msgs[msg as usize].dst);
        let mut ready = Vec::new();
        match &mut self.driver {
            Driver::Flows {
                left,
                done,
                waiting,
                children,
                start_ps,
            } => {
                done[src] = self.now as f64 * 1e-12;
                *left -= 1;
                for &c in &children[src] {
                    waiting[c as usize] -= 1;
                    if waiting[c as usize] == 0 {
                        ready.push((start_ps[c as usize].max(self.now), c));
                    }
                }
            }
            Driver::Jobs(progress) => {
                progress.deliver(src, dst);
                progress.run(posted);
                for j in progress.jobs_done.drain(..) {
                    self.out.job_time_s[j] = self.now as f64 * 1e-12;
                }
            }
        }
        for (at, c) in ready {
            self.push(at, Kind::Start(c));
        }
        self.post_all(posted);
    }

    fn post_all(&mut self, posted: &mut Vec<Message>) {
        for m in posted.drain(..) {
            self.post((m.job, m.src, m.dst), &m);
        }
    }

    fn finished(&self) -> bool {
        self.open == 0
            && match &self.driver {
                Driver::Flows { left, .. } => *left == 0,
                Driver::Jobs(p) => p.finished(),
            }
    }

    fn sample(&mut self, period: u64) {
        let dt = period as f64 * 1e-12;
        let mut s = Sample {
            t_s: self.now as f64 * 1e-12,
            rate_bps: Vec::with_capacity(self.qps.len()),
            goodput_bps: Vec::with_capacity(self.qps.len()),
        };
        for (i, c) in self.info.iter_mut().zip(&self.cc) {
            let line = c.as_ref().map_or(0.0, |c| c.rate_bps());
            s.rate_bps.push(line);
            s.goodput_bps
                .push((i.delivered - i.sampled) as f64 * 8.0 / dt);
            i.sampled = i.delivered;
        }
        self.out.samples.push(s);
    }

    fn run(mut self) -> Result<PacketReport, PacketError> {
        let mut posted = Vec::new();
        if let Driver::Jobs(progress) = &mut self.driver {
            progress.run(&mut posted);
        }
        self.post_all(&mut posted);
        let sample = self.p.sample_s.map(ps);
        if let Some(s) = sample {
            self.push(s, Kind::Sample);
        }
        while let Some((t, kind)) = self.heap.pop() {
            if self.finished() {
                break;
            }
            self.now = t;
            self.out.events += 1;
            match kind {
                Kind::TxDone(l) => {
                    self.links[l as usize].busy = false;
                    self.kick(l as usize);
                }
                Kind::Arrive(pk) => self.arrive(pk),
                Kind::Pfc(l, generation) => {
                    let link = &mut self.links[l as usize];
                    if generation <= link.pfc_applied {
                        self.out.events -= 1;
                        continue;
                    }
                    link.pfc_applied = generation;
                    let on = generation % 2 == 1;
                    if on && !link.paused {
                        link.paused = true;
                        link.paused_since = self.now;
                    } else if !on && link.paused {
                        link.paused = false;
                        link.paused_ps += self.now - link.paused_since;
                        self.kick(l as usize);
                    }
                }
                Kind::Credit(l, bytes) => {
                    self.links[l as usize].credits += i64::from(bytes);
                    self.kick(l as usize);
                }
                Kind::Wake(l) => {
                    if self.links[l as usize].wake_at != t {
                        self.out.events -= 1;
                        continue;
                    }
                    self.links[l as usize].wake_at = NEVER;
                    self.kick(l as usize);
                }
                Kind::Cnp(qp) => {
                    let now = Instant::from_nanos(self.now / 1000);
                    if let Some(c) = self.cc[qp as usize].as_mut() {
                        c.on_cnp(now);
                    }
                    self.rate_changed(qp);
                    self.arm(qp);
                }
                Kind::CcTimer(qp) => {
                    if self.info[qp as usize].timer_at != t {
                        self.out.events -= 1;
                        continue;
                    }
                    self.info[qp as usize].timer_at = NEVER;
                    if self.timer_due(qp) > t {
                        // Early: its timer moved later since this was queued.
                        self.out.events -= 1;
                        self.arm(qp);
                        continue;
                    }
                    let now = Instant::from_nanos(self.now / 1000);
                    if let Some(c) = self.cc[qp as usize].as_mut() {
                        c.handle_timeout(now);
                    }
                    self.rate_changed(qp);
                    self.arm(qp);
                    let src = self.source(qp);
                    self.kick(src);
                }
                Kind::Deliver(m) => self.deliver(m, &mut posted),
                Kind::Resend(qp, msg, bytes) => {
                    self.enqueue_bytes(qp, msg, u64::from(bytes), true);
                }
                Kind::Start(f) => {
                    let m = self.later[f as usize];
                    self.post((m.job, m.src, m.dst), &m);
                }
                Kind::Sample => {
                    if let Some(s) = sample {
                        self.sample(s);
                        // Only while something else is still to happen.
                        if !self.heap.is_empty() {
                            self.push(self.now + s, Kind::Sample);
                        }
                    }
                }
            }
        }
        if !self.finished() {
            if let Driver::Jobs(progress) = &self.driver
                && let Some(e) = progress.leftover()
            {
                return Err(e.into());
            }
            return Err(PacketError::Replay(ReplayError::Deadlock(format!(
                "{} messages never arrived",
                self.open
            ))));
        }
        for l in &mut self.links {
            if l.paused {
                l.paused_ps += self.now - l.paused_since;
            }
        }
        self.out.paused_s = self
            .links
            .iter()
            .map(|l| l.paused_ps as f64 * 1e-12)
            .collect();
        self.out.link_bytes = self.links.iter().map(|l| l.tx_bytes).collect();
        self.out.qps = self.qps.len();
        let f = &self.cluster.fabric;
        let fabric: Vec<usize> = (0..f.links())
            .filter(|&l| f.kind[l] == LinkKind::Fabric)
            .collect();
        let mut per_link: HashMap<u32, usize> = HashMap::new();
        for q in &self.qps {
            for &l in self.path(q.path) {
                if f.kind[l as usize] == LinkKind::Fabric {
                    *per_link.entry(l).or_default() += 1;
                }
            }
        }
        self.out.max_qps_per_fabric_link = per_link.values().copied().max().unwrap_or(0);
        let time = self.out.time_s;
        if !fabric.is_empty() && time > 0.0 {
            let busy: f64 = fabric
                .iter()
                .map(|&l| self.links[l].tx_bytes as f64 * 8.0 / (f.capacity[l] * time))
                .sum();
            self.out.fabric_utilization = Some(busy / fabric.len() as f64);
        }
        if let Driver::Flows { done, .. } = &mut self.driver {
            self.out.flow_done_s = std::mem::take(done);
        }
        Ok(self.out)
    }
}

/// Simulates explicit transfers (incast, permutations, background traffic) packet by packet;
/// each flow is its own QP.
pub fn simulate_flows(
    cluster: &Cluster,
    flows: &[Flow],
    params: &PacketParams,
) -> Result<PacketReport, PacketError> {
    simulate_dependent_flows(cluster, flows, &[], params)
}

/// [`simulate_flows`] where flow `i` starts only once every flow in `after[i]` is delivered
/// (and not before its own start time): collectives and pipelines as flow lists. `after` is
/// empty (no dependencies) or has one entry per flow; dependencies must not form a cycle.
pub fn simulate_dependent_flows(
    cluster: &Cluster,
    flows: &[Flow],
    after: &[Vec<usize>],
    params: &PacketParams,
) -> Result<PacketReport, PacketError> {
    params.check()?;
    for (i, f) in flows.iter().enumerate() {
        if f.from >= cluster.gpus() || f.to >= cluster.gpus() {
            return Err(PacketError::Invalid {
                field: "packet.flow",
                why: format!(
                    "flow {i}: GPU {} -> {} outside the cluster's {}",
                    f.from,
                    f.to,
                    cluster.gpus()
                ),
            });
        }
        if !(f.start_s >= 0.0 && f.start_s.is_finite()) {
            return Err(PacketError::Invalid {
                field: "packet.flow",
                why: format!("flow {i}: start {} s: want a time from 0", f.start_s),
            });
        }
    }
    if !after.is_empty() && after.len() != flows.len() {
        return Err(PacketError::Invalid {
            field: "packet.after",
            why: format!("{} dependency lists for {} flows", after.len(), flows.len()),
        });
    }
    check_dependencies(flows.len(), |i| after.get(i).map_or(&[][..], Vec::as_slice)).map_err(
        |e| PacketError::Invalid {
            field: "packet.after",
            why: e.to_string(),
        },
    )?;
    let mut waiting = vec![0u32; flows.len()];
    let mut children = vec![Vec::new(); flows.len()];
    for (i, deps) in after.iter().enumerate() {
        waiting[i] = deps.len() as u32;
        for &d in deps {
            children[d].push(i as u32);
        }
    }
    let start_ps: Vec<u64> = flows.iter().map(|f| ps(f.start_s)).collect();
    let first: Vec<usize> = (0..flows.len()).filter(|&i| waiting[i] == 0).collect();
    let driver = Driver::Flows {
        left: flows.len(),
        done: vec![0.0; flows.len()],
        waiting,
        children,
        start_ps: start_ps.clone(),
    };
    let mut sim = Sim::new(cluster, params, driver, 0.0);
    for (i, f) in flows.iter().enumerate() {
        sim.later.push(Message {
            job: usize::MAX,
            src: i,
            dst: i,
            from: f.from,
            to: f.to,
            bytes: f.bytes,
            sport: f.sport,
            rail: f.rail,
        });
    }
    for i in first {
        sim.push(start_ps[i], Kind::Start(i as u32));
    }
    sim.run()
}

/// Replays `jobs` (collective schedules, as [`crate::replay()`] does) packet by packet;
/// `overhead_s` per message.
pub fn simulate_jobs(
    cluster: &Cluster,
    jobs: &[Job],
    params: &PacketParams,
    overhead_s: f64,
) -> Result<PacketReport, PacketError> {
    params.check()?;
    let progress = Progress::new(cluster, jobs)?;
    let mut sim = Sim::new(
        cluster,
        params,
        Driver::Jobs(Box::new(progress)),
        overhead_s,
    );
    sim.out.job_time_s = vec![0.0; jobs.len()];
    sim.run()
}
