//! A whole RoCE transport packet: BTH, extension headers, payload, pad and ICRC, i.e. the UDP
//! payload of a RoCEv2 datagram.

use core::fmt;

use crate::ext::{IethPacket, ImmDtPacket};
use crate::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicEthPacket, AtomicEthRepr, BthPacket, BthRepr,
    DethPacket, DethRepr, ExtLayout, ICRC_LEN, Opcode, RKey, Result, RethPacket, RethRepr,
    WireError,
};

/// Pad bytes needed after a payload of `len` bytes (`(-len) & 3`).
pub const fn pad_for(len: usize) -> u8 {
    (len.wrapping_neg() & 3) as u8
}

/// Zero-copy view of a RoCE transport packet (the UDP payload).
///
/// `check_len` validates the opcode, every extension header the opcode names, the pad count
/// and room for the ICRC; after it succeeds no accessor panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }
    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }
    /// Checks the buffer against the opcode's layout, pad count and ICRC.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < BthRepr::LEN {
            return Err(WireError::Truncated);
        }
        let bth = BthPacket::new_unchecked(b);
        if bth.tver() != 0 {
            return Err(WireError::BadTver(bth.tver()));
        }
        let op = bth.opcode();
        let layout = op.layout().ok_or(WireError::UnsupportedOpcode(op.0))?;
        let fixed = BthRepr::LEN + layout.len() + ICRC_LEN;
        if b.len() < fixed {
            return Err(WireError::Truncated);
        }
        let variable = b.len() - fixed;
        let pad = usize::from(bth.pad_count());
        if variable < pad || (!op.has_payload() && variable != 0) {
            return Err(WireError::BadLength);
        }
        Ok(())
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// The whole packet as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The BTH.
    pub fn bth(&self) -> BthPacket<&[u8]> {
        BthPacket::new_unchecked(&self.buffer.as_ref()[..BthRepr::LEN])
    }
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[0])
    }
    fn layout(&self) -> ExtLayout {
        self.opcode().layout().unwrap_or(ExtLayout::None)
    }
    /// Length of BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        BthRepr::LEN + self.layout().len()
    }
    fn ext(&self, offset: usize, len: usize) -> &[u8] {
        &self.buffer.as_ref()[BthRepr::LEN + offset..BthRepr::LEN + offset + len]
    }
    /// The RETH, if the opcode carries one.
    pub fn reth(&self) -> Option<RethPacket<&[u8]>> {
        matches!(self.layout(), ExtLayout::Reth | ExtLayout::RethImm)
            .then(|| RethPacket::new_unchecked(self.ext(0, 16)))
    }
    /// The AETH, if the opcode carries one.
    pub fn aeth(&self) -> Option<AethPacket<&[u8]>> {
        matches!(self.layout(), ExtLayout::Aeth | ExtLayout::AethAtomicAck)
            .then(|| AethPacket::new_unchecked(self.ext(0, 4)))
    }
    /// The AtomicAckETH, if the opcode carries one.
    pub fn atomic_ack(&self) -> Option<AtomicAckEthPacket<&[u8]>> {
        matches!(self.layout(), ExtLayout::AethAtomicAck)
            .then(|| AtomicAckEthPacket::new_unchecked(self.ext(4, 8)))
    }
    /// The AtomicETH, if the opcode carries one.
    pub fn atomic_eth(&self) -> Option<AtomicEthPacket<&[u8]>> {
        matches!(self.layout(), ExtLayout::AtomicEth)
            .then(|| AtomicEthPacket::new_unchecked(self.ext(0, 28)))
    }
    /// The DETH, if the opcode carries one.
    pub fn deth(&self) -> Option<DethPacket<&[u8]>> {
        matches!(self.layout(), ExtLayout::Deth | ExtLayout::DethImm)
            .then(|| DethPacket::new_unchecked(self.ext(0, 8)))
    }
    /// The immediate data, if the opcode carries it.
    pub fn imm(&self) -> Option<u32> {
        let at = match self.layout() {
            ExtLayout::Imm => 0,
            ExtLayout::RethImm => 16,
            ExtLayout::DethImm => 8,
            _ => return None,
        };
        Some(ImmDtPacket::new_unchecked(self.ext(at, 4)).imm())
    }
    /// The R_Key of the IETH, if the opcode carries one.
    pub fn ieth(&self) -> Option<RKey> {
        matches!(self.layout(), ExtLayout::Ieth)
            .then(|| IethPacket::new_unchecked(self.ext(0, 4)).rkey())
    }
    /// The payload (without pad).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN - usize::from(self.bth().pad_count());
        &b[self.header_len()..end]
    }
    /// The pad bytes.
    pub fn pad(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN;
        &b[end - usize::from(self.bth().pad_count())..end]
    }
    /// The bytes the ICRC covers after the BTH: extension headers, payload and pad.
    pub fn covered_after_bth(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[BthRepr::LEN..b.len() - ICRC_LEN]
    }
    /// The ICRC as carried (its little-endian wire bytes read as a `u32`).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let n = b.len();
        u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RocePacket<T> {
    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let pad = usize::from(self.bth().pad_count());
        let b = self.buffer.as_mut();
        let end = b.len() - ICRC_LEN - pad;
        &mut b[start..end]
    }
    /// Stores an ICRC value (as little-endian wire bytes).
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        let n = b.len();
        b[n - 4..].copy_from_slice(&icrc.to_le_bytes());
    }
}

