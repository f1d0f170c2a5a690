//! An RC queue pair: the sans-IO object the rest of Monel drives.
//!
//! Method kinds, in quinn-proto's contract:
//! * getters: [`RcQp::state`], [`RcQp::attr`], [`RcQp::stats`], ...
//! * inputs: [`RcQp::handle_packet`], [`RcQp::handle_timeout`];
//! * commands: [`RcQp::modify`], [`RcQp::post_send`], [`RcQp::post_recv`];
//! * outputs, to poll in this order after every input or command:
//!   [`RcQp::poll_transmit`] until `None`, [`RcQp::poll_timeout`], [`RcQp::poll_completion`],
//!   [`RcQp::poll_event`].

use std::collections::VecDeque;

use monel_wire::cnp::{CNP_LEN, cnp_repr};
use monel_wire::{Opcode, PKey, Qpn, RocePacket, Transport};

use crate::ModifyError;
use crate::attr::{AttrMask, QpAttr, QpState, check_modify};
use crate::congestion::{AnyController, CongestionConfig, Controller, ControllerMetrics};
use crate::memory::MemoryAccess;
use crate::requester::{Requester, TxBlock};
use crate::responder::Responder;
use crate::stats::QpStats;
use crate::time::{Instant, ack_timeout, earliest};
use crate::wr::{PostError, RecvWr, SendWr, WorkCompletion};

/// Limits fixed at creation (`ibv_qp_cap` plus engine tuning).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Device limit for `max_rd_atomic` and `max_dest_rd_atomic`.
    pub max_rd_atomic: u8,
    /// Most PSNs in flight before the requester waits (rxe: 128).
    pub max_unacked_psns: u32,
    /// Ask for an ACK at least every this many packets (rxe: 64).
    pub ack_req_every: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 8,
            max_recv_sge: 8,
            max_rd_atomic: 16,
            max_unacked_psns: 128,
            ack_req_every: 64,
        }
    }
}

/// Asynchronous events (`ibv_event_type`, the QP ones).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// The first packet arrived while in RTR.
    CommEstablished,
    /// The send queue drained after a move to SQD.
    SqDrained,
    /// The QP went to ERR because of an error completion.
    QpFatal,
}

/// What [`RcQp::poll_transmit`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes of the RoCE packet, BTH through the 4 zeroed ICRC bytes the framing fills.
    pub len: usize,
    /// What kind of packet it is.
    pub kind: TransmitKind,
}

/// Kind of an outgoing packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransmitKind {
    /// A request (SEND, WRITE, READ request, atomic).
    Request,
    /// An ACK, NAK, atomic ACK or READ response.
    Response,
    /// A congestion notification packet.
    Cnp,
}

/// A reliable-connection queue pair.
#[derive(Debug)]
pub struct RcQp {
    qpn: Qpn,
    state: QpState,
    attr: QpAttr,
    caps: QpCaps,
    req: Requester,
    resp: Responder,
    cc_config: CongestionConfig,
    cc: AnyController,
    send_cq: VecDeque<WorkCompletion>,
    recv_cq: VecDeque<WorkCompletion>,
    events: VecDeque<QpEvent>,
    stats: QpStats,
    established: bool,
    drained_notified: bool,
    paced_until: Option<Instant>,
}

impl RcQp {
    /// A QP in RESET.
    pub fn new(qpn: Qpn, caps: QpCaps, cc: CongestionConfig) -> Self {
        let mut resp = Responder::new(qpn, caps.max_recv_wr as usize, caps.max_recv_sge as usize);
        let mut req = Requester::new(qpn, caps.max_send_wr as usize, caps.max_send_sge as usize);
        req.max_unacked = caps.max_unacked_psns.max(1);
        req.ack_req_every = caps.ack_req_every.max(1);
        if let CongestionConfig::Dcqcn(p) = cc {
            resp.cnp_interval = p.cnp_interval;
        }
        Self {
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            caps,
            req,
            resp,
            cc_config: cc,
            cc: cc.build(),
            send_cq: VecDeque::new(),
            recv_cq: VecDeque::new(),
            events: VecDeque::new(),
            stats: QpStats::default(),
            established: false,
            drained_notified: false,
            paced_until: None,
        }
    }

