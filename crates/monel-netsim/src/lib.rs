//! A deterministic lossy network to test the RC engine on: virtual clock, hosts on a switch,
//! links with latency, bandwidth, queue limits and ECN marking, and seeded loss, reordering,
//! duplication and corruption. Every packet is a real RoCEv2 datagram with a real ICRC, and a
//! run can be captured to pcap for Wireshark.
//!
//! [`Port`] is one link's model on the caller's clock, for the real software switch
//! (`monel-switch`). [`workload`] drives verified random work over it; [`sweep`] produces the loss-sweep table
//! the `monel sim` command prints.

#![forbid(unsafe_code)]
mod link;
mod net;
pub mod port;
pub mod sweep;
pub mod workload;

pub use link::{EcnConfig, LinkConfig, LinkStats};
pub use net::{ConnectConfig, Host, Network, udp_sport};
pub use port::Port;
