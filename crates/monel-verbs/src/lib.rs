//! Monel verbs: a libibverbs-shaped API over the soft RoCEv2 RNIC.
//!
//! ```text
//! Device --open--> Context --alloc_pd--> ProtectionDomain --reg_mr--> MemoryRegion
//!                     |                         |--create_qp--> QueuePair (RC, UD)
//!                     |                         \--create_ah--> AddressHandle (UD sends)
//!                     \--create_cq--> CompletionQueue
//! ```
//! Control-path calls return [`Result`]s whose errors name the verb and the bad attribute;
//! data-path outcomes are [`WorkCompletion`]s with `ibv_wc_status` semantics. Each
//! [`Context`] runs a progress thread (the "NIC") that moves packets between its UDP sockets
//! and the sans-IO RC engine of `monel-rc`.

pub mod cm;
mod context;
mod counters;
mod cq;
pub mod device;
mod engine;
mod error;
mod gso;
mod idmap;
mod mmsg;
mod mr;
mod netio;
mod qp_kind;
mod srq;
mod tx;
mod ud;

pub use context::{
    AsyncEvent, ConnectParams, Context, ContextConfig, ProtectionDomain, QpCap, QpInitAttr, QpType,
    QueuePair, RemoteQp, limits, random_psn,
};
pub use counters::DeviceCounters;
pub use cq::CompletionQueue;
pub use device::{Device, Gid, GidEntry, PortAttr, PortState, devices};
pub use error::{ErrorKind, Result, VerbsError};
pub use monel_rc::{
    AccessFlags, AddressVector, AttrMask, GRH_LEN, Mtu, QpAttr, QpState, QpStats, RecvWr,
    RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
pub use monel_wire::QKey;
pub use monel_wire::{LKey, Psn, Qpn, RKey};
pub use mr::MemoryRegion;
pub use srq::{SharedReceiveQueue, SrqAttr};
pub use ud::{AddressHandle, AhAttr};
