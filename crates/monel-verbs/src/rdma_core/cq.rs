//! Completion queues on an rdma-core device, each with its own completion channel, and the
//! mapping of `ibv_wc` to Monel's work completions.
#![allow(unsafe_code)]

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use monel_rc::{WcOpcode, WcStatus, WorkCompletion};
use monel_wire::{Qpn, RKey};

use super::ffi;
use super::raw::{RawCtx, os_error, set_nonblocking};
use crate::error::Result;
use crate::provider::CqOps;

/// Completions taken from the NIC per `poll_cq` call.
const POLL_BATCH: usize = 32;

/// The CQ and channel pointers, destroyed together.
#[derive(Debug)]
pub(crate) struct RawCq {
    pub(crate) ctx: Arc<RawCtx>,
    pub(crate) cq: *mut ffi::ibv_cq,
    channel: *mut ffi::ibv_comp_channel,
}

// SAFETY: see `RawCtx`: libibverbs objects may be used from any thread.
unsafe impl Send for RawCq {}
// SAFETY: as above.
unsafe impl Sync for RawCq {}

impl Drop for RawCq {
    fn drop(&mut self) {
        let lib = self.ctx.lib;
        // SAFETY: created by `HwCq::create`; every QP using it holds this `RawCq` and is
        // destroyed first; every channel event was acknowledged when read.
        unsafe {
            (lib.destroy_cq)(self.cq);
            (lib.destroy_comp_channel)(self.channel);
        }
    }
}