/// The extension headers of a packet, one variant per layout an opcode can name.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeaders {
    None,
    Reth(RethRepr),
    RethImm(RethRepr, u32),
    Imm(u32),
    Ieth(RKey),
    Aeth(AethRepr),
    AethAtomicAck(AethRepr, u64),
    AtomicEth(AtomicEthRepr),
    Deth(DethRepr),
    DethImm(DethRepr, u32),
    /// The 16 reserved (zero on emit) bytes of a CNP.
    Cnp,
}

impl ExtHeaders {
    /// The layout this value fills.
    pub const fn layout(&self) -> ExtLayout {
        match self {
            Self::None => ExtLayout::None,
            Self::Reth(_) => ExtLayout::Reth,
            Self::RethImm(..) => ExtLayout::RethImm,
            Self::Imm(_) => ExtLayout::Imm,
            Self::Ieth(_) => ExtLayout::Ieth,
            Self::Aeth(_) => ExtLayout::Aeth,
            Self::AethAtomicAck(..) => ExtLayout::AethAtomicAck,
            Self::AtomicEth(_) => ExtLayout::AtomicEth,
            Self::Deth(_) => ExtLayout::Deth,
            Self::DethImm(..) => ExtLayout::DethImm,
            Self::Cnp => ExtLayout::Cnp,
        }
    }
}

/// A parsed RoCE packet: headers by value, the payload left in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoceRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// Extension headers (must fit `bth.opcode`).
    pub ext: ExtHeaders,
    /// Payload length in bytes (without pad).
    pub payload_len: usize,
}

