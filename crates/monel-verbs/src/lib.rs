//! Monel verbs: a libibverbs-shaped API over the soft RoCEv2 RNIC.
//!
//! ```text
//! Device --open--> Context --alloc_pd--> ProtectionDomain --reg_mr--> MemoryRegion
//!                     |                         |--create_qp--> QueuePair (RC, UD)
//!                     |                         \--create_ah--> AddressHandle (UD sends)
//!                     \--create_cq--> CompletionQueue
//! ```
//! Control-path calls return [`Result`]s whose errors name the verb and the bad attribute;
//! data-path outcomes are [`WorkCompletion`]s with `ibv_wc_status` semantics.
//!
//! The API objects, one per file (`context`, `pd`, `qp`, `cq`, `srq`, `mr`, `ah`), sit on a
//! provider boundary (`provider`: one trait per object, as rdma-core's provider ops). The
//! provider today is the soft RNIC (`soft/`): each [`Context`] runs a progress thread (the
//! "NIC") that moves packets between its UDP sockets and the sans-IO RC engine of
//! `monel-rc`.

mod ah;
mod attr;
pub mod cm;
mod config;
mod context;
mod counters;
mod cq;
pub mod device;
mod error;
mod event;
pub mod limits;
mod mr;
mod pd;
pub mod protect;
mod provider;
mod providers;
mod qp;
pub mod rdma_core;
mod soft;
mod srq;

pub use ah::AddressHandle;
pub use attr::{AhAttr, QpCap, QpType, SrqAttr};
pub use config::ContextConfig;
pub use context::Context;
pub use counters::DeviceCounters;
pub use cq::CompletionQueue;
pub use device::{
    Device, Gid, GidEntry, PortAttr, PortState, Provider, route_source, soft_devices,
};
pub use error::{ErrorKind, Result, VerbsError};
pub use event::AsyncEvent;
pub use monel_rc::{
    AccessFlags, AddressVector, AttrMask, GRH_LEN, Mtu, QpAttr, QpState, QpStats, RecvWr,
    RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
pub use monel_wire::QKey;
pub use monel_wire::{LKey, Psn, Qpn, RKey};
pub use mr::MemoryRegion;
pub use pd::ProtectionDomain;
pub use providers::devices;
pub use qp::{ConnectParams, QpInitAttr, QueuePair, RemoteQp, random_psn};
pub use srq::SharedReceiveQueue;