    /// This QP's number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Current attributes (`ibv_query_qp`).
    pub fn attr(&self) -> QpAttr {
        QpAttr {
            qp_state: self.state,
            cur_qp_state: self.state,
            ..self.attr
        }
    }
    /// Creation limits.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }
    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.stats
    }
    /// Congestion controller metrics.
    pub fn congestion(&self) -> ControllerMetrics {
        self.cc.metrics()
    }
    /// Send WQEs not yet completed.
    pub fn outstanding_sends(&self) -> usize {
        self.req.sq.len()
    }
    /// Receive WQEs posted and not yet consumed.
    pub fn posted_recvs(&self) -> usize {
        self.resp.rq.len()
    }

    /// `ibv_modify_qp`: moves through the RC state machine, checking the attribute mask.
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        let to = check_modify(self.state, attr, mask, self.caps.max_rd_atomic)?;
        let a = &mut self.attr;
        if mask.contains(AttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(AttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(AttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(AttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(AttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(AttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(AttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if mask.contains(AttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        let a = self.attr;
        // Push attributes into the two halves.
        let mtu = a.path_mtu.bytes();
        self.resp.mtu = mtu;
        self.resp.dest_qp = a.dest_qp_num;
        self.resp.min_rnr_timer = a.min_rnr_timer;
        self.resp.max_dest_rd_atomic = a.max_dest_rd_atomic;
        self.resp.access = a.qp_access_flags;
        self.req.dest_qp = a.dest_qp_num;
        self.req.timeout = ack_timeout(a.timeout);
        self.req.retry_cnt = a.retry_cnt;
        self.req.rnr_retry = a.rnr_retry;
        self.req.max_rd_atomic = a.max_rd_atomic;
        if !self.req.outstanding() {
            self.req.mtu = mtu;
        }
        let from = self.state;
        self.state = to;
        match (from, to) {
            (_, QpState::Reset) => self.reset(),
            (_, QpState::Err) if from != QpState::Err => self.enter_error(false),
            (QpState::Init, QpState::Rtr) => {
                self.resp.psn = a.rq_psn;
            }
            (QpState::Rtr, QpState::Rts) => {
                self.req.start_at(a.sq_psn);
                self.req.retries_left = a.retry_cnt;
                self.req.rnr_left = a.rnr_retry;
            }
            (QpState::Rts, QpState::Sqd) => {
                self.req.draining = true;
                self.drained_notified = false;
                self.check_drained();
            }
            (QpState::Sqd, QpState::Rts) => self.req.draining = false,
            _ => {}
        }
        Ok(())
    }

    /// Takes a QP from RESET to RTS in the three standard steps (INIT, RTR, RTS), each with
    /// exactly the attributes the RC state table requires, taken from `attr` (its `qp_state`
    /// is ignored). What a connection manager does once both sides know each other.
    pub fn bring_up(&mut self, attr: &QpAttr) -> Result<(), ModifyError> {
        for to in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let (required, _) = crate::attr::transition_masks(self.state, to).ok_or(
                ModifyError::InvalidTransition {
                    from: self.state,
                    to,
                },
            )?;
            self.modify(
                &QpAttr {
                    qp_state: to,
                    ..*attr
                },
                AttrMask::STATE | required,
            )?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        let caps = self.caps;
        let mut req = Requester::new(
            self.qpn,
            caps.max_send_wr as usize,
            caps.max_send_sge as usize,
        );
        req.max_unacked = caps.max_unacked_psns.max(1);
        req.ack_req_every = caps.ack_req_every.max(1);
        self.req = req;
        self.resp.reset();
        self.cc = self.cc_config.build();
        self.send_cq.clear();
        self.recv_cq.clear();
        self.events.clear();
        self.attr = QpAttr::default();
        self.established = false;
        self.paced_until = None;
    }

    fn enter_error(&mut self, fatal: bool) {
        self.state = QpState::Err;
        self.req.flush(&mut self.send_cq);
        self.resp.flush(&mut self.recv_cq);
        self.paced_until = None;
        if fatal {
            self.events.push_back(QpEvent::QpFatal);
        }
    }

    fn check_failures(&mut self) {
        if (self.req.failed || self.resp.failed) && self.state != QpState::Err {
            self.enter_error(true);
        }
    }

    /// `ibv_post_send`. In ERR the WR completes at once with WR_FLUSH_ERR.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(PostError::InvalidState(self.state));
        }
        if wr.sg_list.len() > self.req.max_sge {
            return Err(PostError::TooManySge);
        }
        if self.req.sq.len() >= self.req.max_send_wr {
            return Err(PostError::QueueFull);
        }
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if wr.op.is_atomic() && len != 8 {
            return Err(PostError::BadAtomicLength);
        }
        if len > 1 << 31 {
            return Err(PostError::MessageTooLong);
        }
        let len = len as u32;
        self.req.enqueue(wr, len);
        if self.state == QpState::Err {
            self.req.flush(&mut self.send_cq);
        }
        Ok(())
    }

    /// `ibv_post_recv`. Allowed from INIT on; in ERR the WR completes with WR_FLUSH_ERR.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        if wr.sg_list.len() > self.resp.max_sge {
            return Err(PostError::TooManySge);
        }
        if self.resp.rq.len() >= self.resp.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        self.resp.rq.push_back(wr);
        if self.state == QpState::Err {
            self.resp.flush(&mut self.recv_cq);
        }
        Ok(())
    }

    /// A RoCE packet for this QP arrived (the UDP payload, ICRC already checked by the
    /// framing layer). `ecn_ce` says the IP header carried congestion-experienced.
    /// Malformed or unexpected packets are counted and dropped.
    pub fn handle_packet<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        packet: &[u8],
        ecn_ce: bool,
        mem: &mut M,
    ) {
        let Ok(pkt) = RocePacket::new_checked(packet) else {
            self.stats.dropped += 1;
            return;
        };
        let bth = pkt.bth();
        if bth.dest_qp() != self.qpn {
            self.stats.dropped += 1;
            return;
        }
        let op = pkt.opcode();
        if op == Opcode::CNP {
            self.stats.cnps_received += 1;
            if matches!(self.state, QpState::Rts | QpState::Sqd) {
                self.cc.on_cnp(now);
            }
            return;
        }
        if op.transport() != Transport::Rc || !bth.pkey().matches(PKey::DEFAULT) {
            self.stats.dropped += 1;
            return;
        }
        let accepting = matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
        if !accepting {
            self.stats.dropped += 1;
            return;
        }
        self.stats.rx_packets += 1;
        if ecn_ce {
            self.resp.note_congestion(now);
        }
        if op.is_request() {
            if self.state == QpState::Rtr && !self.established {
                self.established = true;
                self.events.push_back(QpEvent::CommEstablished);
            }
            self.resp
                .handle_request(&pkt, mem, &mut self.stats, &mut self.recv_cq);
        } else if self.state != QpState::Rtr {
            self.req
                .handle_response(now, &pkt, mem, &mut self.stats, &mut self.send_cq);
        } else {
            self.stats.dropped += 1;
        }
        self.check_failures();
        self.check_drained();
    }

    /// True if `packet`, handed to [`handle_packet`](Self::handle_packet) now, would need a
    /// receive WQE this QP does not have: an in-sequence SEND (first or only) or RDMA WRITE
    /// with immediate (last or only) while the receive queue is empty. A QP attached to a
    /// shared receive queue takes one from it exactly then.
    pub fn needs_recv_for(&self, packet: &[u8]) -> bool {
        use monel_wire::opcode::Operation::*;
        let Ok(pkt) = RocePacket::new_checked(packet) else {
            return false;
        };
        let op = pkt.opcode();
        if op.transport() != Transport::Rc
            || !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            || !self.resp.rq.is_empty()
            || pkt.bth().psn() != self.resp.psn
        {
            return false;
        }
        matches!(
            op.operation(),
            Some(SendFirst | SendOnly | SendOnlyImm | SendOnlyInv | WriteOnlyImm | WriteLastImm)
        )
    }

    fn check_drained(&mut self) {
        if self.state == QpState::Sqd && !self.drained_notified && !self.req.outstanding() {
            self.drained_notified = true;
            self.events.push_back(QpEvent::SqDrained);
        }
    }

    /// Timers due at `now` (retransmit, RNR wait, congestion control).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.paced_until.is_some_and(|t| t <= now) {
            self.paced_until = None;
        }
        self.cc.handle_timeout(now);
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.req
                .handle_timeout(now, &mut self.stats, &mut self.send_cq);
            self.check_failures();
        }
    }

    /// Writes the next packet to send into `buf` (which must hold path MTU + 64 bytes) and
    /// says how long it is. CNPs go first, then responses, then requests; a lone positive ACK
    /// waits behind the requests ready to go.
    pub fn poll_transmit<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
    ) -> Option<Transmit> {
        if matches!(self.state, QpState::Reset | QpState::Init) {
            return None;
        }
        let out = if self.resp.cnp_pending && buf.len() >= CNP_LEN {
            self.resp.cnp_pending = false;
            let len = cnp_repr(self.attr.dest_qp_num).emit(buf).ok()?;
            self.stats.cnps_sent += 1;
            Some(Transmit {
                len,
                kind: TransmitKind::Cnp,
            })
        } else {
            let sending = matches!(self.state, QpState::Rts | QpState::Sqd);
            // A lone positive ACK goes after this QP's own requests: the peer waits for the
            // request (a reply, say) and gets the ACK just behind it, off its critical path.
            let request_first = sending && self.resp.holds_only_ack();
            let res = if request_first {
                match self.request(now, buf, mem) {
                    Ok(t) => Ok(t),
                    // Pacing holds requests, never the ACK.
                    Err(block) => self.response(now, buf, mem).or(Err(block)),
                }
            } else {
                match self.response(now, buf, mem) {
                    Err(TxBlock::Idle) if sending => self.request(now, buf, mem),
                    r => r,
                }
            };
            match res {
                Ok(t) => Some(t),
                Err(TxBlock::Paced(t)) => {
                    self.paced_until = Some(t);
                    None
                }
                Err(TxBlock::Idle) => None,
            }
        };
        self.check_failures();
        if let Some(t) = out {
            self.paced_until = None;
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += t.len as u64;
        }
        out
    }

    fn response<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
    ) -> Result<Transmit, TxBlock> {
        let len = self
            .resp
            .poll_transmit(now, buf, mem, &mut self.cc, &mut self.stats)?;
        Ok(Transmit {
            len,
            kind: TransmitKind::Response,
        })
    }

    fn request<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
    ) -> Result<Transmit, TxBlock> {
        let len = self.req.poll_transmit(
            now,
            buf,
            mem,
            &mut self.cc,
            &mut self.stats,
            &mut self.send_cq,
        )?;
        Ok(Transmit {
            len,
            kind: TransmitKind::Request,
        })
    }

    /// The next time [`handle_timeout`](Self::handle_timeout) has work, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let t = earliest(self.req.retransmit_at, self.req.rnr_wait_until);
        let t = earliest(t, self.cc.poll_timeout());
        earliest(t, self.paced_until)
    }

    /// The next send completion.
    pub fn poll_send_completion(&mut self) -> Option<WorkCompletion> {
        self.send_cq.pop_front()
    }
    /// The next receive completion.
    pub fn poll_recv_completion(&mut self) -> Option<WorkCompletion> {
        self.recv_cq.pop_front()
    }
    /// The next completion of either queue (send first).
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.send_cq
            .pop_front()
            .or_else(|| self.recv_cq.pop_front())
    }
    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// True if this QP has a packet it could send now or a WQE waiting.
    pub fn wants_to_send(&self) -> bool {
        self.resp.cnp_pending || self.resp.has_replies() || self.req.has_work()
    }
}