impl RoceRepr {
    /// Parses a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &RocePacket<T>) -> Result<Self> {
        p.check_len()?;
        let bth = BthRepr::parse(&p.bth())?;
        let layout = bth
            .opcode
            .layout()
            .ok_or(WireError::UnsupportedOpcode(bth.opcode.0))?;
        let reth = || p.reth().map(|r| RethRepr::parse(&r)).transpose();
        let aeth = || p.aeth().map(|a| AethRepr::parse(&a)).transpose();
        let deth = || p.deth().map(|d| DethRepr::parse(&d)).transpose();
        let missing = WireError::HeaderMismatch;
        let ext = match layout {
            ExtLayout::None => ExtHeaders::None,
            ExtLayout::Reth => ExtHeaders::Reth(reth()?.ok_or(missing)?),
            ExtLayout::RethImm => {
                ExtHeaders::RethImm(reth()?.ok_or(missing)?, p.imm().ok_or(missing)?)
            }
            ExtLayout::Imm => ExtHeaders::Imm(p.imm().ok_or(missing)?),
            ExtLayout::Ieth => ExtHeaders::Ieth(p.ieth().ok_or(missing)?),
            ExtLayout::Aeth => ExtHeaders::Aeth(aeth()?.ok_or(missing)?),
            ExtLayout::AethAtomicAck => ExtHeaders::AethAtomicAck(
                aeth()?.ok_or(missing)?,
                p.atomic_ack().ok_or(missing)?.orig(),
            ),
            ExtLayout::AtomicEth => {
                ExtHeaders::AtomicEth(AtomicEthRepr::parse(&p.atomic_eth().ok_or(missing)?)?)
            }
            ExtLayout::Deth => ExtHeaders::Deth(deth()?.ok_or(missing)?),
            ExtLayout::DethImm => {
                ExtHeaders::DethImm(deth()?.ok_or(missing)?, p.imm().ok_or(missing)?)
            }
            ExtLayout::Cnp => ExtHeaders::Cnp,
        };
        Ok(Self {
            bth,
            ext,
            payload_len: p.payload().len(),
        })
    }

    /// Length of BTH plus extension headers.
    pub const fn header_len(&self) -> usize {
        BthRepr::LEN + self.ext.layout().len()
    }

    /// Length of the whole packet including pad and ICRC.
    pub const fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + self.bth.pad_count as usize + ICRC_LEN
    }

    /// Writes headers and zero pad into `buf` (at least `buffer_len()` bytes; only that much
    /// is used). The payload bytes are the caller's to fill (`RocePacket::payload_mut`), the
    /// ICRC the framing's. Returns the packet length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let layout = self
            .bth
            .opcode
            .layout()
            .ok_or(WireError::UnsupportedOpcode(self.bth.opcode.0))?;
        if layout != self.ext.layout()
            || (self.payload_len != 0 && !self.bth.opcode.has_payload())
            || self.bth.pad_count > 3
        {
            return Err(WireError::HeaderMismatch);
        }
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(WireError::Truncated);
        }
        let buf = &mut buf[..len];
        self.bth
            .emit(&mut BthPacket::new_unchecked(&mut buf[..BthRepr::LEN]));
        let ext = &mut buf[BthRepr::LEN..];
        match self.ext {
            ExtHeaders::None => {}
            ExtHeaders::Reth(r) => r.emit(&mut RethPacket::new_unchecked(&mut ext[..16])),
            ExtHeaders::RethImm(r, imm) => {
                r.emit(&mut RethPacket::new_unchecked(&mut ext[..16]));
                ImmDtPacket::new_unchecked(&mut ext[16..20]).set_imm(imm);
            }
            ExtHeaders::Imm(imm) => ImmDtPacket::new_unchecked(&mut ext[..4]).set_imm(imm),
            ExtHeaders::Ieth(k) => IethPacket::new_unchecked(&mut ext[..4]).set_rkey(k),
            ExtHeaders::Aeth(a) => a.emit(&mut AethPacket::new_unchecked(&mut ext[..4])),
            ExtHeaders::AethAtomicAck(a, orig) => {
                a.emit(&mut AethPacket::new_unchecked(&mut ext[..4]));
                AtomicAckEthPacket::new_unchecked(&mut ext[4..12]).set_orig(orig);
            }
            ExtHeaders::AtomicEth(a) => a.emit(&mut AtomicEthPacket::new_unchecked(&mut ext[..28])),
            ExtHeaders::Deth(d) => d.emit(&mut DethPacket::new_unchecked(&mut ext[..8])),
            ExtHeaders::DethImm(d, imm) => {
                d.emit(&mut DethPacket::new_unchecked(&mut ext[..8]));
                ImmDtPacket::new_unchecked(&mut ext[8..12]).set_imm(imm);
            }
            ExtHeaders::Cnp => ext[..16].fill(0),
        }
        let pad_end = len - ICRC_LEN;
        buf[pad_end - usize::from(self.bth.pad_count)..pad_end].fill(0);
        Ok(len)
    }
}

