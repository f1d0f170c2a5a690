//! Base transport header (12 bytes).

use crate::field::{be16, be24, header_view, set16, set24};
use crate::{Opcode, PKey, Psn, Qpn, Result, WireError};

mod field {
    use crate::field::Field;
    pub(super) const OPCODE: usize = 0;
    pub(super) const FLAGS: usize = 1;
    pub(super) const PKEY: Field = 2..4;
    pub(super) const BYTE4: usize = 4;
    pub(super) const DEST_QP: Field = 5..8;
    pub(super) const BYTE8: usize = 8;
    pub(super) const PSN: Field = 9..12;
}

/// BTH byte 1: solicited event.
pub const SE: u8 = 0x80;
/// BTH byte 1: migration request.
pub const MIG: u8 = 0x40;
/// BTH byte 1: pad count bits.
pub const PAD_MASK: u8 = 0x30;
/// BTH byte 1: transport header version bits.
pub const TVER_MASK: u8 = 0x0f;
/// BTH byte 4: forward explicit congestion notification.
pub const FECN: u8 = 0x80;
/// BTH byte 4: backward explicit congestion notification.
pub const BECN: u8 = 0x40;
/// BTH byte 8: acknowledge request.
pub const ACK_REQ: u8 = 0x80;

header_view!(
    /// Zero-copy view of a BTH.
    BthPacket,
    field::PSN.end
);

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited event bit.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }
    /// Migration request bit.
    pub fn migreq(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG != 0
    }
    /// Number of pad bytes (0..=3) before the ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> 4
    }
    /// Transport header version (must be 0).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }
    /// Partition key.
    pub fn pkey(&self) -> PKey {
        PKey(be16(self.buffer.as_ref(), field::PKEY.start))
    }
    /// FECN bit.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::BYTE4] & FECN != 0
    }
    /// BECN bit.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::BYTE4] & BECN != 0
    }
    /// The six reserved bits of byte 4.
    pub fn resv6a(&self) -> u8 {
        self.buffer.as_ref()[field::BYTE4] & 0x3f
    }
    /// Destination queue pair.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(be24(self.buffer.as_ref(), field::DEST_QP.start))
    }
    /// Acknowledge request bit.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::BYTE8] & ACK_REQ != 0
    }
    /// The seven reserved bits of byte 8.
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::BYTE8] & 0x7f
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be24(self.buffer.as_ref(), field::PSN.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = op.0;
    }
    /// Sets byte 1 from its parts (TVer 0).
    pub fn set_flags(&mut self, solicited: bool, migreq: bool, pad: u8) {
        self.buffer.as_mut()[field::FLAGS] =
            (if solicited { SE } else { 0 }) | (if migreq { MIG } else { 0 }) | ((pad & 3) << 4);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: PKey) {
        set16(self.buffer.as_mut(), field::PKEY.start, pkey.0);
    }
    /// Sets the FECN and BECN bits (reserved bits cleared).
    pub fn set_congestion(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::BYTE4] =
            (if fecn { FECN } else { 0 }) | (if becn { BECN } else { 0 });
    }
    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, qpn: Qpn) {
        set24(self.buffer.as_mut(), field::DEST_QP.start, qpn.value());
    }
    /// Sets the acknowledge request bit (reserved bits cleared).
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.buffer.as_mut()[field::BYTE8] = if ack_req { ACK_REQ } else { 0 };
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        set24(self.buffer.as_mut(), field::PSN.start, psn.value());
    }
}

/// A parsed BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub migreq: bool,
    /// Pad bytes before the ICRC (0..=3).
    pub pad_count: u8,
    /// Partition key.
    pub pkey: PKey,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification (set in RoCEv2 CNPs).
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Length of the emitted header.
    pub const LEN: usize = 12;

    /// Parses a BTH; rejects a transport version other than 0 (reserved bits are ignored on
    /// receive, as the spec and rxe do).
    pub fn parse<T: AsRef<[u8]>>(p: &BthPacket<T>) -> Result<Self> {
        p.check_len()?;
        if p.tver() != 0 {
            return Err(WireError::BadTver(p.tver()));
        }
        Ok(Self {
            opcode: p.opcode(),
            solicited: p.solicited(),
            migreq: p.migreq(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Writes the header into the first 12 bytes of `p`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut BthPacket<T>) {
        p.set_opcode(self.opcode);
        p.set_flags(self.solicited, self.migreq, self.pad_count);
        p.set_pkey(self.pkey);
        p.set_congestion(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // UC SEND_ONLY from the scapy RoCE test (M=1, PadCnt=2, DestQP 0xd3, PSN 13571856).
    static PACKET_BYTES: [u8; 12] = [
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
    ];

    #[test]
    fn deconstruct() {
        let p = BthPacket::new_checked(&PACKET_BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::UC_SEND_ONLY);
        assert!(!p.solicited());
        assert!(p.migreq());
        assert_eq!(p.pad_count(), 2);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), PKey::DEFAULT);
        assert_eq!(p.dest_qp(), Qpn::new(0xd3));
        assert!(!p.ack_req());
        assert_eq!(p.psn(), Psn::new(13_571_856));
    }

    #[test]
    fn construct() {
        let repr = BthRepr::parse(&BthPacket::new_unchecked(&PACKET_BYTES[..])).unwrap();
        let mut bytes = [0xa5u8; 12];
        repr.emit(&mut BthPacket::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, PACKET_BYTES);
    }

    #[test]
    fn impossible_len() {
        assert_eq!(
            BthPacket::new_checked(&PACKET_BYTES[..11]).unwrap_err(),
            WireError::Truncated
        );
        let mut bad = PACKET_BYTES;
        bad[1] |= 1;
        assert_eq!(
            BthRepr::parse(&BthPacket::new_unchecked(&bad[..])),
            Err(WireError::BadTver(1))
        );
    }
}
