//! BTH opcodes for RC, UC and UD, the RoCEv2 CNP, and the extension headers each one carries
//! (IBA vol. 1 table 38; header order as rxe's `rxe_opcode.c`).

use core::fmt;

/// Transport service, the top three bits of the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connection (0x00).
    Rc,
    /// Unreliable connection (0x20).
    Uc,
    /// Reliable datagram (0x40; not supported by rxe or Monel).
    Rd,
    /// Unreliable datagram (0x60).
    Ud,
    /// Congestion notification (0x80; the RoCEv2 CNP is 0x81).
    Cnp,
    /// Anything else (0xa0..=0xff: reserved and vendor specific).
    Other,
}

/// The operation an opcode names, independent of the transport.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    SendFirst,
    SendMiddle,
    SendLast,
    SendLastImm,
    SendOnly,
    SendOnlyImm,
    WriteFirst,
    WriteMiddle,
    WriteLast,
    WriteLastImm,
    WriteOnly,
    WriteOnlyImm,
    ReadRequest,
    ReadResponseFirst,
    ReadResponseMiddle,
    ReadResponseLast,
    ReadResponseOnly,
    Acknowledge,
    AtomicAcknowledge,
    CompareSwap,
    FetchAdd,
    SendLastInv,
    SendOnlyInv,
    /// RoCEv2 congestion notification packet.
    Cnp,
}

/// Which extension headers follow the BTH, in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtLayout {
    /// None: payload follows the BTH.
    None,
    /// RETH (16 B).
    Reth,
    /// RETH then ImmDt (20 B).
    RethImm,
    /// ImmDt (4 B).
    Imm,
    /// IETH (4 B).
    Ieth,
    /// AETH (4 B).
    Aeth,
    /// AETH then AtomicAckETH (12 B).
    AethAtomicAck,
    /// AtomicETH (28 B).
    AtomicEth,
    /// DETH (8 B).
    Deth,
    /// DETH then ImmDt (12 B).
    DethImm,
    /// The 16 reserved bytes of a RoCEv2 CNP.
    Cnp,
}

impl ExtLayout {
    /// Total length of the extension headers.
    pub const fn len(self) -> usize {
        match self {
            Self::None => 0,
            Self::Reth => 16,
            Self::RethImm => 20,
            Self::Imm | Self::Ieth | Self::Aeth => 4,
            Self::AethAtomicAck | Self::DethImm => 12,
            Self::AtomicEth => 28,
            Self::Deth => 8,
            Self::Cnp => 16,
        }
    }
    /// True if there are no extension headers.
    pub const fn is_empty(self) -> bool {
        matches!(self, Self::None)
    }
}

/// Every opcode's extension headers, worked out once at compile time: looked up on every
/// packet parsed and emitted.
const LAYOUTS: [Option<ExtLayout>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = Opcode(i as u8).derive_layout();
        i += 1;
    }
    t
};

/// A BTH opcode. Any byte can be held; [`Opcode::operation`] says whether it is one Monel
/// speaks.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

#[allow(missing_docs)]
impl Opcode {
    pub const RC_SEND_FIRST: Self = Self(0x00);
    pub const RC_SEND_MIDDLE: Self = Self(0x01);
    pub const RC_SEND_LAST: Self = Self(0x02);
    pub const RC_SEND_LAST_IMM: Self = Self(0x03);
    pub const RC_SEND_ONLY: Self = Self(0x04);
    pub const RC_SEND_ONLY_IMM: Self = Self(0x05);
    pub const RC_WRITE_FIRST: Self = Self(0x06);
    pub const RC_WRITE_MIDDLE: Self = Self(0x07);
    pub const RC_WRITE_LAST: Self = Self(0x08);
    pub const RC_WRITE_LAST_IMM: Self = Self(0x09);
    pub const RC_WRITE_ONLY: Self = Self(0x0a);
    pub const RC_WRITE_ONLY_IMM: Self = Self(0x0b);
    pub const RC_READ_REQUEST: Self = Self(0x0c);
    pub const RC_READ_RESPONSE_FIRST: Self = Self(0x0d);
    pub const RC_READ_RESPONSE_MIDDLE: Self = Self(0x0e);
    pub const RC_READ_RESPONSE_LAST: Self = Self(0x0f);
    pub const RC_READ_RESPONSE_ONLY: Self = Self(0x10);
    pub const RC_ACKNOWLEDGE: Self = Self(0x11);
    pub const RC_ATOMIC_ACKNOWLEDGE: Self = Self(0x12);
    pub const RC_COMPARE_SWAP: Self = Self(0x13);
    pub const RC_FETCH_ADD: Self = Self(0x14);
    pub const RC_SEND_LAST_INV: Self = Self(0x16);
    pub const RC_SEND_ONLY_INV: Self = Self(0x17);
    pub const UC_SEND_ONLY: Self = Self(0x24);
    pub const UD_SEND_ONLY: Self = Self(0x64);
    pub const UD_SEND_ONLY_IMM: Self = Self(0x65);
    /// The RoCEv2 CNP (IBA annex A17; 0x80 is the InfiniBand CC CNP).
    pub const CNP: Self = Self(0x81);
}

