//! The soft RNIC's queue pairs: the verbs on a QP slot, each post serviced at once by the
//! posting thread (`engine::kick`).

use std::sync::{Arc, PoisonError};

use monel_rc::congestion::ControllerMetrics;
use monel_rc::{
    AttrMask, Mtu, QpAttr, QpState, QpStats, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest,
};
use monel_wire::LKey;
use monel_wire::{QKey, Qpn};

use super::ah::SoftAh;
use super::engine;
use super::qp_kind::QpKind;
use super::queues::SrqState;
use super::shared::{DevShared, QpSlot};
use crate::attr::QpCap;
use crate::device::Device;
use crate::error::{ErrorKind, Result, VerbsError};
use crate::provider::{AhOps, QpOps};

/// A queue pair of the soft RNIC: a handle on its slot in the device.
#[derive(Debug)]
pub(crate) struct SoftQp {
    pub(crate) shared: Arc<DevShared>,
    pub(crate) qpn: u32,
    pub(crate) cap: QpCap,
}

impl SoftQp {
    pub(crate) fn with_slot<R>(
        &self,
        verb: &'static str,
        f: impl FnOnce(&mut QpSlot) -> Result<R>,
    ) -> Result<R> {
        let mut core = self.shared.core();
        let slot = core.qps.get_mut(&self.qpn).ok_or_else(|| {
            VerbsError::new(verb, ErrorKind::NotFound(format!("QP {:#x}", self.qpn)))
        })?;
        f(slot)
    }
}

impl QpOps for SoftQp {
    fn qp_num(&self) -> Qpn {
        Qpn::new(self.qpn)
    }
    fn device(&self) -> &Device {
        &self.shared.device
    }
    fn cap(&self) -> QpCap {
        self.cap
    }
    fn traffic_class(&self) -> u8 {
        self.shared.config.traffic_class()
    }
    fn local_udp_port(&self, gid_index: u8) -> Result<u16> {
        Ok(self
            .shared
            .sockets
            .load()
            .local_addr(usize::from(gid_index))?
            .port())
    }

    fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        const V: &str = "ibv_modify_qp";
        let peer = if mask.contains(AttrMask::AV) {
            Some(self.shared.resolve_av(V, &attr.ah_attr)?)
        } else {
            None
        };
        if mask.contains(AttrMask::PATH_MTU) && attr.path_mtu > Mtu::Mtu4096 {
            return Err(VerbsError::invalid(V, "path_mtu above the port's max_mtu"));
        }
        self.with_slot(V, |slot| {
            slot.qp
                .modify(attr, mask)
                .map_err(|e| VerbsError::new(V, ErrorKind::Modify(e)))?;
            if let Some(p) = peer {
                slot.peer = Some(p);
            }
            // Back to RESET: the next connection brings its own protection and peer port.
            if mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Reset {
                slot.sealer = None;
                slot.src_port = None;
            }
            Ok(())
        })?;
        self.shared.ring();
        Ok(())
    }

    fn set_peer_udp_port(&self, port: u16) -> Result<()> {
        self.with_slot("ibv_modify_qp", |slot| {
            if let Some((_, peer)) = slot.peer.as_mut() {
                peer.set_port(port);
            }
            Ok(())
        })
    }

    fn protect(&self, p: &crate::protect::Protection) -> Result<()> {
        const V: &str = "protect";
        self.with_slot(V, |slot| {
            if !matches!(slot.qp, QpKind::Rc(_)) {
                return Err(VerbsError::invalid(V, "packet protection is for RC QPs"));
            }
            if !matches!(slot.qp.state(), QpState::Reset | QpState::Init) {
                return Err(VerbsError::invalid(
                    V,
                    "packet protection must be set before the QP leaves INIT",
                ));
            }
            slot.sealer = crate::protect::Sealer::new(p);
            Ok(())
        })
    }

    fn query(&self) -> Result<(QpState, QpAttr)> {
        self.with_slot("ibv_query_qp", |s| Ok((s.qp.state(), s.qp.attr())))
    }

    fn post_send(&self, mut wr: SendWr) -> Result<()> {
        self.with_slot("ibv_post_send", |slot| {
            if slot.sq_sig_all {
                wr.flags.signaled = true;
            }
            slot.qp
                .rc("ibv_post_send")?
                .post_send(wr)
                .map_err(|e| VerbsError::new("ibv_post_send", ErrorKind::Post(e)))
        })?;
        engine::kick(&self.shared, self.qpn);
        Ok(())
    }

    fn post_send_inline(
        &self,
        wr_id: u64,
        op: SendOp,
        data: &[u8],
        flags: SendFlags,
    ) -> Result<()> {
        const V: &str = "ibv_post_send";
        if op.is_rd_atomic() {
            return Err(VerbsError::invalid(
                V,
                "IBV_SEND_INLINE on a READ or atomic",
            ));
        }
        self.with_slot(V, |slot| {
            let Some((mr, per)) = slot.inline.clone() else {
                return Err(VerbsError::invalid(V, "QP created with max_inline_data 0"));
            };
            if data.len() > per as usize {
                return Err(VerbsError::invalid(
                    V,
                    format!("{} inline bytes, max_inline_data is {per}", data.len()),
                ));
            }
            if slot.qp.outstanding_sends() >= self.cap.max_send_wr as usize {
                return Err(VerbsError::new(
                    V,
                    ErrorKind::Post(monel_rc::PostError::QueueFull),
                ));
            }
            // One slot per send-queue entry: a slot is reused only after the queue wrapped,
            // by which time the WQE that used it has left the queue.
            let idx = slot.inline_next % self.cap.max_send_wr;
            let off = idx as usize * per as usize;
            mr.with(|b| b[off..off + data.len()].copy_from_slice(data));
            let mut flags = flags;
            if slot.sq_sig_all {
                flags.signaled = true;
            }
            let wr = SendWr {
                wr_id,
                op,
                sg_list: if data.is_empty() {
                    vec![]
                } else {
                    vec![Sge {
                        addr: mr.addr + off as u64,
                        length: data.len() as u32,
                        lkey: LKey(mr.lkey),
                    }]
                },
                flags,
            };
            slot.qp
                .rc(V)?
                .post_send(wr)
                .map_err(|e| VerbsError::new(V, ErrorKind::Post(e)))?;
            slot.inline_next = slot.inline_next.wrapping_add(1);
            Ok(())
        })?;
        engine::kick(&self.shared, self.qpn);
        Ok(())
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.with_slot("ibv_post_recv", |slot| {
            if slot.srq.is_some() {
                return Err(VerbsError::invalid(
                    "ibv_post_recv",
                    "the QP takes its receives from an SRQ (post to the SRQ)",
                ));
            }
            slot.qp
                .post_recv(wr)
                .map_err(|e| VerbsError::new("ibv_post_recv", ErrorKind::Post(e)))
        })?;
        // Nothing to send: a requester that drew an RNR NAK retries on its own timer.
        Ok(())
    }

    fn stats(&self) -> Result<QpStats> {
        self.with_slot("ibv_query_qp", |s| Ok(s.qp.stats()))
    }

    fn congestion(&self) -> Result<ControllerMetrics> {
        self.with_slot("ibv_query_qp", |s| {
            s.qp.congestion().ok_or_else(|| {
                VerbsError::invalid("ibv_query_qp", "a UD QP has no congestion control")
            })
        })
    }

    fn post_send_ud(
        &self,
        mut wr: SendWr,
        ah: &dyn AhOps,
        remote_qpn: Qpn,
        remote_qkey: QKey,
    ) -> Result<()> {
        const V: &str = "ibv_post_send";
        let ah = SoftAh::of(ah)?;
        self.with_slot(V, |slot| {
            if slot.pd != ah.pd {
                return Err(VerbsError::invalid(
                    V,
                    "wr.ud.ah belongs to another protection domain",
                ));
            }
            if slot.sq_sig_all {
                wr.flags.signaled = true;
            }
            let dest = UdDest {
                av: ah.av,
                remote_qpn,
                remote_qkey,
            };
            slot.qp
                .ud(V)?
                .post_send(wr, dest)
                .map_err(|e| VerbsError::new(V, ErrorKind::Post(e)))
        })?;
        engine::kick(&self.shared, self.qpn);
        Ok(())
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        // ACKs deferred to batch with a next post that will not come go out now.
        if self.shared.core().pending_tx.contains(&self.qpn) {
            engine::kick(&self.shared, self.qpn);
        }
        let mut core = self.shared.core();
        if let Some(slot) = core.qps.remove(&self.qpn) {
            let st = slot.qp.stats();
            core.retired += st;
            if let Some(id) = slot.srq {
                if core.srqs.get_mut(&id).is_some_and(SrqState::detach) {
                    core.srqs.remove(&id);
                }
            }
            if let Some((mr, _)) = slot.inline {
                self.shared
                    .mrs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(mr.lkey, mr.rkey);
            }
        }
    }
}
