//! Queue pairs on an rdma-core device: Monel's attributes and work requests as
//! `ibv_qp_attr` and `ibv_send_wr`, with the same attribute-mask bits (Monel's are verbs').
#![allow(unsafe_code)]

use std::sync::Arc;

use monel_rc::congestion::ControllerMetrics;
use monel_rc::{
    AddressVector, AttrMask, PostError, QpAttr, QpState, QpStats, RecvWr, SendFlags, SendOp,
    SendWr, Sge,
};
use monel_wire::{Psn, QKey, Qpn};

use super::ah::{HwAh, ah_attr};
use super::cq::{HwCq, RawCq};
use super::ffi;
use super::raw::{RawPd, os_error};
use super::srq::{HwSrq, RawSrq};
use crate::attr::{QpCap, QpType};
use crate::config::ContextConfig;
use crate::device::Device;
use crate::error::{ErrorKind, Result, VerbsError};
use crate::provider::{AhOps, QpInit, QpOps};

/// SGEs built on the stack per work request; longer lists go to the heap.
const STACK_SGES: usize = 8;

fn state_code(s: QpState) -> u32 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

fn state_of(code: u32) -> QpState {
    match code {
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => QpState::Reset,
    }
}

/// Monel's attributes as `ibv_qp_attr`; the port is the device's.
pub(crate) fn to_ibv(a: &QpAttr, port: u8) -> ffi::ibv_qp_attr {
    let av = &a.ah_attr;
    let mut ah = ah_attr(av.dgid, av.sgid_index, av.hop_limit, av.traffic_class, port);
    ah.grh.flow_label = av.flow_label;
    ah.sl = av.sl;
    ffi::ibv_qp_attr {
        qp_state: state_code(a.qp_state),
        cur_qp_state: state_code(a.cur_qp_state),
        path_mtu: a.path_mtu as u32,
        qkey: a.qkey.0,
        rq_psn: a.rq_psn.value(),
        sq_psn: a.sq_psn.value(),
        dest_qp_num: a.dest_qp_num.value(),
        qp_access_flags: a.qp_access_flags.0,
        ah_attr: ah,
        pkey_index: a.pkey_index,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: port,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..Default::default()
    }
}

/// `ibv_qp_attr` as Monel's attributes.
pub(crate) fn from_ibv(a: &ffi::ibv_qp_attr) -> QpAttr {
    let g = &a.ah_attr.grh;
    QpAttr {
        qp_state: state_of(a.qp_state),
        cur_qp_state: state_of(a.cur_qp_state),
        path_mtu: super::device::mtu_of(a.path_mtu),
        dest_qp_num: Qpn::new(a.dest_qp_num & 0xff_ffff),
        rq_psn: Psn::new(a.rq_psn & 0xff_ffff),
        sq_psn: Psn::new(a.sq_psn & 0xff_ffff),
        qp_access_flags: monel_rc::AccessFlags(a.qp_access_flags & 0xf),
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        ah_attr: AddressVector {
            dgid: g.dgid.raw,
            sgid_index: g.sgid_index,
            hop_limit: g.hop_limit,
            traffic_class: g.traffic_class,
            flow_label: g.flow_label,
            sl: a.ah_attr.sl,
        },
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        qkey: QKey(a.qkey),
    }
}

