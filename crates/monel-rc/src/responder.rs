//! Responder: executes incoming requests in PSN order, exactly once. It checks sequence,
//! opcode order, lengths, keys, bounds and access before touching memory; answers with ACKs
//! (coalesced), READ responses, atomic ACKs, RNR NAKs and NAKs; replays duplicates from its
//! READ/atomic resources without re-executing; and raises CNPs on ECN-CE. Follows rxe's
//! `rxe_resp.c` and IBA chapter 9.7.

use core::time::Duration;
use std::collections::VecDeque;

use monel_wire::opcode::Operation;
use monel_wire::packet::pad_for;
use monel_wire::{
    AethRepr, AethSyndrome, BthRepr, ExtHeaders, ICRC_LEN, Msn, NakCode, Opcode, Psn, Qpn, RKey,
    RocePacket, RoceRepr,
};

use crate::attr::DEFAULT_PKEY;
use crate::congestion::{AnyController, Controller};
use crate::memory::{Access, AccessFlags, AtomicOp, Key, MemoryAccess};
use crate::requester::{TxBlock, scatter};
use crate::stats::QpStats;
use crate::time::Instant;
use crate::wr::{RecvWr, WcOpcode, WcStatus, WorkCompletion};

/// The largest message a RETH may describe (2^31 bytes).
const MAX_MSG: u32 = 1 << 31;

#[derive(Debug, Clone)]
struct SendCtx {
    wr: RecvWr,
    offset: u32,
}

#[derive(Debug, Clone, Copy)]
struct WriteCtx {
    va: u64,
    rkey: RKey,
    resid: u32,
    total: u32,
}

/// What the responder still has to send, in order.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Ack {
        psn: Psn,
        syndrome: AethSyndrome,
    },
    Read {
        va: u64,
        rkey: RKey,
        len: u32,
        first_psn: Psn,
        npkts: u32,
        idx: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A READ or atomic the responder has executed, kept to answer duplicates.
#[derive(Debug, Clone, Copy)]
struct Resource {
    first_psn: Psn,
    npkts: u32,
    kind: ResourceKind,
}

#[derive(Debug, Clone, Copy)]
enum ResourceKind {
    Read { va: u64, rkey: RKey, len: u32 },
    Atomic { orig: u64 },
}

/// Receive-side state of an RC QP.
#[derive(Debug)]
pub(crate) struct Responder {
    pub(crate) rq: VecDeque<RecvWr>,
    pub(crate) max_recv_wr: usize,
    pub(crate) max_sge: usize,
    pub(crate) psn: Psn,
    pub(crate) msn: Msn,
    pub(crate) mtu: u32,
    pub(crate) dest_qp: Qpn,
    pub(crate) min_rnr_timer: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) access: AccessFlags,
    pub(crate) cnp_interval: Duration,
    send: Option<SendCtx>,
    write: Option<WriteCtx>,
    nak_sent: bool,
    replies: VecDeque<Reply>,
    resources: VecDeque<Resource>,
    last_cnp: Option<Instant>,
    pub(crate) cnp_pending: bool,
    pub(crate) failed: bool,
    pub(crate) qpn: Qpn,
}

impl Responder {
    pub(crate) fn new(qpn: Qpn, max_recv_wr: usize, max_sge: usize) -> Self {
        Self {
            rq: VecDeque::with_capacity(max_recv_wr),
            max_recv_wr,
            max_sge,
            psn: Psn::new(0),
            msn: Msn::new(0),
            mtu: 256,
            dest_qp: Qpn::new(0),
            min_rnr_timer: 0,
            max_dest_rd_atomic: 0,
            access: AccessFlags::NONE,
            cnp_interval: Duration::from_micros(4),
            send: None,
            write: None,
            nak_sent: false,
            replies: VecDeque::new(),
            resources: VecDeque::new(),
            last_cnp: None,
            cnp_pending: false,
            failed: false,
            qpn,
        }
    }

    /// True if the only reply waiting is a positive ACK (no NAK, READ or atomic response).
    pub(crate) fn holds_only_ack(&self) -> bool {
        matches!(
            self.replies.front(),
            Some(Reply::Ack {
                syndrome: AethSyndrome::Ack { .. },
                ..
            })
        ) && self.replies.len() == 1
    }

