use core::fmt;

/// Why a sequence of bytes is not a valid RoCEv2 packet or frame.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireError {
    /// The buffer ends before the header or trailer it must hold.
    Truncated,
    /// A length field disagrees with the buffer or with the headers.
    BadLength,
    /// The BTH transport version is not 0.
    BadTver(u8),
    /// An opcode this crate does not know (reserved, RD, or vendor specific).
    UnsupportedOpcode(u8),
    /// An IP header of a version other than the one its ethertype or framing announced.
    BadIpVersion(u8),
    /// An IPv4 header with options (rxe and the ICRC assume exactly 20 bytes).
    Ipv4Options,
    /// A protocol other than UDP after the IP header, or an unsupported ethertype.
    NotUdp,
    /// A UDP destination port other than the RoCEv2 port the caller expects.
    NotRoce(u16),
    /// The invariant CRC does not match the packet.
    BadIcrc {
        /// The value carried by the packet (little-endian wire bytes read as `u32`).
        found: u32,
        /// The value computed over the packet.
        expected: u32,
    },
    /// A representation's extension headers do not fit its opcode.
    HeaderMismatch,
    /// A pcap file header or record that cannot be read.
    BadPcap,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated => f.write_str("truncated packet"),
            Self::BadLength => f.write_str("length field disagrees with the packet"),
            Self::BadTver(v) => write!(f, "BTH transport version {v} (must be 0)"),
            Self::UnsupportedOpcode(op) => write!(f, "unsupported opcode {op:#04x}"),
            Self::BadIpVersion(v) => write!(f, "unexpected IP version {v}"),
            Self::Ipv4Options => f.write_str("IPv4 header with options"),
            Self::NotUdp => f.write_str("not a UDP datagram"),
            Self::NotRoce(p) => write!(f, "UDP port {p} is not RoCEv2"),
            Self::BadIcrc { found, expected } => {
                write!(f, "bad ICRC {found:#010x} (expected {expected:#010x})")
            }
            Self::HeaderMismatch => f.write_str("extension headers do not match the opcode"),
            Self::BadPcap => f.write_str("malformed pcap data"),
        }
    }
}

impl core::error::Error for WireError {}

/// Result of wire operations.
pub type Result<T> = core::result::Result<T, WireError>;
