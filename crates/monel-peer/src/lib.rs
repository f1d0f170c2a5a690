//! Monel's peer layer: what collectives (`monel-ccl`) and transfers (`monel-xfer`) both need
//! before a byte of data moves to a peer, in one place.
//!
//! ```text
//!   monel-ccl        monel-xfer
//!        \              /
//!         monel-peer ----------- monel-verbs (the connection manager, packet keys,
//!   auth      keys, nonces, proofs      device listing take auth, greeter and hca)
//!   greeter   listeners that survive any one bad connection
//!   channel   authenticated set-up messages over a pair's TCP connection
//!   gid, hca  GIDs, and which device and GID to use (NCCL_IB_HCA and friends)
//!   select    which transport a peer gets: shared memory, then RDMA, then TCP
//! ```
//! Nothing here moves data: that is the transports' job, above (ccl's links, xfer's lanes),
//! and the verbs API's, beside.

#![forbid(unsafe_code)]

pub mod auth;
pub mod channel;
pub mod gid;
pub mod greeter;
pub mod hca;
pub mod select;

pub use auth::{Key, Nonce, Proof};
pub use gid::{Gid, GidKind, GidSlot};
pub use greeter::Greeter;
pub use select::{Selection, TransportKind};
