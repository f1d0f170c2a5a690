//! Extension transport headers: RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH and DETH.

use crate::field::{be24, be32, be64, header_view, set24, set32, set64};
use crate::{Msn, QKey, Qpn, RKey, Result};

header_view!(
    /// RDMA extended transport header (16 bytes): virtual address, R_Key, DMA length.
    RethPacket,
    16
);
impl<T: AsRef<[u8]>> RethPacket<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> RKey {
        RKey(be32(self.buffer.as_ref(), 8))
    }
    /// DMA length of the whole message.
    pub fn dma_len(&self) -> u32 {
        be32(self.buffer.as_ref(), 12)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> RethPacket<T> {
    /// Sets all three fields.
    pub fn set(&mut self, va: u64, rkey: RKey, dma_len: u32) {
        let b = self.buffer.as_mut();
        set64(b, 0, va);
        set32(b, 8, rkey.0);
        set32(b, 12, dma_len);
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// DMA length.
    pub dma_len: u32,
}
impl RethRepr {
    /// Parses a RETH.
    pub fn parse<T: AsRef<[u8]>>(p: &RethPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }
    /// Emits a RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RethPacket<T>) {
        p.set(self.va, self.rkey, self.dma_len);
    }
}

/// NAK codes of the AETH (syndrome 0x60 | code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the responder expected the PSN carried by the NAK.
    PsnSequenceError,
    /// Invalid request (unsupported opcode, bad length, misaligned atomic, no resources).
    InvalidRequest,
    /// Remote access error (R_Key, bounds or access rights).
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request (RD only).
    InvalidRdRequest,
    /// A reserved code (5..=31).
    Reserved(u8),
}

impl NakCode {
    const fn code(self) -> u8 {
        match self {
            Self::PsnSequenceError => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccessError => 2,
            Self::RemoteOperationalError => 3,
            Self::InvalidRdRequest => 4,
            Self::Reserved(c) => c & 0x1f,
        }
    }
}

/// The AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement with an end-to-end credit count (0x1f = unlimited, as rxe).
    Ack {
        /// Credit count code (5 bits).
        credits: u8,
    },
    /// Receiver not ready: retry after the delay this 5-bit timer code names.
    RnrNak {
        /// RNR timer code (IBA table 45).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A syndrome of the reserved class (0x40) or with the reserved high bit set.
    Reserved(u8),
}

impl AethSyndrome {
    /// The credit code of an unlimited-credit ACK.
    pub const ACK_UNLIMITED: Self = Self::Ack { credits: 0x1f };

    /// Decodes a syndrome byte.
    pub const fn from_byte(b: u8) -> Self {
        if b & 0x80 != 0 {
            return Self::Reserved(b);
        }
        match b & 0x60 {
            0x00 => Self::Ack { credits: b & 0x1f },
            0x20 => Self::RnrNak { timer: b & 0x1f },
            0x60 => Self::Nak(match b & 0x1f {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                c => NakCode::Reserved(c),
            }),
            _ => Self::Reserved(b),
        }
    }
    /// Encodes the syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Self::Ack { credits } => credits & 0x1f,
            Self::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Self::Nak(code) => 0x60 | code.code(),
            Self::Reserved(b) => b,
        }
    }
}

header_view!(
    /// ACK extended transport header (4 bytes): syndrome and MSN.
    AethPacket,
    4
);
impl<T: AsRef<[u8]>> AethPacket<T> {
    /// Syndrome.
    pub fn syndrome(&self) -> AethSyndrome {
        AethSyndrome::from_byte(self.buffer.as_ref()[0])
    }
    /// Message sequence number.
    pub fn msn(&self) -> Msn {
        Msn::new(be24(self.buffer.as_ref(), 1))
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> AethPacket<T> {
    /// Sets syndrome and MSN.
    pub fn set(&mut self, syndrome: AethSyndrome, msn: Msn) {
        let b = self.buffer.as_mut();
        b[0] = syndrome.to_byte();
        set24(b, 1, msn.value());
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: AethSyndrome,
    /// Message sequence number.
    pub msn: Msn,
}
impl AethRepr {
    /// Parses an AETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AethPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            syndrome: p.syndrome(),
            msn: p.msn(),
        })
    }
    /// Emits an AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AethPacket<T>) {
        p.set(self.syndrome, self.msn);
    }
}

