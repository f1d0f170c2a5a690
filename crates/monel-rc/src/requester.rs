//! Requester: turns send work requests into packets, assigns PSNs, keeps the window and the
//! READ/atomic credits, and goes back N on timeouts and NAKs. The completer half (ACKs and
//! responses in, completions out) is in `completer.rs`.

use core::time::Duration;
use std::collections::VecDeque;

use monel_wire::packet::pad_for;
use monel_wire::{
    AtomicEthRepr, BthRepr, ExtHeaders, ICRC_LEN, Opcode, Psn, Qpn, RethRepr, RoceRepr,
};

use crate::attr::DEFAULT_PKEY;
use crate::congestion::{AnyController, Controller};
use crate::memory::{Access, Key, MemoryAccess};
use crate::stats::QpStats;
use crate::time::Instant;
use crate::wr::{SendOp, SendWr, Sge, WcStatus, WorkCompletion};

/// A send WQE and its progress.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub(crate) wr: SendWr,
    /// Message length (8 for atomics).
    pub(crate) len: u32,
    /// PSNs the message takes (READ: one per response packet).
    pub(crate) npkts: u32,
    /// PSN of the first packet, once started.
    pub(crate) first_psn: Psn,
    /// PSNs assigned and first packet sent.
    pub(crate) started: bool,
}

impl SendWqe {
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn + (self.npkts - 1)
    }
}

/// Send-side state of an RC QP.
#[derive(Debug)]
pub(crate) struct Requester {
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) max_send_wr: usize,
    pub(crate) max_sge: usize,
    /// Index in `sq` of the WQE whose packet `next_pkt` goes out next.
    pub(crate) next_wqe: usize,
    pub(crate) next_pkt: u32,
    /// PSN of the next packet to send.
    pub(crate) psn: Psn,
    /// One past the highest PSN ever sent.
    pub(crate) psn_high: Psn,
    /// Oldest PSN not yet acknowledged.
    pub(crate) comp_psn: Psn,
    pub(crate) mtu: u32,
    pub(crate) dest_qp: Qpn,
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) retries_left: u8,
    pub(crate) rnr_left: u8,
    pub(crate) rd_atomic_outstanding: u32,
    pub(crate) max_unacked: u32,
    pub(crate) ack_req_every: u32,
    pub(crate) noack_pkts: u32,
    pub(crate) retransmit_at: Option<Instant>,
    pub(crate) rnr_wait_until: Option<Instant>,
    pub(crate) fast_retry_psn: Option<Psn>,
    pub(crate) draining: bool,
    /// Set when an error completion moved the QP towards ERR.
    pub(crate) failed: bool,
    pub(crate) qpn: Qpn,
}

/// Outcome of trying to send a request packet.
pub(crate) enum TxBlock {
    /// Nothing to send (or window, credits, fence, drain).
    Idle,
    /// Data waits for the rate limiter until this time.
    Paced(Instant),
}

impl Requester {
    pub(crate) fn new(qpn: Qpn, max_send_wr: usize, max_sge: usize) -> Self {
        Self {
            sq: VecDeque::with_capacity(max_send_wr),
            max_send_wr,
            max_sge,
            next_wqe: 0,
            next_pkt: 0,
            psn: Psn::new(0),
            psn_high: Psn::new(0),
            comp_psn: Psn::new(0),
            mtu: 256,
            dest_qp: Qpn::new(0),
            timeout: None,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
            retries_left: 0,
            rnr_left: 0,
            rd_atomic_outstanding: 0,
            max_unacked: 128,
            ack_req_every: 64,
            noack_pkts: 0,
            retransmit_at: None,
            rnr_wait_until: None,
            fast_retry_psn: None,
            draining: false,
            failed: false,
            qpn,
        }
    }

    /// Sets the first PSN (RTR -> RTS).
    pub(crate) fn start_at(&mut self, psn: Psn) {
        self.psn = psn;
        self.psn_high = psn;
        self.comp_psn = psn;
    }

    /// True if a packet has been sent and not yet acknowledged.
    pub(crate) fn outstanding(&self) -> bool {
        self.sq.front().is_some_and(|w| w.started)
    }

    /// True if something is waiting to go out.
    pub(crate) fn has_work(&self) -> bool {
        self.next_wqe < self.sq.len()
    }