/// The opcode, flags and remote part of a send, written into `w`.
fn fill_op(w: &mut ffi::ibv_send_wr, op: SendOp, flags: SendFlags) {
    use ffi::*;
    let rdma = |r: monel_rc::RemoteAddr| wr_union {
        rdma: wr_rdma {
            remote_addr: r.addr,
            rkey: r.rkey.0,
        },
    };
    w.opcode = match op {
        SendOp::Send => IBV_WR_SEND,
        SendOp::SendImm(imm) => {
            w.imm_data = imm.to_be();
            IBV_WR_SEND_WITH_IMM
        }
        SendOp::SendInv(rkey) => {
            w.imm_data = rkey.0;
            IBV_WR_SEND_WITH_INV
        }
        SendOp::Write(r) => {
            w.wr = rdma(r);
            IBV_WR_RDMA_WRITE
        }
        SendOp::WriteImm(r, imm) => {
            w.wr = rdma(r);
            w.imm_data = imm.to_be();
            IBV_WR_RDMA_WRITE_WITH_IMM
        }
        SendOp::Read(r) => {
            w.wr = rdma(r);
            IBV_WR_RDMA_READ
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            w.wr = wr_union {
                atomic: wr_atomic {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey.0,
                },
            };
            IBV_WR_ATOMIC_CMP_AND_SWP
        }
        SendOp::FetchAdd { remote, add } => {
            w.wr = wr_union {
                atomic: wr_atomic {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey.0,
                },
            };
            IBV_WR_ATOMIC_FETCH_AND_ADD
        }
    };
    w.send_flags = (if flags.signaled { IBV_SEND_SIGNALED } else { 0 })
        | (if flags.fence { IBV_SEND_FENCE } else { 0 })
        | (if flags.solicited {
            IBV_SEND_SOLICITED
        } else {
            0
        });
}

/// `wr` as an `ibv_send_wr` over the SGE array `sg` of `n` entries.
fn request(wr: &SendWr, sg: *mut ffi::ibv_sge, n: i32) -> ffi::ibv_send_wr {
    let mut w = ffi::ibv_send_wr::zeroed();
    w.wr_id = wr.wr_id;
    w.sg_list = sg;
    w.num_sge = n;
    fill_op(&mut w, wr.op, wr.flags);
    w
}

/// A post's return code as Monel's error: a full queue is [`PostError::QueueFull`].
fn post_error(verb: &'static str, rc: i32) -> VerbsError {
    if rc == libc::ENOMEM {
        return VerbsError::new(verb, ErrorKind::Post(PostError::QueueFull));
    }
    os_error(verb, rc)
}

/// Runs `f` with `sges` as an `ibv_sge` array (on the stack when short).
fn with_sges<R>(sges: &[Sge], f: impl FnOnce(*mut ffi::ibv_sge, i32) -> R) -> R {
    let conv = |s: &Sge| ffi::ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey.0,
    };
    if sges.len() <= STACK_SGES {
        let mut a = [ffi::ibv_sge::default(); STACK_SGES];
        for (d, s) in a.iter_mut().zip(sges) {
            *d = conv(s);
        }
        f(a.as_mut_ptr(), sges.len() as i32)
    } else {
        let mut v: Vec<ffi::ibv_sge> = sges.iter().map(conv).collect();
        f(v.as_mut_ptr(), v.len() as i32)
    }
}

/// A queue pair on an rdma-core device.
#[derive(Debug)]
pub(crate) struct HwQp {
    qp: *mut ffi::ibv_qp,
    pd: Arc<RawPd>,
    // The QP's CQs and SRQ outlive it (destroyed after `qp`, in `Drop`).
    _send_cq: Arc<RawCq>,
    _recv_cq: Arc<RawCq>,
    _srq: Option<Arc<RawSrq>>,
    device: Device,
    cap: QpCap,
    qp_type: QpType,
    tc: u8,
}

// SAFETY: see `RawCtx`: libibverbs QPs may be posted to from any thread.
unsafe impl Send for HwQp {}
// SAFETY: as above.
unsafe impl Sync for HwQp {}

impl Drop for HwQp {
    fn drop(&mut self) {
        // SAFETY: created by `HwQp::create`, destroyed once, before its CQs and SRQ.
        unsafe { (self.pd.ctx.lib.destroy_qp)(self.qp) };
    }
}