header_view!(
    /// Atomic extended transport header (28 bytes).
    AtomicEthPacket,
    28
);
impl<T: AsRef<[u8]>> AtomicEthPacket<T> {
    /// Remote virtual address (must be 8-byte aligned).
    pub fn va(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> RKey {
        RKey(be32(self.buffer.as_ref(), 8))
    }
    /// Swap value (COMPARE_SWAP) or addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        be64(self.buffer.as_ref(), 12)
    }
    /// Compare value (COMPARE_SWAP only).
    pub fn compare(&self) -> u64 {
        be64(self.buffer.as_ref(), 20)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEthPacket<T> {
    /// Sets all fields.
    pub fn set(&mut self, va: u64, rkey: RKey, swap_add: u64, compare: u64) {
        let b = self.buffer.as_mut();
        set64(b, 0, va);
        set32(b, 8, rkey.0);
        set64(b, 12, swap_add);
        set64(b, 20, compare);
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: RKey,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}
impl AtomicEthRepr {
    /// Parses an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicEthPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }
    /// Emits an AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicEthPacket<T>) {
        p.set(self.va, self.rkey, self.swap_add, self.compare);
    }
}

header_view!(
    /// Atomic acknowledge extended transport header (8 bytes): the original remote value.
    AtomicAckEthPacket,
    8
);
impl<T: AsRef<[u8]>> AtomicAckEthPacket<T> {
    /// Value at the target before the atomic executed.
    pub fn orig(&self) -> u64 {
        be64(self.buffer.as_ref(), 0)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEthPacket<T> {
    /// Sets the original value.
    pub fn set_orig(&mut self, v: u64) {
        set64(self.buffer.as_mut(), 0, v);
    }
}

header_view!(
    /// Immediate data (4 bytes), carried verbatim.
    ImmDtPacket,
    4
);
impl<T: AsRef<[u8]>> ImmDtPacket<T> {
    /// The immediate value in network byte order, read as a big-endian `u32`.
    pub fn imm(&self) -> u32 {
        be32(self.buffer.as_ref(), 0)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDtPacket<T> {
    /// Sets the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        set32(self.buffer.as_mut(), 0, v);
    }
}

header_view!(
    /// Invalidate extended transport header (4 bytes): the R_Key to invalidate.
    IethPacket,
    4
);
impl<T: AsRef<[u8]>> IethPacket<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> RKey {
        RKey(be32(self.buffer.as_ref(), 0))
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> IethPacket<T> {
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, k: RKey) {
        set32(self.buffer.as_mut(), 0, k.0);
    }
}

header_view!(
    /// Datagram extended transport header (8 bytes): Q_Key and source QP.
    DethPacket,
    8
);
impl<T: AsRef<[u8]>> DethPacket<T> {
    /// Queue key.
    pub fn qkey(&self) -> QKey {
        QKey(be32(self.buffer.as_ref(), 0))
    }
    /// The reserved byte.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[4]
    }
    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(be24(self.buffer.as_ref(), 5))
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> DethPacket<T> {
    /// Sets the fields (reserved byte 0).
    pub fn set(&mut self, qkey: QKey, src_qp: Qpn) {
        let b = self.buffer.as_mut();
        set32(b, 0, qkey.0);
        b[4] = 0;
        set24(b, 5, src_qp.value());
    }
}

/// A parsed DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: QKey,
    /// Source QP.
    pub src_qp: Qpn,
}
impl DethRepr {
    /// Parses a DETH.
    pub fn parse<T: AsRef<[u8]>>(p: &DethPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
        })
    }
    /// Emits a DETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DethPacket<T>) {
        p.set(self.qkey, self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WireError;

    #[test]
    fn reth_roundtrip() {
        static BYTES: [u8; 16] = [
            0, 0, 0x7f, 0xff, 0x12, 0x34, 0x56, 0x78, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0x10, 0,
        ];
        let r = RethRepr::parse(&RethPacket::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(r.va, 0x7fff_1234_5678);
        assert_eq!(r.rkey, RKey(0xdead_beef));
        assert_eq!(r.dma_len, 4096);
        let mut out = [0xa5u8; 16];
        r.emit(&mut RethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert_eq!(
            RethPacket::new_checked(&BYTES[..15]).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn aeth_syndromes() {
        for b in 0..=255u8 {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(AethSyndrome::from_byte(0x1f), AethSyndrome::ACK_UNLIMITED);
        assert_eq!(
            AethSyndrome::from_byte(0x2c),
            AethSyndrome::RnrNak { timer: 12 }
        );
        assert_eq!(
            AethSyndrome::from_byte(0x62),
            AethSyndrome::Nak(NakCode::RemoteAccessError)
        );
        let bytes = [0x1f, 0x00, 0x01, 0x02];
        let a = AethRepr::parse(&AethPacket::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(a.msn, Msn::new(0x102));
    }

    #[test]
    fn atomic_and_deth() {
        let mut b = [0u8; 28];
        let r = AtomicEthRepr {
            va: 0x1000,
            rkey: RKey(7),
            swap_add: 5,
            compare: u64::MAX,
        };
        r.emit(&mut AtomicEthPacket::new_unchecked(&mut b[..]));
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEthPacket::new_unchecked(&b[..])),
            Ok(r)
        );
        let mut d = [0xffu8; 8];
        let dr = DethRepr {
            qkey: QKey(0x1111_1111),
            src_qp: Qpn::new(0x42),
        };
        dr.emit(&mut DethPacket::new_unchecked(&mut d[..]));
        assert_eq!(d, [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x42]);
        assert_eq!(DethRepr::parse(&DethPacket::new_unchecked(&d[..])), Ok(dr));
    }
}