    pub(crate) fn enqueue(&mut self, wr: SendWr, len: u32) {
        let npkts = match wr.op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
            _ => len.div_ceil(self.mtu).max(1),
        };
        self.sq.push_back(SendWqe {
            wr,
            len,
            npkts,
            first_psn: Psn::new(0),
            started: false,
        });
    }

    /// Restarts transmission from the oldest unacknowledged PSN (go-back-N).
    pub(crate) fn rewind(&mut self) {
        self.next_wqe = 0;
        self.next_pkt = 0;
        self.noack_pkts = 0;
        if let Some(front) = self.sq.front().filter(|w| w.started) {
            let acked = self.comp_psn.diff(front.first_psn).max(0) as u32;
            self.next_pkt = acked.min(front.npkts - 1);
            self.psn = front.first_psn + self.next_pkt;
        } else {
            self.psn = self.comp_psn;
        }
    }

    pub(crate) fn arm_timer(&mut self, now: Instant) {
        self.retransmit_at = match (self.outstanding(), self.timeout) {
            (true, Some(t)) => Some(now + t),
            _ => None,
        };
    }

    /// Pushes the completion of the front WQE and removes it.
    pub(crate) fn complete_front(&mut self, status: WcStatus, cq: &mut VecDeque<WorkCompletion>) {
        let Some(w) = self.sq.pop_front() else { return };
        if w.started && w.wr.op.is_rd_atomic() {
            self.rd_atomic_outstanding -= 1;
        }
        if status != WcStatus::Success || w.wr.flags.signaled {
            cq.push_back(WorkCompletion {
                wr_id: w.wr.wr_id,
                status,
                opcode: w.wr.op.wc_opcode(),
                byte_len: w.len,
                imm: None,
                invalidated_rkey: None,
                qp_num: self.qpn,
                src_qp: self.dest_qp,
                grh: false,
            });
        }
        if self.next_wqe == 0 {
            self.next_pkt = 0;
            self.psn = self.comp_psn;
        } else {
            self.next_wqe -= 1;
        }
    }

    /// Completes the front WQE with an error; the QP goes to ERR.
    pub(crate) fn fail(&mut self, status: WcStatus, cq: &mut VecDeque<WorkCompletion>) {
        self.complete_front(status, cq);
        self.failed = true;
    }

    /// Completes every WQE with WR_FLUSH_ERR.
    pub(crate) fn flush(&mut self, cq: &mut VecDeque<WorkCompletion>) {
        while !self.sq.is_empty() {
            self.next_wqe = 0;
            self.complete_front(WcStatus::WrFlushErr, cq);
        }
        self.next_wqe = 0;
        self.next_pkt = 0;
        self.rd_atomic_outstanding = 0;
        self.retransmit_at = None;
        self.rnr_wait_until = None;
    }

    /// Writes the next request packet into `buf`. Returns its length.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn poll_transmit<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
        cc: &mut AnyController,
        stats: &mut QpStats,
        cq: &mut VecDeque<WorkCompletion>,
    ) -> Result<usize, TxBlock> {
        if self.rnr_wait_until.is_some() || self.failed {
            return Err(TxBlock::Idle);
        }
        let Some(wqe) = self.sq.get(self.next_wqe) else {
            return Err(TxBlock::Idle);
        };
        if self.psn.diff(self.comp_psn) >= self.max_unacked as i32 {
            return Err(TxBlock::Idle);
        }
        if let Some(t) = cc.next_send_time().filter(|t| *t > now) {
            return Err(TxBlock::Paced(t));
        }
        if !wqe.started {
            if self.draining {
                return Err(TxBlock::Idle);
            }
            let rd_atomic = wqe.wr.op.is_rd_atomic();
            if rd_atomic && self.rd_atomic_outstanding >= u32::from(self.max_rd_atomic) {
                if self.max_rd_atomic == 0 && self.next_wqe == 0 {
                    // This QP may never issue READ/atomics: fail rather than wait forever.
                    self.fail(WcStatus::LocQpOpErr, cq);
                }
                return Err(TxBlock::Idle);
            }
            if wqe.wr.flags.fence && self.rd_atomic_outstanding > 0 {
                return Err(TxBlock::Idle);
            }
            if let Err(status) = check_local(mem, &wqe.wr) {
                if self.next_wqe == 0 {
                    self.fail(status, cq);
                } else {
                    // Errors complete in order: wait until everything before it is done.
                }
                return Err(TxBlock::Idle);
            }
            let psn = self.psn;
            let w = &mut self.sq[self.next_wqe];
            w.started = true;
            w.first_psn = psn;
            if rd_atomic {
                self.rd_atomic_outstanding += 1;
            }
        }
        let wqe = &self.sq[self.next_wqe];
        let idx = self.next_pkt;
        let psn = wqe.first_psn + idx;
        let last = idx + 1 == wqe.npkts;
        let offset = idx * self.mtu;
        let mut ack_req = last || self.noack_pkts + 1 >= self.ack_req_every;
        let (opcode, ext, payload_len, consumed) = match wqe.wr.op {
            SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_) => {
                let plen = (wqe.len - offset).min(self.mtu);
                let only = wqe.npkts == 1;
                let (op, ext) = match (wqe.wr.op, only, idx == 0, last) {
                    (SendOp::SendImm(i), true, _, _) => {
                        (Opcode::RC_SEND_ONLY_IMM, ExtHeaders::Imm(i))
                    }
                    (SendOp::SendInv(k), true, _, _) => {
                        (Opcode::RC_SEND_ONLY_INV, ExtHeaders::Ieth(k))
                    }
                    (_, true, _, _) => (Opcode::RC_SEND_ONLY, ExtHeaders::None),
                    (_, _, true, _) => (Opcode::RC_SEND_FIRST, ExtHeaders::None),
                    (SendOp::SendImm(i), _, _, true) => {
                        (Opcode::RC_SEND_LAST_IMM, ExtHeaders::Imm(i))
                    }
                    (SendOp::SendInv(k), _, _, true) => {
                        (Opcode::RC_SEND_LAST_INV, ExtHeaders::Ieth(k))
                    }
                    (_, _, _, true) => (Opcode::RC_SEND_LAST, ExtHeaders::None),
                    _ => (Opcode::RC_SEND_MIDDLE, ExtHeaders::None),
                };
                (op, ext, plen, 1)
            }
            SendOp::Write(r) | SendOp::WriteImm(r, _) => {
                let plen = (wqe.len - offset).min(self.mtu);
                let imm = match wqe.wr.op {
                    SendOp::WriteImm(_, i) => Some(i),
                    _ => None,
                };
                let reth = RethRepr {
                    va: r.addr,
                    rkey: r.rkey,
                    dma_len: wqe.len,
                };
                let (op, ext) = match (imm, wqe.npkts == 1, idx == 0, last) {
                    (Some(i), true, _, _) => {
                        (Opcode::RC_WRITE_ONLY_IMM, ExtHeaders::RethImm(reth, i))
                    }
                    (None, true, _, _) => (Opcode::RC_WRITE_ONLY, ExtHeaders::Reth(reth)),
                    (_, _, true, _) => (Opcode::RC_WRITE_FIRST, ExtHeaders::Reth(reth)),
                    (Some(i), _, _, true) => (Opcode::RC_WRITE_LAST_IMM, ExtHeaders::Imm(i)),
                    (None, _, _, true) => (Opcode::RC_WRITE_LAST, ExtHeaders::None),
                    _ => (Opcode::RC_WRITE_MIDDLE, ExtHeaders::None),
                };
                (op, ext, plen, 1)
            }
            SendOp::Read(r) => {
                ack_req = true;
                let done = u64::from(offset).min(u64::from(wqe.len)) as u32;
                let reth = RethRepr {
                    va: r.addr + u64::from(done),
                    rkey: r.rkey,
                    dma_len: wqe.len - done,
                };
                (
                    Opcode::RC_READ_REQUEST,
                    ExtHeaders::Reth(reth),
                    0,
                    wqe.npkts - idx,
                )
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                ack_req = true;
                let a = AtomicEthRepr {
                    va: remote.addr,
                    rkey: remote.rkey,
                    swap_add: swap,
                    compare,
                };
                (Opcode::RC_COMPARE_SWAP, ExtHeaders::AtomicEth(a), 0, 1)
            }
            SendOp::FetchAdd { remote, add } => {
                ack_req = true;
                let a = AtomicEthRepr {
                    va: remote.addr,
                    rkey: remote.rkey,
                    swap_add: add,
                    compare: 0,
                };
                (Opcode::RC_FETCH_ADD, ExtHeaders::AtomicEth(a), 0, 1)
            }
        };
        let payload_len = payload_len as usize;
        let repr = RoceRepr {
            bth: BthRepr {
                opcode,
                solicited: last && wqe.wr.flags.solicited,
                migreq: false,
                pad_count: pad_for(payload_len),
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: self.dest_qp,
                ack_req,
                psn,
            },
            ext,
            payload_len,
        };
        let Ok(len) = repr.emit(buf) else {
            return Err(TxBlock::Idle);
        };
        if payload_len > 0 {
            let start = repr.header_len();
            let out = &mut buf[start..start + payload_len];
            if let Err(status) = gather(mem, &wqe.wr.sg_list, offset, out) {
                // The region vanished after the WQE started.
                self.rewind_to_front_error(status, cq);
                return Err(TxBlock::Idle);
            }
        }
        buf[len - ICRC_LEN..len].fill(0);
        // Advance.
        if psn.before(self.psn_high) {
            stats.retransmitted_packets += 1;
        }
        self.noack_pkts = if ack_req { 0 } else { self.noack_pkts + 1 };
        self.psn = psn + consumed;
        if self.psn.after(self.psn_high) {
            self.psn_high = self.psn;
        }
        if last || consumed > 1 || wqe.wr.op.is_rd_atomic() {
            self.next_wqe += 1;
            self.next_pkt = 0;
        } else {
            self.next_pkt += 1;
        }
        if self.retransmit_at.is_none() {
            self.arm_timer(now);
        }
        cc.on_sent(now, len);
        Ok(len)
    }

    fn rewind_to_front_error(&mut self, status: WcStatus, cq: &mut VecDeque<WorkCompletion>) {
        if self.next_wqe == 0 {
            self.fail(status, cq);
        } else {
            self.failed = true;
            self.complete_front(WcStatus::WrFlushErr, cq);
        }
    }
}