impl Opcode {
    /// The transport named by the top three bits.
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            _ => Transport::Other,
        }
    }

    /// The operation, or `None` if this opcode is not valid for its transport (or unsupported).
    pub const fn operation(self) -> Option<Operation> {
        use Operation::*;
        let low = self.0 & 0x1f;
        match self.transport() {
            Transport::Rc => Some(match low {
                0x00 => SendFirst,
                0x01 => SendMiddle,
                0x02 => SendLast,
                0x03 => SendLastImm,
                0x04 => SendOnly,
                0x05 => SendOnlyImm,
                0x06 => WriteFirst,
                0x07 => WriteMiddle,
                0x08 => WriteLast,
                0x09 => WriteLastImm,
                0x0a => WriteOnly,
                0x0b => WriteOnlyImm,
                0x0c => ReadRequest,
                0x0d => ReadResponseFirst,
                0x0e => ReadResponseMiddle,
                0x0f => ReadResponseLast,
                0x10 => ReadResponseOnly,
                0x11 => Acknowledge,
                0x12 => AtomicAcknowledge,
                0x13 => CompareSwap,
                0x14 => FetchAdd,
                0x16 => SendLastInv,
                0x17 => SendOnlyInv,
                _ => return None,
            }),
            Transport::Uc => Some(match low {
                0x00 => SendFirst,
                0x01 => SendMiddle,
                0x02 => SendLast,
                0x03 => SendLastImm,
                0x04 => SendOnly,
                0x05 => SendOnlyImm,
                0x06 => WriteFirst,
                0x07 => WriteMiddle,
                0x08 => WriteLast,
                0x09 => WriteLastImm,
                0x0a => WriteOnly,
                0x0b => WriteOnlyImm,
                _ => return None,
            }),
            Transport::Ud => match low {
                0x04 => Some(SendOnly),
                0x05 => Some(SendOnlyImm),
                _ => None,
            },
            Transport::Cnp => match low {
                0x01 => Some(Cnp),
                _ => None,
            },
            Transport::Rd | Transport::Other => None,
        }
    }

    /// The extension headers this opcode carries, or `None` if unsupported.
    pub const fn layout(self) -> Option<ExtLayout> {
        LAYOUTS[self.0 as usize]
    }

    /// [`Self::layout`] worked out from the operation (tabulated in `LAYOUTS`).
    const fn derive_layout(self) -> Option<ExtLayout> {
        use Operation::*;
        let Some(op) = self.operation() else {
            return None;
        };
        if matches!(self.transport(), Transport::Ud) {
            return Some(match op {
                SendOnlyImm => ExtLayout::DethImm,
                _ => ExtLayout::Deth,
            });
        }
        Some(match op {
            SendFirst | SendMiddle | SendLast | SendOnly | WriteMiddle | WriteLast
            | ReadResponseMiddle => ExtLayout::None,
            SendLastImm | SendOnlyImm | WriteLastImm => ExtLayout::Imm,
            WriteFirst | WriteOnly | ReadRequest => ExtLayout::Reth,
            WriteOnlyImm => ExtLayout::RethImm,
            ReadResponseFirst | ReadResponseLast | ReadResponseOnly | Acknowledge => {
                ExtLayout::Aeth
            }
            AtomicAcknowledge => ExtLayout::AethAtomicAck,
            CompareSwap | FetchAdd => ExtLayout::AtomicEth,
            SendLastInv | SendOnlyInv => ExtLayout::Ieth,
            Cnp => ExtLayout::Cnp,
        })
    }

    /// True if packets of this opcode may carry a payload.
    pub const fn has_payload(self) -> bool {
        use Operation::*;
        matches!(
            self.operation(),
            Some(
                SendFirst
                    | SendMiddle
                    | SendLast
                    | SendLastImm
                    | SendOnly
                    | SendOnlyImm
                    | WriteFirst
                    | WriteMiddle
                    | WriteLast
                    | WriteLastImm
                    | WriteOnly
                    | WriteOnlyImm
                    | ReadResponseFirst
                    | ReadResponseMiddle
                    | ReadResponseLast
                    | ReadResponseOnly
                    | SendLastInv
                    | SendOnlyInv
            )
        )
    }

    /// True for the requests a requester sends (SEND, WRITE, READ request, atomics).
    pub const fn is_request(self) -> bool {
        use Operation::*;
        match self.operation() {
            Some(op) => !matches!(
                op,
                ReadResponseFirst
                    | ReadResponseMiddle
                    | ReadResponseLast
                    | ReadResponseOnly
                    | Acknowledge
                    | AtomicAcknowledge
                    | Cnp
            ),
            None => false,
        }
    }

    /// A name as the InfiniBand tables spell it, e.g. `RC_SEND_FIRST`.
    pub const fn name(self) -> &'static str {
        use Operation::*;
        let Some(op) = self.operation() else {
            return "UNKNOWN";
        };
        let (t, o) = (
            match self.transport() {
                Transport::Rc => 0,
                Transport::Uc => 1,
                Transport::Ud => 2,
                _ => 3,
            },
            op,
        );
        match (t, o) {
            (_, Cnp) => "CNP",
            (2, SendOnly) => "UD_SEND_ONLY",
            (2, _) => "UD_SEND_ONLY_WITH_IMMEDIATE",
            (1, SendFirst) => "UC_SEND_FIRST",
            (1, SendMiddle) => "UC_SEND_MIDDLE",
            (1, SendLast) => "UC_SEND_LAST",
            (1, SendLastImm) => "UC_SEND_LAST_WITH_IMMEDIATE",
            (1, SendOnly) => "UC_SEND_ONLY",
            (1, SendOnlyImm) => "UC_SEND_ONLY_WITH_IMMEDIATE",
            (1, WriteFirst) => "UC_RDMA_WRITE_FIRST",
            (1, WriteMiddle) => "UC_RDMA_WRITE_MIDDLE",
            (1, WriteLast) => "UC_RDMA_WRITE_LAST",
            (1, WriteLastImm) => "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            (1, WriteOnly) => "UC_RDMA_WRITE_ONLY",
            (1, _) => "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            (_, SendFirst) => "RC_SEND_FIRST",
            (_, SendMiddle) => "RC_SEND_MIDDLE",
            (_, SendLast) => "RC_SEND_LAST",
            (_, SendLastImm) => "RC_SEND_LAST_WITH_IMMEDIATE",
            (_, SendOnly) => "RC_SEND_ONLY",
            (_, SendOnlyImm) => "RC_SEND_ONLY_WITH_IMMEDIATE",
            (_, WriteFirst) => "RC_RDMA_WRITE_FIRST",
            (_, WriteMiddle) => "RC_RDMA_WRITE_MIDDLE",
            (_, WriteLast) => "RC_RDMA_WRITE_LAST",
            (_, WriteLastImm) => "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            (_, WriteOnly) => "RC_RDMA_WRITE_ONLY",
            (_, WriteOnlyImm) => "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            (_, ReadRequest) => "RC_RDMA_READ_REQUEST",
            (_, ReadResponseFirst) => "RC_RDMA_READ_RESPONSE_FIRST",
            (_, ReadResponseMiddle) => "RC_RDMA_READ_RESPONSE_MIDDLE",
            (_, ReadResponseLast) => "RC_RDMA_READ_RESPONSE_LAST",
            (_, ReadResponseOnly) => "RC_RDMA_READ_RESPONSE_ONLY",
            (_, Acknowledge) => "RC_ACKNOWLEDGE",
            (_, AtomicAcknowledge) => "RC_ATOMIC_ACKNOWLEDGE",
            (_, CompareSwap) => "RC_COMPARE_SWAP",
            (_, FetchAdd) => "RC_FETCH_ADD",
            (_, SendLastInv) => "RC_SEND_LAST_WITH_INVALIDATE",
            (_, SendOnlyInv) => "RC_SEND_ONLY_WITH_INVALIDATE",
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}
impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_ib_spec() {
        assert_eq!(Opcode::RC_WRITE_ONLY_IMM.layout(), Some(ExtLayout::RethImm));
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE.layout(),
            Some(ExtLayout::AethAtomicAck)
        );
        assert_eq!(
            Opcode::RC_READ_RESPONSE_MIDDLE.layout(),
            Some(ExtLayout::None)
        );
        assert_eq!(Opcode::UD_SEND_ONLY_IMM.layout(), Some(ExtLayout::DethImm));
        assert_eq!(Opcode::CNP.layout(), Some(ExtLayout::Cnp));
        assert_eq!(Opcode(0x15).operation(), None);
        assert_eq!(Opcode(0x2c).operation(), None, "UC has no READ");
        assert_eq!(Opcode(0x44).operation(), None, "RD unsupported");
        assert_eq!(Opcode(0x80).operation(), None, "IB CC CNP is not RoCEv2");
        assert_eq!(Opcode::UC_SEND_ONLY.name(), "UC_SEND_ONLY");
        assert!(Opcode::RC_FETCH_ADD.is_request());
        assert!(!Opcode::RC_ACKNOWLEDGE.is_request());
        assert!(!Opcode::RC_READ_REQUEST.has_payload());
        // Every byte is classified without panicking, and names agree with validity.
        for b in 0..=255u8 {
            let op = Opcode(b);
            assert_eq!(op.layout().is_some(), op.operation().is_some());
            assert_eq!(op.name() == "UNKNOWN", op.operation().is_none());
        }
    }
}
