//! Completer: ACKs, NAKs, READ responses and atomic ACKs in; completions, retries and errors
//! out. Follows rxe's `rxe_comp.c`: an ACK or response for PSN p acknowledges every request
//! before it (coalesced ACKs), a NAK-sequence-error implicitly ACKs the PSNs before it and
//! restarts from it, RNR NAKs wait the NAK's timer, and error NAKs complete the WQE with the
//! matching status and move the QP to ERR.

use std::collections::VecDeque;

use monel_wire::opcode::Operation;
use monel_wire::{AethSyndrome, NakCode, Psn, RocePacket};

use crate::memory::MemoryAccess;
use crate::requester::{Requester, scatter};
use crate::stats::QpStats;
use crate::time::{Instant, rnr_delay};
use crate::wr::{SendOp, WcStatus, WorkCompletion};

impl Requester {
    /// Handles a response packet (ACK, ATOMIC_ACK, READ response).
    pub(crate) fn handle_response<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        pkt: &RocePacket<&[u8]>,
        mem: &mut M,
        stats: &mut QpStats,
        cq: &mut VecDeque<WorkCompletion>,
    ) {
        let bth = pkt.bth();
        let psn = bth.psn();
        if psn.before(self.comp_psn) {
            stats.duplicate_responses += 1;
            return;
        }
        if !psn.before(self.psn_high) {
            // A response to something never sent.
            stats.dropped += 1;
            return;
        }
        let Some(op) = pkt.opcode().operation() else {
            return;
        };
        match op {
            Operation::Acknowledge => {
                let Some(aeth) = pkt.aeth() else { return };
                match aeth.syndrome() {
                    AethSyndrome::Ack { .. } => {
                        self.ack_through(now, psn, stats, cq);
                    }
                    AethSyndrome::RnrNak { timer } => {
                        self.ack_through(now, psn - 1, stats, cq);
                        stats.rnr_naks_received += 1;
                        if self.sq.front().is_none_or(|w| !w.started) {
                            return;
                        }
                        if self.rnr_retry != 7 {
                            if self.rnr_left == 0 {
                                self.fail(WcStatus::RnrRetryExcErr, cq);
                                return;
                            }
                            self.rnr_left -= 1;
                        }
                        self.rnr_wait_until = Some(now + rnr_delay(timer));
                        self.retransmit_at = None;
                    }
                    AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                        self.ack_through(now, psn - 1, stats, cq);
                        stats.seq_naks_received += 1;
                        if self.outstanding() && self.rnr_wait_until.is_none() {
                            self.retry(now, cq);
                        }
                    }
                    AethSyndrome::Nak(code) => {
                        self.ack_through(now, psn - 1, stats, cq);
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            _ => WcStatus::RemOpErr,
                        };
                        if self.outstanding() {
                            self.fail(status, cq);
                        }
                    }
                    AethSyndrome::Reserved(_) => stats.dropped += 1,
                }
            }
            Operation::AtomicAcknowledge => {
                if !self.ack_through(now, psn - 1, stats, cq) {
                    return;
                }
                let Some(orig) = pkt.atomic_ack().map(|a| a.orig()) else {
                    return;
                };
                let Some(front) = self.sq.front() else { return };
                if !front.started || !front.wr.op.is_atomic() || front.first_psn != psn {
                    stats.dropped += 1;
                    return;
                }
                if let Err(s) = scatter(mem, &front.wr.sg_list, 0, &orig.to_le_bytes()) {
                    self.fail(s, cq);
                    return;
                }
                self.comp_psn = psn + 1;
                self.complete_front(WcStatus::Success, cq);
                self.progress(now);
            }
            Operation::ReadResponseFirst
            | Operation::ReadResponseMiddle
            | Operation::ReadResponseLast
            | Operation::ReadResponseOnly => {
                if !self.ack_through(now, psn - 1, stats, cq) {
                    return;
                }
                self.read_response(now, pkt, psn, op, mem, stats, cq);
            }
            _ => stats.dropped += 1,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read_response<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        pkt: &RocePacket<&[u8]>,
        psn: Psn,
        op: Operation,
        mem: &mut M,
        stats: &mut QpStats,
        cq: &mut VecDeque<WorkCompletion>,
    ) {
        let mtu = self.mtu;
        let Some(front) = self.sq.front() else { return };
        if !front.started || !matches!(front.wr.op, SendOp::Read(_)) {
            stats.dropped += 1;
            return;
        }
        if psn != self.comp_psn {
            // A gap in the responses: go back at once, once per gap.
            stats.out_of_sequence += 1;
            self.fast_retry(now, stats);
            return;
        }
        let idx = psn.diff(front.first_psn) as u32;
        let last = idx + 1 == front.npkts;
        let expect_len = if last { front.len - idx * mtu } else { mtu };
        let op_ok = match op {
            Operation::ReadResponseFirst | Operation::ReadResponseMiddle => !last,
            _ => last,
        };
        let payload = pkt.payload();
        if !op_ok || payload.len() != expect_len as usize {
            self.fail(WcStatus::BadRespErr, cq);
            return;
        }
        if let Err(s) = scatter(mem, &front.wr.sg_list, idx * mtu, payload) {
            self.fail(s, cq);
            return;
        }
        self.comp_psn = psn + 1;
        if last {
            self.complete_front(WcStatus::Success, cq);
        } else if self.next_wqe == 0 && self.psn.before(self.comp_psn) {
            self.next_pkt = idx + 1;
            self.psn = self.comp_psn;
        }
        self.progress(now);
    }

    fn fast_retry(&mut self, now: Instant, stats: &mut QpStats) {
        if self.fast_retry_psn != Some(self.comp_psn) {
            self.fast_retry_psn = Some(self.comp_psn);
            stats.fast_retries += 1;
            self.rewind();
            self.arm_timer(now);
        }
    }

    /// Everything up to and including `p` reached the responder: completes the SEND/WRITE
    /// WQEs it covers. Returns false if an earlier READ/atomic still lacks its response (the
    /// packet that implied this is then out of order).
    pub(crate) fn ack_through(
        &mut self,
        now: Instant,
        p: Psn,
        stats: &mut QpStats,
        cq: &mut VecDeque<WorkCompletion>,
    ) -> bool {
        let mut moved = false;
        let mut clear = true;
        while let Some(front) = self.sq.front() {
            if !front.started || p.before(front.first_psn) {
                break;
            }
            let last = front.last_psn();
            if front.wr.op.is_rd_atomic() {
                // At or past the last PSN: the responder is past a READ/atomic whose
                // response we do not have. Inside its range: its own responses.
                clear = p.before(last);
                break;
            }
            if p.before(last) {
                if !p.before(self.comp_psn) {
                    self.comp_psn = p + 1;
                    moved = true;
                    if self.next_wqe == 0 && self.psn.before(self.comp_psn) {
                        self.next_pkt = self.comp_psn.diff(front.first_psn) as u32;
                        self.psn = self.comp_psn;
                    }
                }
                break;
            }
            self.comp_psn = last + 1;
            moved = true;
            self.complete_front(WcStatus::Success, cq);
        }
        if moved {
            self.progress(now);
        }
        if !clear {
            self.fast_retry(now, stats);
        }
        clear
    }

    /// One retry round after a timeout or sequence NAK: go back N, or complete the front WQE
    /// with RETRY_EXC_ERR when no retry is left. `retry_cnt = 7` retries forever, as rxe does
    /// (IBA counts seven); 0 to 6 are exact.
    fn retry(&mut self, now: Instant, cq: &mut VecDeque<WorkCompletion>) {
        if self.retry_cnt != 7 {
            if self.retries_left == 0 {
                self.fail(WcStatus::RetryExcErr, cq);
                return;
            }
            self.retries_left -= 1;
        }
        self.rewind();
        self.arm_timer(now);
    }

    /// Forward progress: reset retry counters and restart the timer.
    fn progress(&mut self, now: Instant) {
        self.retries_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.arm_timer(now);
    }

    /// Retransmit and RNR timers.
    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
        stats: &mut QpStats,
        cq: &mut VecDeque<WorkCompletion>,
    ) {
        if self.rnr_wait_until.is_some_and(|t| t <= now) {
            self.rnr_wait_until = None;
            self.rewind();
            self.arm_timer(now);
        }
        if self.retransmit_at.is_some_and(|t| t <= now) {
            stats.timeouts += 1;
            if self.outstanding() {
                self.retry(now, cq);
            } else {
                self.retransmit_at = None;
            }
        }
    }
}