/// Checks the local SGEs of a WQE before it starts.
fn check_local<M: MemoryAccess + ?Sized>(mem: &M, wr: &SendWr) -> Result<(), WcStatus> {
    let access = if wr.op.is_rd_atomic() {
        Access::LocalWrite
    } else {
        Access::LocalRead
    };
    for s in &wr.sg_list {
        if s.length > 0 {
            mem.check(Key::Local(s.lkey), s.addr, u64::from(s.length), access)
                .map_err(|_| WcStatus::LocProtErr)?;
        }
    }
    Ok(())
}

/// Walks `len` bytes of an SGE list starting `offset` bytes in, calling `f(sge, address,
/// range within the caller's buffer)` per piece. `LocLenErr` if the list is too short;
/// `LocProtErr` if `f` fails.
fn walk_sges<E>(
    sges: &[Sge],
    mut offset: u32,
    len: usize,
    mut f: impl FnMut(&Sge, u64, core::ops::Range<usize>) -> Result<(), E>,
) -> Result<(), WcStatus> {
    let mut done = 0;
    for s in sges {
        if done == len {
            break;
        }
        if offset >= s.length {
            offset -= s.length;
            continue;
        }
        let n = ((s.length - offset) as usize).min(len - done);
        f(s, s.addr + u64::from(offset), done..done + n).map_err(|_| WcStatus::LocProtErr)?;
        done += n;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

/// Copies `out.len()` bytes starting `offset` bytes into the SGE list.
pub(crate) fn gather<M: MemoryAccess + ?Sized>(
    mem: &M,
    sges: &[Sge],
    offset: u32,
    out: &mut [u8],
) -> Result<(), WcStatus> {
    walk_sges(sges, offset, out.len(), |s, addr, r| {
        let key = Key::Local(s.lkey);
        if mem.lend(key, addr, r.len(), r.start)? {
            return Ok(());
        }
        mem.read(key, addr, &mut out[r], Access::LocalRead)
    })
}

/// Copies `data` into the SGE list starting `offset` bytes in. Errors: too long (`LocLenErr`),
/// protection (`LocProtErr`).
pub(crate) fn scatter<M: MemoryAccess + ?Sized>(
    mem: &mut M,
    sges: &[Sge],
    offset: u32,
    data: &[u8],
) -> Result<(), WcStatus> {
    walk_sges(sges, offset, data.len(), |s, addr, r| {
        mem.write(Key::Local(s.lkey), addr, &data[r], Access::LocalWrite)
    })
}
