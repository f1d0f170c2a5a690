//! The RoCEv2 reliable-connection engine, sans-IO.
//!
//! ```text
//!   post_send / post_recv / modify          poll_completion / poll_event
//!                 |                                   ^
//!                 v                                   |
//!   +---------------------------------------------------------------+
//!   |  RcQp:  requester -> packets    responder <- requests         |
//!   |         completer <- ACK/NAK/responses -> completions         |
//!   |         timers as data, congestion control (DCQCN)            |
//!   +---------------------------------------------------------------+
//!        ^ handle_packet(now, bytes, ecn_ce, mem)    | poll_transmit(now, buf, mem)
//!        ^ handle_timeout(now)                       v poll_timeout()
//! ```
//!
//! Packets and time go in; packets, deadlines and completions come out. The engine never reads
//! a clock or touches a socket, and never owns user memory: it reads and writes through a
//! [`MemoryAccess`] the caller passes in, which checks keys, bounds and access flags on every
//! call. Everything is deterministic, so every loss, reorder and RNR scenario is a seeded test.
//!
//! Behaviour follows the InfiniBand spec (vol. 1 ch. 9-10) as Linux rxe implements it. Where
//! they differ: `retry_cnt = 7` retries forever as in rxe (IBA: seven times; 0 to 6 are exact
//! either way), and a gap in READ responses triggers one immediate go-back-N (rxe waits for
//! the timer). After an RNR NAK the responder drops later packets quietly instead of drawing a
//! sequence NAK, and the requester ignores sequence NAKs while it waits out an RNR delay, so an
//! RNR episode does not burn retries.

#![forbid(unsafe_code)]
mod attr;
#[doc(hidden)]
pub mod bench_support;
mod completer;
pub mod congestion;
pub mod memory;
mod qp;
mod requester;
mod responder;
mod stats;
pub mod time;
pub mod ud;
mod wr;

pub use attr::{AddressVector, AttrMask, ModifyError, Mtu, QpAttr, QpState};
pub use congestion::{CongestionConfig, DcqcnParams};
pub use memory::{AccessFlags, MemoryAccess, VecMemory};
pub use qp::{QpCaps, QpEvent, RcQp, Transmit, TransmitKind};
pub use stats::QpStats;
pub use time::Instant;
pub use ud::{GRH_LEN, UdDest, UdQp, UdTransmit};
pub use wr::{
    PostError, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
