//! RoCEv2 on the wire, as the InfiniBand RoCEv2 annex and Linux `rdma_rxe` put it there.
//!
//! ```text
//!  Ethernet | IPv4 or IPv6 | UDP :4791 | BTH | ext headers | payload | pad | ICRC
//!  ^ frame ^^^^^^^^^^^^^^^^^^^^^^^^^^^^ ^ packet (RocePacket) ^^^^^^^^^^^^^^^^^^^^
//! ```
//!
//! Two levels, after smoltcp's `wire`:
//! * **views** (`BthPacket`, `RethPacket`, ..., [`RocePacket`]) give checked field access over raw
//!   octets without copying. If `check_len()` (or `new_checked`) returned `Ok(())`, no accessor or
//!   setter of that view will panic. Untrusted input must go through `new_checked`.
//! * **representations** (`BthRepr`, ..., [`RoceRepr`]) are small validated values with `parse`
//!   and `emit`.
//!
//! Numbers with meaning are newtypes ([`Psn`] with 24-bit modular arithmetic, [`Qpn`], [`PKey`],
//! [`RKey`], [`LKey`], [`Msn`], [`QKey`]). [`icrc`] computes the invariant CRC exactly as rxe does,
//! [`frame`] parses and builds the Ethernet/IP/UDP framing it covers and [`pcap`] reads and writes
//! captures. Every malformed input gives a [`WireError`], never a panic.
//!
//! The crate is `no_std` without the `std` feature, allocates nothing and has no `unsafe`.
#![forbid(unsafe_code)]
#![cfg_attr(not(any(test, feature = "std")), no_std)]

mod error;
mod field;

pub mod bth;
pub mod cnp;
pub mod ext;
pub mod frame;
pub mod icrc;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod types;

pub use bth::{BthPacket, BthRepr};
pub use error::{Result, WireError};
pub use ext::{
    AethPacket, AethRepr, AethSyndrome, AtomicAckEthPacket, AtomicEthPacket, AtomicEthRepr,
    DethPacket, DethRepr, NakCode, RethPacket, RethRepr,
};
pub use frame::{EthernetFrame, FrameRepr, IpAddress, IpFrame, Ipv4Header, Ipv6Header, UdpHeader};
pub use opcode::{ExtLayout, Opcode, Transport};
pub use packet::{ExtHeaders, RocePacket, RoceRepr};
pub use types::{LKey, Msn, PKey, Psn, QKey, Qpn, RKey};

/// The IANA-assigned UDP destination port of RoCEv2.
pub const ROCE_V2_UDP_PORT: u16 = 4791;
/// Length of the invariant CRC that ends every RoCEv2 packet.
pub const ICRC_LEN: usize = 4;