impl<T: AsRef<[u8]>> fmt::Display for RocePacket<T> {
    /// One line in the spirit of tcpdump, e.g.
    /// `RC_SEND_FIRST qp=0x000011 psn=5 A len=1024`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let repr = match RoceRepr::parse(self) {
            Ok(r) => r,
            Err(e) => return write!(f, "malformed RoCE packet ({e})"),
        };
        let b = &repr.bth;
        write!(f, "{} qp={} psn={}", b.opcode, b.dest_qp, b.psn)?;
        if b.ack_req {
            f.write_str(" A")?;
        }
        if b.solicited {
            f.write_str(" SE")?;
        }
        if b.becn {
            f.write_str(" BECN")?;
        }
        if b.fecn {
            f.write_str(" FECN")?;
        }
        match repr.ext {
            ExtHeaders::Reth(r) | ExtHeaders::RethImm(r, _) => {
                write!(f, " reth(va={:#x} rkey={} len={})", r.va, r.rkey, r.dma_len)?;
            }
            ExtHeaders::Aeth(a) | ExtHeaders::AethAtomicAck(a, _) => {
                write!(f, " aeth({:?} msn={})", a.syndrome, a.msn.value())?;
            }
            ExtHeaders::AtomicEth(a) => write!(
                f,
                " atomic(va={:#x} rkey={} swap_add={:#x} cmp={:#x})",
                a.va, a.rkey, a.swap_add, a.compare
            )?,
            ExtHeaders::Deth(d) | ExtHeaders::DethImm(d, _) => {
                write!(f, " deth(qkey={} src_qp={})", d.qkey, d.src_qp)?;
            }
            ExtHeaders::Ieth(k) => write!(f, " ieth(rkey={k})")?,
            ExtHeaders::None | ExtHeaders::Imm(_) | ExtHeaders::Cnp => {}
        }
        if let ExtHeaders::AethAtomicAck(_, orig) = repr.ext {
            write!(f, " orig={orig:#x}")?;
        }
        if let Some(imm) = self.imm() {
            write!(f, " imm={imm:#010x}")?;
        }
        if repr.payload_len > 0 {
            write!(f, " len={}", repr.payload_len)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AethSyndrome, Msn, PKey, Psn, Qpn};

    fn bth(opcode: Opcode, pad: u8) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            migreq: false,
            pad_count: pad,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x11),
            ack_req: true,
            psn: Psn::new(7),
        }
    }

    #[test]
    fn emit_parse_write_only_imm() {
        let repr = RoceRepr {
            bth: bth(Opcode::RC_WRITE_ONLY_IMM, pad_for(5)),
            ext: ExtHeaders::RethImm(
                RethRepr {
                    va: 0x1000,
                    rkey: RKey(0x99),
                    dma_len: 5,
                },
                0xcafe_f00d,
            ),
            payload_len: 5,
        };
        let mut buf = [0xa5u8; 64];
        let n = repr.emit(&mut buf).unwrap();
        assert_eq!(n, 12 + 20 + 5 + 3 + 4);
        let mut p = RocePacket::new_unchecked(&mut buf[..n]);
        p.payload_mut().copy_from_slice(b"hello");
        let p = RocePacket::new_checked(&buf[..n]).unwrap();
        assert_eq!(p.payload(), b"hello");
        assert_eq!(p.pad(), &[0, 0, 0]);
        assert_eq!(p.imm(), Some(0xcafe_f00d));
        assert_eq!(RoceRepr::parse(&p).unwrap(), repr);
        let shown = format!("{p}");
        assert!(
            shown.starts_with("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE qp=0x000011 psn=7 A"),
            "{shown}"
        );
    }

    #[test]
    fn header_mismatch_is_refused() {
        let repr = RoceRepr {
            bth: bth(Opcode::RC_ACKNOWLEDGE, 0),
            ext: ExtHeaders::None,
            payload_len: 0,
        };
        assert_eq!(repr.emit(&mut [0u8; 64]), Err(WireError::HeaderMismatch));
        let ok = RoceRepr {
            ext: ExtHeaders::Aeth(AethRepr {
                syndrome: AethSyndrome::ACK_UNLIMITED,
                msn: Msn::new(1),
            }),
            ..repr
        };
        assert_eq!(ok.emit(&mut [0u8; 20]), Ok(20));
        assert_eq!(ok.emit(&mut [0u8; 19]), Err(WireError::Truncated));
    }

    #[test]
    fn malformed_lengths() {
        // ACK with a payload byte.
        let mut b = [0u8; 21];
        b[0] = 0x11;
        assert_eq!(
            RocePacket::new_checked(&b[..]).unwrap_err(),
            WireError::BadLength
        );
        // Pad count larger than what is there.
        let mut s = [0u8; 17];
        s[0] = 0x04;
        s[1] = 0x30;
        assert_eq!(
            RocePacket::new_checked(&s[..]).unwrap_err(),
            WireError::BadLength
        );
        assert_eq!(
            RocePacket::new_checked(&s[..15]).unwrap_err(),
            WireError::Truncated
        );
        s[0] = 0x15;
        assert_eq!(
            RocePacket::new_checked(&s[..]).unwrap_err(),
            WireError::UnsupportedOpcode(0x15)
        );
    }
}
