//! An unreliable-datagram queue pair, sans-IO: one-packet SENDs to any QP that shares the
//! Q_Key, no ACKs, no retransmission, no ordering. Each send carries its own destination
//! (an address vector, QPN and Q_Key, as `ibv_send_wr.wr.ud`); each receive gets the
//! sender's QPN and 40 bytes of GRH (for RoCEv2: the IP header, as rxe writes it) ahead of
//! the payload.
//!
//! Method kinds as [`crate::RcQp`]: inputs [`UdQp::handle_packet`]; commands
//! [`UdQp::modify`], [`UdQp::post_send`], [`UdQp::post_recv`]; outputs
//! [`UdQp::poll_transmit`] (each with its destination), the completions and events.

use std::collections::VecDeque;

use monel_wire::{
    BthRepr, DethRepr, ExtHeaders, ICRC_LEN, Opcode, PKey, QKey, Qpn, RocePacket, RoceRepr,
    packet::pad_for,
};

use crate::attr::{
    AddressVector, AttrMask, DEFAULT_PKEY, ModifyError, QpAttr, QpState, check_transition,
};
use crate::memory::MemoryAccess;
use crate::qp::QpCaps;
use crate::requester::{gather, scatter};
use crate::stats::QpStats;
use crate::wr::{PostError, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

/// Bytes of GRH space at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// Where one UD send goes (`ibv_send_wr.wr.ud`: the address handle, remote QPN and Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Path to the destination (its GID, hop limit, traffic class).
    pub av: AddressVector,
    /// Destination QP.
    pub remote_qpn: Qpn,
    /// Q_Key to send with. A key with the top bit set means "use this QP's own Q_Key".
    pub remote_qkey: QKey,
}

/// What [`UdQp::poll_transmit`] wrote: the packet's length and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdTransmit {
    /// Bytes of the RoCE packet, BTH through the 4 zeroed ICRC bytes.
    pub len: usize,
    /// Destination path.
    pub av: AddressVector,
}

#[derive(Debug)]
struct UdWqe {
    wr: SendWr,
    dest: UdDest,
}

/// An unreliable-datagram queue pair.
#[derive(Debug)]
pub struct UdQp {
    qpn: Qpn,
    state: QpState,
    attr: QpAttr,
    caps: QpCaps,
    /// Largest message: the port's MTU.
    max_msg: u32,
    sq: VecDeque<UdWqe>,
    rq: VecDeque<RecvWr>,
    send_cq: VecDeque<WorkCompletion>,
    recv_cq: VecDeque<WorkCompletion>,
    stats: QpStats,
}

/// Required and optional attributes of a UD transition (IBA table 91, UD columns).
fn ud_transition_masks(from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use QpState::*;
    type M = AttrMask;
    let none = M::NONE;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
        (Init, Init) => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
        (Init, Rtr) => (none, M::PKEY_INDEX | M::QKEY),
        (Rtr, Rts) => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => (none, M::CUR_STATE | M::QKEY),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (none, M::PKEY_INDEX | M::QKEY),
        _ => return None,
    })
}

impl UdQp {
    /// A UD QP in RESET whose messages may be up to `max_msg` bytes (the port MTU).
    pub fn new(qpn: Qpn, caps: QpCaps, max_msg: u32) -> Self {
        Self {
            qpn,
            state: QpState::Reset,
            attr: QpAttr::default(),
            caps,
            max_msg,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            send_cq: VecDeque::new(),
            recv_cq: VecDeque::new(),
            stats: QpStats::default(),
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
    /// Current attributes (those UD uses: state, P_Key index, port, Q_Key, SQ PSN).
    pub fn attr(&self) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a
    }
    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.stats
    }
    /// Send WRs not yet completed.
    pub fn outstanding_sends(&self) -> usize {
        self.sq.len()
    }
    /// Receive WRs posted and not yet consumed.
    pub fn posted_recvs(&self) -> usize {
        self.rq.len()
    }