impl HwQp {
    pub(crate) fn create(
        pd: &Arc<RawPd>,
        device: &Device,
        config: &ContextConfig,
        init: &QpInit<'_>,
    ) -> Result<Self> {
        const V: &str = "ibv_create_qp";
        let cq_of = |c: &dyn crate::provider::CqOps| {
            c.as_any()
                .downcast_ref::<HwCq>()
                .map(|c| c.raw.clone())
                .ok_or_else(|| VerbsError::invalid(V, "a CQ of another device"))
        };
        let send_cq = cq_of(init.send_cq)?;
        let recv_cq = cq_of(init.recv_cq)?;
        let srq = match init.srq {
            Some(s) => Some(
                s.as_any()
                    .downcast_ref::<HwSrq>()
                    .map(|s| s.raw.clone())
                    .ok_or_else(|| VerbsError::invalid(V, "an SRQ of another device"))?,
            ),
            None => None,
        };
        let c = init.cap;
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.cq,
            recv_cq: recv_cq.cq,
            srq: srq.as_ref().map_or(std::ptr::null_mut(), |s| s.srq),
            cap: ffi::ibv_qp_cap {
                max_send_wr: c.max_send_wr,
                max_recv_wr: if srq.is_some() { 0 } else { c.max_recv_wr },
                max_send_sge: c.max_send_sge,
                max_recv_sge: if srq.is_some() { 0 } else { c.max_recv_sge },
                max_inline_data: c.max_inline_data,
            },
            qp_type: match init.qp_type {
                QpType::Rc => ffi::IBV_QPT_RC,
                QpType::Ud => ffi::IBV_QPT_UD,
            },
            sq_sig_all: i32::from(init.sq_sig_all),
        };
        // SAFETY: the PD and CQs (and SRQ) are live; `attr` is complete.
        let qp = unsafe { (pd.ctx.lib.create_qp)(pd.pd, &mut attr) };
        if qp.is_null() {
            return Err(os_error(V, -1));
        }
        // The provider rounds the sizes up and says so in `attr.cap`.
        let got = attr.cap;
        Ok(Self {
            qp,
            pd: pd.clone(),
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            _srq: srq,
            device: device.clone(),
            cap: QpCap {
                max_send_wr: got.max_send_wr,
                max_recv_wr: got.max_recv_wr,
                max_send_sge: got.max_send_sge,
                max_recv_sge: got.max_recv_sge,
                max_inline_data: got.max_inline_data,
            },
            qp_type: init.qp_type,
            tc: config.traffic_class(),
        })
    }

    fn post(&self, w: &mut ffi::ibv_send_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the context is open; the provider filled `post_send` at open.
        let post = unsafe { (*self.pd.ctx.ctx).ops.post_send }.expect("provider without post_send");
        // SAFETY: a live QP; `w` and its SGE list are valid for the call (the provider
        // copies them into its queue; inline data is copied too).
        let rc = unsafe { post(self.qp, w, &mut bad) };
        if rc != 0 {
            return Err(post_error("ibv_post_send", rc));
        }
        Ok(())
    }

    fn check_sges(&self, n: usize) -> Result<()> {
        if n > self.cap.max_send_sge as usize {
            return Err(VerbsError::new(
                "ibv_post_send",
                ErrorKind::Post(PostError::TooManySge),
            ));
        }
        Ok(())
    }
}

impl QpOps for HwQp {
    fn qp_num(&self) -> Qpn {
        // SAFETY: a live QP.
        Qpn::new(unsafe { (*self.qp).qp_num } & 0xff_ffff)
    }
    fn device(&self) -> &Device {
        &self.device
    }
    fn cap(&self) -> QpCap {
        self.cap
    }
    fn traffic_class(&self) -> u8 {
        self.tc
    }
    fn local_udp_port(&self, _gid_index: u8) -> Result<u16> {
        Ok(monel_wire::ROCE_V2_UDP_PORT)
    }

    fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let mut a = to_ibv(attr, self.pd.ctx.port);
        // SAFETY: a live QP; `a` is complete and the mask names verbs' own bits.
        let rc = unsafe { (self.pd.ctx.lib.modify_qp)(self.qp, &mut a, mask.0 as i32) };
        if rc != 0 {
            let e = std::io::Error::from_raw_os_error(rc.abs());
            return Err(VerbsError::invalid(
                "ibv_modify_qp",
                format!(
                    "{} refused the move to {:?} with {mask:?}: {e}",
                    self.device.name, attr.qp_state
                ),
            ));
        }
        Ok(())
    }

    fn set_peer_udp_port(&self, port: u16) -> Result<()> {
        if port == monel_wire::ROCE_V2_UDP_PORT {
            return Ok(());
        }
        Err(VerbsError::new(
            "ibv_modify_qp",
            ErrorKind::Unsupported(format!(
                "{} sends RoCEv2 to UDP port {} only; the peer listens on {port}",
                self.device.name,
                monel_wire::ROCE_V2_UDP_PORT
            )),
        ))
    }

    fn protect(&self, _p: &crate::protect::Protection) -> Result<()> {
        Err(VerbsError::new(
            "monel_qp_protect",
            ErrorKind::Unsupported(format!(
                "{} speaks plain RoCEv2: packet protection is the soft RNIC's",
                self.device.name
            )),
        ))
    }

    fn query(&self) -> Result<(QpState, QpAttr)> {
        let mut a = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap::default(),
            qp_type: 0,
            sq_sig_all: 0,
        };
        // Every attribute this side knows (STATE .. DEST_QPN).
        let mask = (1 << 21) - 1;
        // SAFETY: a live QP; both out-structs are complete.
        let rc = unsafe { (self.pd.ctx.lib.query_qp)(self.qp, &mut a, mask, &mut init) };
        if rc != 0 {
            return Err(os_error("ibv_query_qp", rc));
        }
        let attr = from_ibv(&a);
        Ok((attr.qp_state, attr))
    }

    fn post_send(&self, wr: SendWr) -> Result<()> {
        self.check_sges(wr.sg_list.len())?;
        if wr.op.is_atomic() && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8) {
            return Err(VerbsError::new(
                "ibv_post_send",
                ErrorKind::Post(PostError::BadAtomicLength),
            ));
        }
        if self.qp_type == QpType::Ud {
            return Err(VerbsError::invalid(
                "ibv_post_send",
                "a UD QP sends with post_send_ud",
            ));
        }
        with_sges(&wr.sg_list, |sg, n| self.post(&mut request(&wr, sg, n)))
    }

    fn post_send_inline(
        &self,
        wr_id: u64,
        op: SendOp,
        data: &[u8],
        flags: SendFlags,
    ) -> Result<()> {
        const V: &str = "ibv_post_send";
        if data.len() > self.cap.max_inline_data as usize {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "{} inline bytes, the QP takes {}",
                    data.len(),
                    self.cap.max_inline_data
                ),
            ));
        }
        if !matches!(
            op,
            SendOp::Send | SendOp::SendImm(_) | SendOp::Write(_) | SendOp::WriteImm(..)
        ) {
            return Err(VerbsError::invalid(V, "inline data is for SEND and WRITE"));
        }
        let mut sge = ffi::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        let mut w = ffi::ibv_send_wr::zeroed();
        w.wr_id = wr_id;
        w.sg_list = &mut sge;
        w.num_sge = i32::from(!data.is_empty());
        fill_op(&mut w, op, flags);
        w.send_flags |= ffi::IBV_SEND_INLINE;
        self.post(&mut w)
    }

    fn post_send_ud(
        &self,
        wr: SendWr,
        ah: &dyn AhOps,
        remote_qpn: Qpn,
        remote_qkey: QKey,
    ) -> Result<()> {
        const V: &str = "ibv_post_send";
        if self.qp_type != QpType::Ud {
            return Err(VerbsError::invalid(
                V,
                "post_send_ud on a QP that is not UD",
            ));
        }
        if !matches!(wr.op, SendOp::Send | SendOp::SendImm(_)) {
            return Err(VerbsError::new(
                V,
                ErrorKind::Post(PostError::UnsupportedOp),
            ));
        }
        self.check_sges(wr.sg_list.len())?;
        let ah = ah
            .as_any()
            .downcast_ref::<HwAh>()
            .ok_or_else(|| VerbsError::invalid(V, "an address handle of another device"))?;
        with_sges(&wr.sg_list, |sg, n| {
            let mut w = request(&wr, sg, n);
            w.wr = ffi::wr_union {
                ud: ffi::wr_ud {
                    ah: ah.ah,
                    remote_qpn: remote_qpn.value(),
                    remote_qkey: remote_qkey.0,
                },
            };
            self.post(&mut w)
        })
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        const V: &str = "ibv_post_recv";
        if self._srq.is_some() {
            return Err(VerbsError::invalid(
                V,
                "the QP takes its receives from an SRQ",
            ));
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(VerbsError::new(V, ErrorKind::Post(PostError::TooManySge)));
        }
        // SAFETY: the context is open; the provider filled `post_recv` at open.
        let post = unsafe { (*self.pd.ctx.ctx).ops.post_recv }.expect("provider without post_recv");
        with_sges(&wr.sg_list, |sg, n| {
            let mut w = ffi::ibv_recv_wr {
                wr_id: wr.wr_id,
                next: std::ptr::null_mut(),
                sg_list: sg,
                num_sge: n,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: a live QP; `w` and its SGEs are valid for the call.
            let rc = unsafe { post(self.qp, &mut w, &mut bad) };
            if rc != 0 {
                return Err(post_error(V, rc));
            }
            Ok(())
        })
    }

    fn stats(&self) -> Result<QpStats> {
        Err(VerbsError::new(
            "monel_qp_stats",
            ErrorKind::Unsupported(format!(
                "{} keeps no per-QP counters; see the device's (monel devices)",
                self.device.name
            )),
        ))
    }

    fn congestion(&self) -> Result<ControllerMetrics> {
        Err(VerbsError::new(
            "monel_qp_congestion",
            ErrorKind::Unsupported(format!(
                "{} runs its congestion control in the NIC",
                self.device.name
            )),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monel_rc::{AccessFlags, Mtu, RemoteAddr};
    use monel_wire::RKey;

    #[test]
    fn attributes_round_trip_through_ibv_qp_attr() {
        let a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: Qpn::new(0x1234),
            rq_psn: Psn::new(0xabcdef),
            sq_psn: Psn::new(7),
            qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
            ah_attr: AddressVector {
                dgid: [9; 16],
                sgid_index: 3,
                hop_limit: 64,
                traffic_class: 106,
                flow_label: 5,
                sl: 2,
            },
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 8,
            qkey: QKey(0x11111111),
            port_num: 1,
            ..QpAttr::default()
        };
        let c = to_ibv(&a, 2);
        assert_eq!(c.qp_state, 2);
        assert_eq!(c.path_mtu, 5);
        assert_eq!(c.ah_attr.is_global, 1);
        assert_eq!(c.ah_attr.port_num, 2);
        assert_eq!(c.port_num, 2);
        let back = from_ibv(&c);
        assert_eq!(back, QpAttr { port_num: 2, ..a });
    }

    #[test]
    fn send_requests_fill_the_verbs_union() {
        let mut w = ffi::ibv_send_wr::zeroed();
        let r = RemoteAddr {
            addr: 0x1000,
            rkey: RKey(0x55),
        };
        fill_op(
            &mut w,
            SendOp::WriteImm(r, 0x01020304),
            SendFlags {
                signaled: true,
                ..Default::default()
            },
        );
        assert_eq!(w.opcode, ffi::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(
            w.imm_data.to_ne_bytes(),
            [1, 2, 3, 4],
            "immediate in network order"
        );
        assert_eq!(w.send_flags, ffi::IBV_SEND_SIGNALED);
        // SAFETY: the rdma view was just written.
        assert_eq!(unsafe { w.wr.rdma.remote_addr }, 0x1000);
        fill_op(
            &mut w,
            SendOp::CompareSwap {
                remote: r,
                compare: 1,
                swap: 2,
            },
            SendFlags::default(),
        );
        assert_eq!(w.opcode, ffi::IBV_WR_ATOMIC_CMP_AND_SWP);
        // SAFETY: the atomic view was just written.
        let at = unsafe { w.wr.atomic };
        assert_eq!((at.compare_add, at.swap, at.rkey), (1, 2, 0x55));
    }
}
