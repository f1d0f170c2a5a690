//! The soft RNIC's protection domain: registration into the device's key table, and the
//! creation of QPs, SRQs and address handles.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use monel_rc::{AccessFlags, AddressVector, QpCaps, RcQp, UdQp};
use monel_wire::Qpn;

use super::ah::SoftAh;
use super::cq::SoftCq;
use super::mr::{Backing, MrShared, SoftMr, random_key};
use super::qp::SoftQp;
use super::qp_kind::QpKind;
use super::queues::SrqState;
use super::shared::{DevShared, QpSlot};
use super::srq::SoftSrq;
use crate::attr::{AhAttr, QpType, SrqAttr};
use crate::error::{ErrorKind, Result, VerbsError};
use crate::limits;
use crate::provider::{AhOps, MrOps, PdOps, QpInit, QpOps, SrqOps};

/// A protection domain of the soft RNIC.
#[derive(Debug)]
pub(crate) struct SoftPd {
    pub(crate) shared: Arc<DevShared>,
    pub(crate) id: u32,
}

impl SoftPd {
    /// Puts a region in the device's key table; it stays there until removed.
    fn insert_region(
        &self,
        addr: u64,
        len: u64,
        access: AccessFlags,
        backing: Backing,
    ) -> Arc<MrShared> {
        let mut t = self
            .shared
            .mrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (lkey, rkey) = t.fresh_keys();
        let mr = Arc::new(MrShared {
            pd: self.id,
            addr,
            len,
            access,
            lkey,
            rkey,
            backing,
        });
        t.insert(mr.clone());
        mr
    }

    /// A region handle that deregisters on drop.
    fn register(
        &self,
        addr: u64,
        len: u64,
        access: AccessFlags,
        backing: Backing,
    ) -> Box<dyn MrOps> {
        Box::new(SoftMr {
            shared: self.insert_region(addr, len, access, backing),
            table: self.shared.mrs.clone(),
        })
    }
}

impl PdOps for SoftPd {
    fn id(&self) -> u32 {
        self.id
    }

    fn reg_mr(&self, buf: Vec<u8>, access: AccessFlags) -> Result<Box<dyn MrOps>> {
        let buf = buf.into_boxed_slice();
        let (addr, len) = (buf.as_ptr() as u64, buf.len() as u64);
        Ok(self.register(addr, len, access, Backing::Owned(Mutex::new(buf))))
    }

    #[allow(unsafe_code)]
    unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>> {
        let addr = ptr as usize;
        Ok(self.register(
            addr as u64,
            len as u64,
            access,
            Backing::Raw { ptr: addr, len },
        ))
    }