    /// Modifies attributes and state with the UD state table's masks.
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        let to = check_transition(self.state, attr, mask, ud_transition_masks)?;
        if mask.contains(AttrMask::PKEY_INDEX) {
            self.attr.pkey_index = attr.pkey_index;
        }
        if mask.contains(AttrMask::PORT) {
            self.attr.port_num = attr.port_num;
        }
        if mask.contains(AttrMask::QKEY) {
            self.attr.qkey = attr.qkey;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.attr.sq_psn = attr.sq_psn;
        }
        match to {
            QpState::Reset => {
                self.sq.clear();
                self.rq.clear();
                self.send_cq.clear();
                self.recv_cq.clear();
                self.attr = QpAttr::default();
            }
            QpState::Err => self.flush(),
            _ => {}
        }
        self.state = to;
        Ok(())
    }

    fn flush(&mut self) {
        for w in self.sq.drain(..) {
            self.send_cq.push_back(completion(
                self.qpn,
                w.wr.wr_id,
                WcStatus::WrFlushErr,
                w.wr.op.wc_opcode(),
            ));
        }
        for r in self.rq.drain(..) {
            self.recv_cq.push_back(completion(
                self.qpn,
                r.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
            ));
        }
    }

    /// Queues a send to `dest`. Only SEND and SEND with immediate exist on UD; a message is
    /// one packet, at most the port MTU.
    pub fn post_send(&mut self, wr: SendWr, dest: UdDest) -> Result<(), PostError> {
        if !matches!(self.state, QpState::Rts) {
            return Err(PostError::InvalidState(self.state));
        }
        if !matches!(wr.op, SendOp::Send | SendOp::SendImm(_)) {
            return Err(PostError::UnsupportedOp);
        }
        if self.sq.len() >= self.caps.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.caps.max_send_sge as usize {
            return Err(PostError::TooManySge);
        }
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if len > u64::from(self.max_msg) {
            return Err(PostError::MessageTooLong);
        }
        self.sq.push_back(UdWqe { wr, dest });
        Ok(())
    }

    /// Queues a receive buffer; it needs [`GRH_LEN`] bytes more than the largest message.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if matches!(self.state, QpState::Reset) {
            return Err(PostError::InvalidState(self.state));
        }
        if self.rq.len() >= self.caps.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.caps.max_recv_sge as usize {
            return Err(PostError::TooManySge);
        }
        if self.state == QpState::Err {
            self.recv_cq.push_back(completion(
                self.qpn,
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
            ));
            return Ok(());
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// Writes the next packet into `buf` and says where it goes; completes its WR.
    pub fn poll_transmit<M: MemoryAccess + ?Sized>(
        &mut self,
        buf: &mut [u8],
        mem: &M,
    ) -> Option<UdTransmit> {
        while self.state == QpState::Rts {
            let w = self.sq.pop_front()?;
            let len: usize = w.wr.sg_list.iter().map(|s| s.length as usize).sum();
            let qkey = if w.dest.remote_qkey.0 & 0x8000_0000 != 0 {
                self.attr.qkey
            } else {
                w.dest.remote_qkey
            };
            let deth = DethRepr {
                qkey,
                src_qp: self.qpn,
            };
            let (opcode, ext) = match w.wr.op {
                SendOp::SendImm(i) => (Opcode::UD_SEND_ONLY_IMM, ExtHeaders::DethImm(deth, i)),
                _ => (Opcode::UD_SEND_ONLY, ExtHeaders::Deth(deth)),
            };
            let psn = self.attr.sq_psn;
            let repr = RoceRepr {
                bth: BthRepr {
                    opcode,
                    solicited: w.wr.flags.solicited,
                    migreq: false,
                    pad_count: pad_for(len),
                    pkey: DEFAULT_PKEY,
                    fecn: false,
                    becn: false,
                    dest_qp: w.dest.remote_qpn,
                    ack_req: false,
                    psn,
                },
                ext,
                payload_len: len,
            };
            let status = match repr.emit(buf) {
                Err(_) => Err(WcStatus::LocLenErr),
                Ok(n) => {
                    let start = repr.header_len();
                    gather(mem, &w.wr.sg_list, 0, &mut buf[start..start + len]).map(|()| n)
                }
            };
            match status {
                Ok(n) => {
                    buf[n - ICRC_LEN..n].fill(0);
                    self.attr.sq_psn = psn + 1u32;
                    self.stats.tx_packets += 1;
                    self.stats.tx_bytes += n as u64;
                    if w.wr.flags.signaled {
                        self.send_cq.push_back(completion(
                            self.qpn,
                            w.wr.wr_id,
                            WcStatus::Success,
                            WcOpcode::Send,
                        ));
                    }
                    return Some(UdTransmit {
                        len: n,
                        av: w.dest.av,
                    });
                }
                Err(s) => {
                    // A bad local buffer: the WR completes in error, the QP goes to ERR.
                    self.send_cq
                        .push_back(completion(self.qpn, w.wr.wr_id, s, WcOpcode::Send));
                    self.state = QpState::Err;
                    self.flush();
                }
            }
        }
        None
    }

    /// Takes in one received packet addressed to this QP; `grh` is the 40-byte header
    /// the receive buffer gets first. Packets for a QP not in RTR/RTS, with the wrong Q_Key
    /// or P_Key, of an RC opcode, or with no receive posted are dropped and counted.
    pub fn handle_packet<M: MemoryAccess + ?Sized>(
        &mut self,
        bytes: &[u8],
        grh: &[u8; GRH_LEN],
        mem: &mut M,
    ) {
        let Ok(pkt) = RocePacket::new_checked(bytes) else {
            self.stats.dropped += 1;
            return;
        };
        let Ok(repr) = RoceRepr::parse(&pkt) else {
            self.stats.dropped += 1;
            return;
        };
        let (deth, imm) = match repr.ext {
            ExtHeaders::Deth(d) => (d, None),
            ExtHeaders::DethImm(d, i) => (d, Some(i)),
            _ => {
                self.stats.dropped += 1;
                return;
            }
        };
        if !matches!(self.state, QpState::Rtr | QpState::Rts)
            || repr.bth.dest_qp != self.qpn
            || !repr.bth.pkey.matches(PKey::DEFAULT)
        {
            self.stats.dropped += 1;
            return;
        }
        if deth.qkey != self.attr.qkey {
            self.stats.qkey_violations += 1;
            return;
        }
        let Some(r) = self.rq.pop_front() else {
            self.stats.no_recv_drops += 1;
            return;
        };
        self.stats.rx_packets += 1;
        let payload = pkt.payload();
        let status = scatter(mem, &r.sg_list, 0, grh)
            .and_then(|()| scatter(mem, &r.sg_list, GRH_LEN as u32, payload));
        let mut wc = completion(
            self.qpn,
            r.wr_id,
            status.err().unwrap_or(WcStatus::Success),
            WcOpcode::Recv,
        );
        if wc.status == WcStatus::Success {
            wc.byte_len = (GRH_LEN + payload.len()) as u32;
            wc.imm = imm;
            wc.src_qp = deth.src_qp;
            wc.grh = true;
        }
        self.recv_cq.push_back(wc);
    }

    /// The next send completion.
    pub fn poll_send_completion(&mut self) -> Option<WorkCompletion> {
        self.send_cq.pop_front()
    }
    /// The next receive completion.
    pub fn poll_recv_completion(&mut self) -> Option<WorkCompletion> {
        self.recv_cq.pop_front()
    }
    /// True if a packet is waiting to go.
    pub fn wants_to_send(&self) -> bool {
        self.state == QpState::Rts && !self.sq.is_empty()
    }
}

