//! The engines that run schedules on a fabric, from the fastest to the most detailed:
//!
//! - [`flow`]: max-min fair sharing of links among flows (the fluid model both others use);
//! - [`lockstep`]: rank- or host-symmetric algorithms, every rank in step (100,000 GPUs);
//! - [`event`]: an event engine replaying every rank's schedule asynchronously (<= 4096
//!   ranks);
//! - [`packet`]: a packet-level discrete-event engine with PFC, ECN and DCQCN.

pub mod event;
pub mod flow;
pub mod lockstep;
pub mod packet;
mod packet_params;