impl RawCq {
    /// `ibv_poll_cq` of up to `max` completions, appended to `out`.
    fn poll(&self, max: usize, out: &mut impl Extend<WorkCompletion>) -> usize {
        let mut wc = [ffi::ibv_wc::default(); POLL_BATCH];
        // SAFETY: the context is open; the provider filled `poll_cq` at open.
        let poll = unsafe { (*self.ctx.ctx).ops.poll_cq }.expect("provider without poll_cq");
        let mut total = 0;
        while total < max {
            let want = (max - total).min(POLL_BATCH) as i32;
            // SAFETY: a live CQ; `wc` has room for `want` entries.
            let n = unsafe { poll(self.cq, want, wc.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            let n = n as usize;
            out.extend(wc[..n].iter().map(map_wc));
            total += n;
            if n < want as usize {
                break;
            }
        }
        total
    }

    fn arm(&self) {
        // SAFETY: a live CQ; the provider filled `req_notify_cq` at open.
        unsafe {
            if let Some(f) = (*self.ctx.ctx).ops.req_notify_cq {
                f(self.cq, 0);
            }
        }
    }

    /// Reads and acknowledges one channel event, if one is there (the channel is
    /// non-blocking).
    fn take_event(&self) -> bool {
        let mut cq = std::ptr::null_mut();
        let mut cq_ctx = std::ptr::null_mut();
        // SAFETY: a live channel; the out-pointers are valid.
        let rc = unsafe { (self.ctx.lib.get_cq_event)(self.channel, &mut cq, &mut cq_ctx) };
        if rc != 0 {
            return false;
        }
        // SAFETY: the event was for this channel's only CQ; acknowledged once.
        unsafe { (self.ctx.lib.ack_cq_events)(cq, 1) };
        true
    }

    fn fd(&self) -> i32 {
        // SAFETY: a live channel.
        unsafe { (*self.channel).fd }
    }
}

/// A completion queue on an rdma-core device.
#[derive(Debug)]
pub(crate) struct HwCq {
    pub(crate) raw: Arc<RawCq>,
    /// Completions taken from the NIC by `wait` and not yet handed out.
    stash: Mutex<VecDeque<WorkCompletion>>,
    cqe: usize,
    busy_poll: bool,
}

impl HwCq {
    /// Creates a CQ of `cqe` entries with its completion channel.
    pub(crate) fn create(ctx: &Arc<RawCtx>, cqe: usize, busy_poll: bool) -> Result<Self> {
        const V: &str = "ibv_create_cq";
        let lib = ctx.lib;
        // SAFETY: the context is open.
        let channel = unsafe { (lib.create_comp_channel)(ctx.ctx) };
        if channel.is_null() {
            return Err(os_error("ibv_create_comp_channel", -1));
        }
        // SAFETY: a live channel.
        if let Err(e) = set_nonblocking(unsafe { (*channel).fd }) {
            // SAFETY: created above, destroyed once.
            unsafe { (lib.destroy_comp_channel)(channel) };
            return Err(crate::VerbsError::io(V, e));
        }
        let n = i32::try_from(cqe).unwrap_or(i32::MAX);
        // SAFETY: the context and channel are live.
        let cq = unsafe { (lib.create_cq)(ctx.ctx, n, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = os_error(V, -1);
            // SAFETY: created above, destroyed once.
            unsafe { (lib.destroy_comp_channel)(channel) };
            return Err(e);
        }
        Ok(Self {
            raw: Arc::new(RawCq {
                ctx: ctx.clone(),
                cq,
                channel,
            }),
            stash: Mutex::new(VecDeque::new()),
            cqe,
            busy_poll,
        })
    }

    fn stash(&self) -> std::sync::MutexGuard<'_, VecDeque<WorkCompletion>> {
        self.stash.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves what the NIC has into the stash; true if the stash holds anything.
    fn fill(&self) -> bool {
        let mut s = self.stash();
        if s.is_empty() {
            self.raw.poll(POLL_BATCH, &mut *s);
        }
        !s.is_empty()
    }
}

impl CqOps for HwCq {
    fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let mut got = 0;
        {
            let mut s = self.stash();
            while got < max {
                let Some(wc) = s.pop_front() else { break };
                out.push(wc);
                got += 1;
            }
        }
        if got < max {
            got += self.raw.poll(max - got, out);
        }
        got
    }

    fn poll_queued(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        // The NIC queues completions by itself: what it holds is queued.
        self.poll_into(max, out)
    }

    fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if self.fill() {
            return true;
        }
        loop {
            if self.busy_poll {
                if self.fill() {
                    return true;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                std::hint::spin_loop();
                continue;
            }
            // Arm, look again (a completion may have come before the arm), then sleep on
            // the channel.
            self.raw.arm();
            if self.fill() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            let mut pfd = libc::pollfd {
                fd: self.raw.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the channel's descriptor.
            unsafe { libc::poll(&mut pfd, 1, ms) };
            self.raw.take_event();
            if self.fill() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// The NIC reports an overflow as an asynchronous event (`AsyncEvent::CqError`) and
    /// the CQ is unusable after it; there is no flag to read.
    fn overflowed(&self) -> bool {
        false
    }

    fn capacity(&self) -> usize {
        self.cqe
    }

    fn req_notify(&self) {
        self.raw.arm();
    }

    fn get_event(&self) -> bool {
        self.raw.take_event()
    }

    fn channel_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's descriptor stays open while this CQ lives.
        unsafe { BorrowedFd::borrow_raw(self.raw.fd()) }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `ibv_wc_status` to Monel's status; the codes Monel has no variant for map to the
/// nearest (RESP_TIMEOUT to retry exceeded, the EE-context ones to a local QP error).
pub(crate) fn map_status(code: u32) -> WcStatus {
    match code {
        0 => WcStatus::Success,
        1 => WcStatus::LocLenErr,
        2 | 3 | 14 | 17 | 18 => WcStatus::LocQpOpErr,
        4 | 6 => WcStatus::LocProtErr,
        5 => WcStatus::WrFlushErr,
        7 => WcStatus::BadRespErr,
        8 => WcStatus::LocAccessErr,
        9 | 15 => WcStatus::RemInvReqErr,
        10 => WcStatus::RemAccessErr,
        11 | 16 => WcStatus::RemOpErr,
        12 | 20 => WcStatus::RetryExcErr,
        13 => WcStatus::RnrRetryExcErr,
        _ => WcStatus::FatalErr,
    }
}

/// One `ibv_wc` as a Monel work completion; immediates come out in host order (the wire
/// carries them big-endian, as the soft RNIC reads them).
pub(crate) fn map_wc(wc: &ffi::ibv_wc) -> WorkCompletion {
    let opcode = match wc.opcode {
        ffi::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ffi::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ffi::IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        ffi::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        ffi::IBV_WC_RECV => WcOpcode::Recv,
        ffi::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    };
    WorkCompletion {
        wr_id: wc.wr_id,
        status: map_status(wc.status),
        opcode,
        byte_len: wc.byte_len,
        imm: (wc.wc_flags & ffi::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
        invalidated_rkey: (wc.wc_flags & ffi::IBV_WC_WITH_INV != 0).then_some(RKey(wc.imm_data)),
        qp_num: Qpn::new(wc.qp_num & 0xff_ffff),
        src_qp: Qpn::new(wc.src_qp & 0xff_ffff),
        grh: wc.wc_flags & ffi::IBV_WC_GRH != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_map_as_verbs_defines_them() {
        let wc = ffi::ibv_wc {
            wr_id: 7,
            status: 12,
            opcode: ffi::IBV_WC_RECV_RDMA_WITH_IMM,
            byte_len: 4096,
            imm_data: 0x1234_5678u32.to_be(),
            qp_num: 0x11,
            src_qp: 0x22,
            wc_flags: ffi::IBV_WC_WITH_IMM | ffi::IBV_WC_GRH,
            ..Default::default()
        };
        let m = map_wc(&wc);
        assert_eq!(m.wr_id, 7);
        assert_eq!(m.status, WcStatus::RetryExcErr);
        assert_eq!(m.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(m.imm, Some(0x1234_5678));
        assert!(m.grh);
        assert_eq!(m.invalidated_rkey, None);
        assert_eq!(m.qp_num, Qpn::new(0x11));
        // Every status Monel names keeps its verbs number.
        for s in [0, 1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 13, 19] {
            assert_eq!(map_status(s) as u32, s);
        }
        assert_eq!(map_status(21), WcStatus::FatalErr);
        let inv = ffi::ibv_wc {
            wc_flags: ffi::IBV_WC_WITH_INV,
            imm_data: 0xabcd,
            opcode: ffi::IBV_WC_RECV,
            ..Default::default()
        };
        assert_eq!(map_wc(&inv).invalidated_rkey, Some(RKey(0xabcd)));
        assert_eq!(map_wc(&inv).imm, None);
    }
}