fn completion(qpn: Qpn, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: Qpn::new(0),
        grh: false,
    }
}

/// The 40 GRH bytes a RoCEv2 receive buffer gets, as rxe writes them: for IPv4, 20 zero
/// bytes then the IPv4 header; for IPv6, the IPv6 header. `roce_len` is the UDP payload
/// length; `ttl` the hop limit as received (0 where the socket cannot see it).
pub fn grh_for(
    src: monel_wire::IpAddress,
    dst: monel_wire::IpAddress,
    traffic_class: u8,
    ttl: u8,
    roce_len: usize,
) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    match (src, dst) {
        (monel_wire::IpAddress::V4(s), monel_wire::IpAddress::V4(d)) => {
            let h = &mut g[20..];
            let total = (20 + 8 + roce_len) as u16;
            h[0] = 0x45;
            h[1] = traffic_class;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40; // DF
            h[8] = ttl;
            h[9] = 17;
            h[12..16].copy_from_slice(&s);
            h[16..20].copy_from_slice(&d);
            monel_wire::Ipv4Header::new_unchecked(h).fill_checksum();
        }
        (s, d) => {
            let (s, d) = (s.to_gid(), d.to_gid());
            let payload = (8 + roce_len) as u16;
            g[0] = 0x60 | (traffic_class >> 4);
            g[1] = traffic_class << 4;
            g[4..6].copy_from_slice(&payload.to_be_bytes());
            g[6] = 17;
            g[7] = ttl;
            g[8..24].copy_from_slice(&s);
            g[24..40].copy_from_slice(&d);
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{AccessFlags, VecMemory};
    use crate::wr::{SendFlags, Sge};
    use monel_wire::{IpAddress, LKey, Psn, RKey};

    const QKEY: QKey = QKey(0x1111_1111);

    fn up(qpn: u32) -> UdQp {
        let mut q = UdQp::new(Qpn::new(qpn), QpCaps::default(), 1024);
        let mut a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            ..QpAttr::default()
        };
        q.modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )
        .unwrap();
        a.qp_state = QpState::Rtr;
        q.modify(&a, AttrMask::STATE).unwrap();
        a.qp_state = QpState::Rts;
        a.sq_psn = Psn::new(0x77);
        q.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
        q
    }

    fn dest(qpn: u32, qkey: QKey) -> UdDest {
        UdDest {
            av: AddressVector::default(),
            remote_qpn: Qpn::new(qpn),
            remote_qkey: qkey,
        }
    }

    fn send(len: u32, imm: Option<u32>) -> SendWr {
        SendWr {
            wr_id: 7,
            op: imm.map_or(SendOp::Send, SendOp::SendImm),
            sg_list: vec![Sge {
                addr: 0x1000,
                length: len,
                lkey: LKey(1),
            }],
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        }
    }

    fn grh() -> [u8; GRH_LEN] {
        grh_for(
            IpAddress::V4([10, 0, 0, 1]),
            IpAddress::V4([10, 0, 0, 2]),
            0x68,
            64,
            100,
        )
    }

    #[test]
    fn datagram_lands_after_the_grh_with_sender_qpn_and_immediate() {
        let mut mem = VecMemory::new();
        let src = mem.register(2048, LKey(1), RKey(1), AccessFlags::LOCAL_WRITE);
        assert_eq!(src, 0x1000);
        let dst = mem.register(2048, LKey(2), RKey(2), AccessFlags::LOCAL_WRITE);
        for (i, b) in mem.bytes_mut(src, 300).iter_mut().enumerate() {
            *b = i as u8;
        }
        let (mut a, mut b) = (up(0x21), up(0x22));
        b.post_recv(RecvWr {
            wr_id: 9,
            sg_list: vec![Sge {
                addr: dst,
                length: 2048,
                lkey: LKey(2),
            }],
        })
        .unwrap();
        a.post_send(send(300, Some(0xabc)), dest(0x22, QKEY))
            .unwrap();
        let mut buf = [0u8; 2048];
        let t = a.poll_transmit(&mut buf, &mem).unwrap();
        assert!(a.poll_transmit(&mut buf, &mem).is_none());
        let wc = a.poll_send_completion().unwrap();
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
        let pkt = RocePacket::new_checked(&buf[..t.len]).unwrap();
        assert_eq!(pkt.opcode(), Opcode::UD_SEND_ONLY_IMM);
        assert_eq!(pkt.bth().psn(), Psn::new(0x77));
        let g = grh();
        b.handle_packet(&buf[..t.len], &g, &mut mem);
        let wc = b.poll_recv_completion().unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len, 340);
        assert_eq!(wc.src_qp, Qpn::new(0x21));
        assert_eq!(wc.imm, Some(0xabc));
        assert!(wc.grh);
        assert_eq!(mem.bytes(dst, 40), &g[..]);
        let want: Vec<u8> = (0..300).map(|i| i as u8).collect();
        assert_eq!(mem.bytes(dst + 40, 300), &want[..]);
        // The IPv4 header in the GRH has a valid checksum.
        assert!(monel_wire::Ipv4Header::new_unchecked(&g[20..]).verify_checksum());
    }

    #[test]
    fn wrong_qkey_no_receive_and_rc_opcodes_are_dropped_and_counted() {
        let mut mem = VecMemory::new();
        mem.register(2048, LKey(1), RKey(1), AccessFlags::LOCAL_WRITE);
        let dst = mem.register(2048, LKey(2), RKey(2), AccessFlags::LOCAL_WRITE);
        let (mut a, mut b) = (up(0x21), up(0x22));
        let mut buf = [0u8; 2048];
        // Wrong Q_Key.
        a.post_send(send(10, None), dest(0x22, QKey(5))).unwrap();
        let t = a.poll_transmit(&mut buf, &mem).unwrap();
        b.post_recv(RecvWr {
            wr_id: 1,
            sg_list: vec![Sge {
                addr: dst,
                length: 2048,
                lkey: LKey(2),
            }],
        })
        .unwrap();
        b.handle_packet(&buf[..t.len], &grh(), &mut mem);
        assert_eq!(b.stats().qkey_violations, 1);
        assert!(b.poll_recv_completion().is_none());
        assert_eq!(b.posted_recvs(), 1, "the receive is not consumed");
        // A Q_Key with the top bit set sends the sender's own Q_Key.
        a.post_send(send(10, None), dest(0x22, QKey(0x8000_0000)))
            .unwrap();
        let t = a.poll_transmit(&mut buf, &mem).unwrap();
        b.handle_packet(&buf[..t.len], &grh(), &mut mem);
        assert_eq!(b.poll_recv_completion().unwrap().status, WcStatus::Success);
        // No receive posted.
        b.handle_packet(&buf[..t.len], &grh(), &mut mem);
        assert_eq!(b.stats().no_recv_drops, 1);
        // Garbage and truncation.
        b.handle_packet(&buf[..5], &grh(), &mut mem);
        let mut rc = buf;
        rc[0] = Opcode::RC_SEND_ONLY.0;
        b.handle_packet(&rc[..t.len], &grh(), &mut mem);
        assert_eq!(b.stats().dropped, 2);
    }

    #[test]
    fn posts_are_checked_and_receive_too_small_completes_with_length_error() {
        let mut mem = VecMemory::new();
        mem.register(4096, LKey(1), RKey(1), AccessFlags::LOCAL_WRITE);
        let dst = mem.register(64, LKey(2), RKey(2), AccessFlags::LOCAL_WRITE);
        let (mut a, mut b) = (up(0x21), up(0x22));
        assert_eq!(
            a.post_send(send(1025, None), dest(0x22, QKEY)),
            Err(PostError::MessageTooLong)
        );
        let mut w = send(8, None);
        w.op = SendOp::Write(crate::RemoteAddr {
            addr: 0,
            rkey: RKey(1),
        });
        assert_eq!(
            a.post_send(w, dest(0x22, QKEY)),
            Err(PostError::UnsupportedOp)
        );
        let mut fresh = UdQp::new(Qpn::new(0x30), QpCaps::default(), 1024);
        assert_eq!(
            fresh.post_send(send(8, None), dest(0x22, QKEY)),
            Err(PostError::InvalidState(QpState::Reset))
        );
        assert!(matches!(
            fresh.modify(
                &QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    ..QpAttr::default()
                },
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT
            ),
            Err(ModifyError::MissingAttrs { .. })
        ));
        b.post_recv(RecvWr {
            wr_id: 3,
            sg_list: vec![Sge {
                addr: dst,
                length: 64,
                lkey: LKey(2),
            }],
        })
        .unwrap();
        a.post_send(send(100, None), dest(0x22, QKEY)).unwrap();
        let mut buf = [0u8; 2048];
        let t = a.poll_transmit(&mut buf, &mem).unwrap();
        b.handle_packet(&buf[..t.len], &grh(), &mut mem);
        assert_eq!(
            b.poll_recv_completion().unwrap().status,
            WcStatus::LocLenErr
        );
        // The QP goes on: to ERR only by modify, which flushes.
        b.post_recv(RecvWr {
            wr_id: 4,
            sg_list: vec![],
        })
        .unwrap();
        b.modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            AttrMask::STATE,
        )
        .unwrap();
        let wc = b.poll_recv_completion().unwrap();
        assert_eq!((wc.wr_id, wc.status), (4, WcStatus::WrFlushErr));
    }
}