    /// True if replies wait to be sent.
    pub(crate) fn has_replies(&self) -> bool {
        !self.replies.is_empty()
    }

    /// Keeps only NAKs and ACKs (what an ERR QP still sends), flushes receives.
    pub(crate) fn flush(&mut self, cq: &mut VecDeque<WorkCompletion>) {
        self.replies.retain(|r| matches!(r, Reply::Ack { .. }));
        if let Some(ctx) = self.send.take() {
            self.complete_recv(
                ctx.wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
                None,
                cq,
            );
        }
        self.write = None;
        while let Some(wr) = self.rq.pop_front() {
            self.complete_recv(
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
                None,
                cq,
            );
        }
    }

    /// Forgets everything (RESET).
    pub(crate) fn reset(&mut self) {
        self.rq.clear();
        self.send = None;
        self.write = None;
        self.replies.clear();
        self.resources.clear();
        self.nak_sent = false;
        self.cnp_pending = false;
        self.failed = false;
        self.msn = Msn::new(0);
    }

    /// A packet carried ECN-CE: schedule a CNP unless one went out within the interval.
    pub(crate) fn note_congestion(&mut self, now: Instant) {
        if self
            .last_cnp
            .is_none_or(|t| now.saturating_since(t) >= self.cnp_interval)
        {
            self.last_cnp = Some(now);
            self.cnp_pending = true;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn complete_recv(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        invalidated_rkey: Option<RKey>,
        cq: &mut VecDeque<WorkCompletion>,
    ) {
        cq.push_back(WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm,
            invalidated_rkey,
            qp_num: self.qpn,
            src_qp: self.dest_qp,
            grh: false,
        });
    }

    fn push_ack(&mut self, psn: Psn) {
        if let Some(Reply::Ack {
            psn: p,
            syndrome: AethSyndrome::Ack { .. },
        }) = self.replies.back_mut()
        {
            *p = psn;
        } else {
            self.replies.push_back(Reply::Ack {
                psn,
                syndrome: AethSyndrome::ACK_UNLIMITED,
            });
        }
    }

    /// A class C/J error: NAK this PSN and go to ERR.
    fn nak(&mut self, psn: Psn, code: NakCode, stats: &mut QpStats) {
        match code {
            NakCode::RemoteAccessError => stats.access_errors += 1,
            NakCode::InvalidRequest => stats.invalid_requests += 1,
            _ => {}
        }
        self.replies.push_back(Reply::Ack {
            psn,
            syndrome: AethSyndrome::Nak(code),
        });
        self.failed = true;
    }

    fn rnr(&mut self, psn: Psn, stats: &mut QpStats) {
        stats.rnr_naks_sent += 1;
        // The requester goes back to this PSN after the RNR delay: packets behind it are
        // dropped quietly rather than drawing a sequence NAK that would cost a retry.
        self.nak_sent = true;
        self.replies.push_back(Reply::Ack {
            psn,
            syndrome: AethSyndrome::RnrNak {
                timer: self.min_rnr_timer,
            },
        });
    }

    fn add_resource(&mut self, r: Resource) {
        let cap = usize::from(self.max_dest_rd_atomic).max(1);
        while self.resources.len() >= cap {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    /// Handles a request packet.
    pub(crate) fn handle_request<M: MemoryAccess + ?Sized>(
        &mut self,
        pkt: &RocePacket<&[u8]>,
        mem: &mut M,
        stats: &mut QpStats,
        cq: &mut VecDeque<WorkCompletion>,
    ) {
        let bth = pkt.bth();
        let psn = bth.psn();
        let Some(op) = pkt.opcode().operation() else {
            return;
        };
        let d = psn.diff(self.psn);
        if d > 0 {
            stats.out_of_sequence += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                stats.seq_naks_sent += 1;
                self.replies.push_back(Reply::Ack {
                    psn: self.psn,
                    syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
                });
            }
            return;
        }
        if d < 0 {
            stats.duplicate_requests += 1;
            self.duplicate(pkt, psn, op);
            return;
        }
        self.nak_sent = false;
        let payload = pkt.payload();
        let plen = payload.len() as u32;
        let mtu = self.mtu;
        use Operation::*;
        match op {
            SendFirst | SendOnly | SendOnlyImm | SendOnlyInv | SendMiddle | SendLast
            | SendLastImm | SendLastInv => {
                let first = matches!(op, SendFirst | SendOnly | SendOnlyImm | SendOnlyInv);
                let last = !matches!(op, SendFirst | SendMiddle);
                if first == self.send.is_some() || self.write.is_some() {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                let len_ok = if last {
                    plen <= mtu && (first || plen > 0)
                } else {
                    plen == mtu
                };
                if !len_ok {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                if first {
                    let Some(wr) = self.rq.pop_front() else {
                        return self.rnr(psn, stats);
                    };
                    self.send = Some(SendCtx { wr, offset: 0 });
                }
                let Some(ctx) = self.send.as_mut() else {
                    return;
                };
                if let Err(status) = scatter(mem, &ctx.wr.sg_list, ctx.offset, payload) {
                    let ctx = self.send.take().expect("checked above");
                    self.complete_recv(
                        ctx.wr.wr_id,
                        status,
                        WcOpcode::Recv,
                        ctx.offset,
                        None,
                        None,
                        cq,
                    );
                    let code = if status == WcStatus::LocLenErr {
                        NakCode::InvalidRequest
                    } else {
                        NakCode::RemoteOperationalError
                    };
                    return self.nak(psn, code, stats);
                }
                ctx.offset += plen;
                if last {
                    let ctx = self.send.take().expect("checked above");
                    let mut invalidated = None;
                    if let Some(k) = pkt.ieth() {
                        if mem.invalidate(k).is_err() {
                            self.complete_recv(
                                ctx.wr.wr_id,
                                WcStatus::RemInvReqErr,
                                WcOpcode::Recv,
                                ctx.offset,
                                None,
                                None,
                                cq,
                            );
                            return self.nak(psn, NakCode::InvalidRequest, stats);
                        }
                        invalidated = Some(k);
                    }
                    self.msn = self.msn.next();
                    self.complete_recv(
                        ctx.wr.wr_id,
                        WcStatus::Success,
                        WcOpcode::Recv,
                        ctx.offset,
                        pkt.imm(),
                        invalidated,
                        cq,
                    );
                }
            }
            WriteFirst | WriteOnly | WriteOnlyImm => {
                if self.send.is_some()
                    || self.write.is_some()
                    || !self.access.contains(AccessFlags::REMOTE_WRITE)
                {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                let Some(reth) = pkt.reth() else { return };
                let (va, rkey, total) = (reth.va(), reth.rkey(), reth.dma_len());
                let only = op != WriteFirst;
                let len_ok = total <= MAX_MSG
                    && if only {
                        plen == total && plen <= mtu
                    } else {
                        plen == mtu && total > mtu
                    };
                if !len_ok {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                if !remote_ok(mem, rkey, va, total, Access::RemoteWrite) {
                    return self.nak(psn, NakCode::RemoteAccessError, stats);
                }
                if op == WriteOnlyImm && self.rq.is_empty() {
                    return self.rnr(psn, stats);
                }
                if plen > 0
                    && mem
                        .write(Key::Remote(rkey), va, payload, Access::RemoteWrite)
                        .is_err()
                {
                    return self.nak(psn, NakCode::RemoteAccessError, stats);
                }
                if only {
                    self.finish_write(total, pkt.imm(), cq);
                } else {
                    self.write = Some(WriteCtx {
                        va: va + u64::from(plen),
                        rkey,
                        resid: total - plen,
                        total,
                    });
                }
            }
            WriteMiddle | WriteLast | WriteLastImm => {
                let Some(ctx) = self.write else {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                };
                let last = op != WriteMiddle;
                let len_ok = if last {
                    plen == ctx.resid
                } else {
                    plen == mtu && ctx.resid > mtu
                };
                if !len_ok {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                if op == WriteLastImm && self.rq.is_empty() {
                    return self.rnr(psn, stats);
                }
                if plen > 0
                    && mem
                        .write(Key::Remote(ctx.rkey), ctx.va, payload, Access::RemoteWrite)
                        .is_err()
                {
                    return self.nak(psn, NakCode::RemoteAccessError, stats);
                }
                if last {
                    self.write = None;
                    self.finish_write(ctx.total, pkt.imm(), cq);
                } else {
                    self.write = Some(WriteCtx {
                        va: ctx.va + u64::from(plen),
                        resid: ctx.resid - plen,
                        ..ctx
                    });
                }
            }
            ReadRequest => {
                if self.send.is_some()
                    || self.write.is_some()
                    || !self.access.contains(AccessFlags::REMOTE_READ)
                    || self.max_dest_rd_atomic == 0
                {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                let Some(reth) = pkt.reth() else { return };
                let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
                if len > MAX_MSG {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                if !remote_ok(mem, rkey, va, len, Access::RemoteRead) {
                    return self.nak(psn, NakCode::RemoteAccessError, stats);
                }
                let npkts = len.div_ceil(mtu).max(1);
                self.add_resource(Resource {
                    first_psn: psn,
                    npkts,
                    kind: ResourceKind::Read { va, rkey, len },
                });
                self.replies.push_back(Reply::Read {
                    va,
                    rkey,
                    len,
                    first_psn: psn,
                    npkts,
                    idx: 0,
                });
                self.msn = self.msn.next();
                self.psn = psn + npkts;
                return;
            }
            CompareSwap | FetchAdd => {
                if self.send.is_some()
                    || self.write.is_some()
                    || !self.access.contains(AccessFlags::REMOTE_ATOMIC)
                    || self.max_dest_rd_atomic == 0
                {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                let Some(a) = pkt.atomic_eth() else { return };
                if a.va() % 8 != 0 {
                    return self.nak(psn, NakCode::InvalidRequest, stats);
                }
                let aop = if op == CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare(),
                        swap: a.swap_add(),
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add() }
                };
                let Ok(orig) = mem.atomic(a.rkey(), a.va(), aop) else {
                    return self.nak(psn, NakCode::RemoteAccessError, stats);
                };
                self.add_resource(Resource {
                    first_psn: psn,
                    npkts: 1,
                    kind: ResourceKind::Atomic { orig },
                });
                self.replies.push_back(Reply::Atomic { psn, orig });
                self.msn = self.msn.next();
                self.psn = psn + 1;
                return;
            }
            _ => return self.nak(psn, NakCode::InvalidRequest, stats),
        }
        self.psn = psn + 1;
        if bth.ack_req() {
            self.push_ack(psn);
        }
    }

    fn finish_write(&mut self, total: u32, imm: Option<u32>, cq: &mut VecDeque<WorkCompletion>) {
        self.msn = self.msn.next();
        if let Some(imm) = imm {
            if let Some(wr) = self.rq.pop_front() {
                self.complete_recv(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    total,
                    Some(imm),
                    None,
                    cq,
                );
            }
        }
    }

    /// A request for a PSN already executed: re-ACK, or replay a READ/atomic from resources.
    fn duplicate(&mut self, pkt: &RocePacket<&[u8]>, psn: Psn, op: Operation) {
        match op {
            Operation::ReadRequest => {
                let Some(reth) = pkt.reth() else { return };
                let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
                let found = self.resources.iter().find(|r| {
                    let off = psn.diff(r.first_psn);
                    off >= 0 && (off as u32) < r.npkts
                });
                if let Some(Resource {
                    kind:
                        ResourceKind::Read {
                            va: rva,
                            rkey: rk,
                            len: rlen,
                        },
                    ..
                }) = found
                {
                    let inside = rkey == *rk
                        && va >= *rva
                        && va.saturating_add(u64::from(len)) <= rva + u64::from(*rlen);
                    if inside {
                        // Drop any replay of the same PSN still queued, then resend from here.
                        self.replies.retain(
                            |r| !matches!(r, Reply::Read { first_psn, .. } if *first_psn == psn),
                        );
                        let npkts = len.div_ceil(self.mtu).max(1);
                        self.replies.push_back(Reply::Read {
                            va,
                            rkey,
                            len,
                            first_psn: psn,
                            npkts,
                            idx: 0,
                        });
                    }
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let found = self.resources.iter().find(|r| r.first_psn == psn);
                if let Some(Resource {
                    kind: ResourceKind::Atomic { orig },
                    ..
                }) = found
                {
                    let orig = *orig;
                    if !self
                        .replies
                        .iter()
                        .any(|r| matches!(r, Reply::Atomic { psn: p, .. } if *p == psn))
                    {
                        self.replies.push_back(Reply::Atomic { psn, orig });
                    }
                }
            }
            _ => {
                let last = self.psn - 1;
                self.push_ack(last);
            }
        }
    }

    /// Writes the next reply into `buf`.
    pub(crate) fn poll_transmit<M: MemoryAccess + ?Sized>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        mem: &M,
        cc: &mut AnyController,
        stats: &mut QpStats,
    ) -> Result<usize, TxBlock> {
        let Some(reply) = self.replies.front_mut() else {
            return Err(TxBlock::Idle);
        };
        let mut bth = BthRepr {
            opcode: Opcode::RC_ACKNOWLEDGE,
            solicited: false,
            migreq: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: self.dest_qp,
            ack_req: false,
            psn: Psn::new(0),
        };
        let ack = |syndrome| AethRepr {
            syndrome,
            msn: self.msn,
        };
        match *reply {
            Reply::Ack { psn, syndrome } => {
                bth.psn = psn;
                let repr = RoceRepr {
                    bth,
                    ext: ExtHeaders::Aeth(ack(syndrome)),
                    payload_len: 0,
                };
                let len = repr.emit(buf).map_err(|_| TxBlock::Idle)?;
                buf[len - ICRC_LEN..len].fill(0);
                self.replies.pop_front();
                stats.acks_sent += 1;
                Ok(len)
            }
            Reply::Atomic { psn, orig } => {
                bth.opcode = Opcode::RC_ATOMIC_ACKNOWLEDGE;
                bth.psn = psn;
                let repr = RoceRepr {
                    bth,
                    ext: ExtHeaders::AethAtomicAck(ack(AethSyndrome::ACK_UNLIMITED), orig),
                    payload_len: 0,
                };
                let len = repr.emit(buf).map_err(|_| TxBlock::Idle)?;
                buf[len - ICRC_LEN..len].fill(0);
                self.replies.pop_front();
                Ok(len)
            }
            Reply::Read {
                va,
                rkey,
                len: total,
                first_psn,
                npkts,
                ref mut idx,
            } => {
                if let Some(t) = cc.next_send_time().filter(|t| *t > now) {
                    return Err(TxBlock::Paced(t));
                }
                let i = *idx;
                let last = i + 1 == npkts;
                let off = i * self.mtu;
                let plen = if last { total - off } else { self.mtu } as usize;
                let (opcode, ext) = match (npkts == 1, i == 0, last) {
                    (true, _, _) => (
                        Opcode::RC_READ_RESPONSE_ONLY,
                        ExtHeaders::Aeth(ack(AethSyndrome::ACK_UNLIMITED)),
                    ),
                    (_, true, _) => (
                        Opcode::RC_READ_RESPONSE_FIRST,
                        ExtHeaders::Aeth(ack(AethSyndrome::ACK_UNLIMITED)),
                    ),
                    (_, _, true) => (
                        Opcode::RC_READ_RESPONSE_LAST,
                        ExtHeaders::Aeth(ack(AethSyndrome::ACK_UNLIMITED)),
                    ),
                    _ => (Opcode::RC_READ_RESPONSE_MIDDLE, ExtHeaders::None),
                };
                bth.opcode = opcode;
                bth.psn = first_psn + i;
                bth.pad_count = pad_for(plen);
                let repr = RoceRepr {
                    bth,
                    ext,
                    payload_len: plen,
                };
                let len = repr.emit(buf).map_err(|_| TxBlock::Idle)?;
                if plen > 0 {
                    let start = repr.header_len();
                    let out = &mut buf[start..start + plen];
                    if mem
                        .read(
                            Key::Remote(rkey),
                            va + u64::from(off),
                            out,
                            Access::RemoteRead,
                        )
                        .is_err()
                    {
                        // The region went away after the request was accepted.
                        self.replies.pop_front();
                        self.nak(first_psn + i, NakCode::RemoteAccessError, stats);
                        return Err(TxBlock::Idle);
                    }
                }
                buf[len - ICRC_LEN..len].fill(0);
                *idx += 1;
                if last {
                    self.replies.pop_front();
                }
                cc.on_sent(now, len);
                Ok(len)
            }
        }
    }
}

/// Whether a peer may access `len` bytes at `va` under `rkey` (zero-length accesses are not
/// checked, as IBA C9-88 and rxe).
fn remote_ok<M: MemoryAccess + ?Sized>(
    mem: &M,
    rkey: RKey,
    va: u64,
    len: u32,
    access: Access,
) -> bool {
    len == 0
        || mem
            .check(Key::Remote(rkey), va, u64::from(len), access)
            .is_ok()
}