    /// Creates a queue pair in RESET (`ibv_create_qp`).
    fn create_qp(&self, init: &QpInit<'_>) -> Result<Box<dyn QpOps>> {
        const V: &str = "ibv_create_qp";
        let c = init.cap;
        for (name, v, max) in [
            ("max_send_wr", c.max_send_wr, limits::MAX_QP_WR),
            ("max_recv_wr", c.max_recv_wr, limits::MAX_QP_WR),
            ("max_send_sge", c.max_send_sge, limits::MAX_SGE),
            ("max_recv_sge", c.max_recv_sge, limits::MAX_SGE),
            (
                "max_inline_data",
                c.max_inline_data,
                limits::MAX_INLINE_DATA,
            ),
        ] {
            // With an SRQ the QP's own receive capacities are ignored, as libibverbs does.
            let may_be_zero = name.starts_with("max_inline")
                || (init.srq.is_some() && name.starts_with("max_recv"));
            if v > max || (v == 0 && !may_be_zero) {
                return Err(VerbsError::invalid(
                    V,
                    format!("cap.{name} = {v}, allowed 1..={max}"),
                ));
            }
        }
        let caps = QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr.max(1),
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge.max(1),
            max_rd_atomic: limits::MAX_QP_RD_ATOM,
            ..QpCaps::default()
        };
        let mut core = self.shared.core();
        let srq = init.srq.map(SoftSrq::of).transpose()?;
        if let Some(srq) = srq {
            if init.qp_type != QpType::Rc {
                return Err(VerbsError::invalid(
                    V,
                    "init_attr.srq: SRQs serve RC QPs only",
                ));
            }
            if srq.pd != self.id || !core.srqs.contains_key(&srq.id) {
                return Err(VerbsError::invalid(
                    V,
                    "init_attr.srq belongs to another protection domain or device",
                ));
            }
        }
        if core.qps.len() >= limits::MAX_QP {
            return Err(VerbsError::new(
                V,
                ErrorKind::Busy("device has limits::MAX_QP QPs".into()),
            ));
        }
        // The inline bounce region belongs to the QP slot; QueuePair's drop removes its keys.
        let inline = (c.max_inline_data > 0).then(|| {
            let n = c.max_inline_data as usize * c.max_send_wr as usize;
            let buf = vec![0u8; n].into_boxed_slice();
            let (addr, len) = (buf.as_ptr() as u64, n as u64);
            let mr = self.insert_region(
                addr,
                len,
                AccessFlags::NONE,
                Backing::Owned(Mutex::new(buf)),
            );
            (mr, c.max_inline_data)
        });
        let qpn = random_key(|k| {
            let q = k & 0xff_ffff;
            q < 0x11 || q == 0xff_ffff || core.qps.contains_key(&q)
        }) & 0xff_ffff;
        let engine = match init.qp_type {
            QpType::Rc => QpKind::Rc(RcQp::new(
                Qpn::new(qpn),
                caps,
                self.shared.config.congestion,
            )),
            QpType::Ud => QpKind::Ud(UdQp::new(
                Qpn::new(qpn),
                caps,
                self.shared.device.port_attr().active_mtu.bytes(),
            )),
        };
        let slot = QpSlot {
            qp: engine,
            pd: self.id,
            send_cq: SoftCq::of(init.send_cq)?,
            recv_cq: SoftCq::of(init.recv_cq)?,
            sq_sig_all: init.sq_sig_all,
            srq: srq.map(|q| q.id),
            peer: None,
            inline,
            inline_next: 0,
            sealer: None,
            src_port: None,
        };
        if let Some(s) = slot.srq.and_then(|id| core.srqs.get_mut(&id)) {
            s.users += 1;
        }
        core.qps.insert(qpn, slot);
        Ok(Box::new(SoftQp {
            shared: self.shared.clone(),
            qpn,
            cap: c,
        }))
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    fn create_srq(&self, attr: &SrqAttr) -> Result<Box<dyn SrqOps>> {
        const V: &str = "ibv_create_srq";
        if attr.max_wr == 0 || attr.max_wr > limits::MAX_QP_WR {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.max_wr = {}, allowed 1..={}",
                    attr.max_wr,
                    limits::MAX_QP_WR
                ),
            ));
        }
        if attr.max_sge == 0 || attr.max_sge > limits::MAX_SGE {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.max_sge = {}, allowed 1..={}",
                    attr.max_sge,
                    limits::MAX_SGE
                ),
            ));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(VerbsError::invalid(
                V,
                format!(
                    "attr.srq_limit {} above max_wr {}",
                    attr.srq_limit, attr.max_wr
                ),
            ));
        }
        let mut core = self.shared.core();
        let id = core.fresh_id();
        core.srqs.insert(
            id,
            SrqState {
                attr: *attr,
                queue: VecDeque::with_capacity(attr.max_wr as usize),
                users: 0,
                orphaned: false,
            },
        );
        Ok(Box::new(SoftSrq {
            shared: self.shared.clone(),
            id,
            pd: self.id,
        }))
    }

    /// Creates an address handle (`ibv_create_ah`): the source GID index must exist and the
    /// destination be of the same IP family.
    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AhOps>> {
        let av = AddressVector {
            dgid: attr.dgid.0,
            sgid_index: attr.sgid_index,
            hop_limit: attr.hop_limit,
            ..AddressVector::default()
        };
        self.shared.resolve_av("ibv_create_ah", &av)?;
        Ok(Arc::new(SoftAh { av, pd: self.id }))
    }
}
