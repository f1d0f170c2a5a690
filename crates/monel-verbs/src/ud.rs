//! Unreliable datagrams: address handles (`ibv_ah`) and the UD verbs of a [`QueuePair`].

use monel_rc::{AddressVector, AttrMask, QpAttr, QpState, SendWr, UdDest};
use monel_wire::{Psn, QKey, Qpn};

use crate::context::{ProtectionDomain, QueuePair};
use crate::device::Gid;
use crate::error::{ErrorKind, Result, VerbsError};

/// What an address handle points at (`ibv_ah_attr` with its GRH, as RoCE always has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Local GID index to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
}

/// An address handle (`ibv_ah`): a checked path to one destination, for UD sends.
#[derive(Debug, Clone)]
pub struct AddressHandle {
    av: AddressVector,
    pd: u32,
}

impl AddressHandle {
    /// The destination GID.
    pub fn dgid(&self) -> Gid {
        Gid(self.av.dgid)
    }
}

impl ProtectionDomain {
    /// Creates an address handle (`ibv_create_ah`): the source GID index must exist and the
    /// destination be of the same IP family.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        let av = AddressVector {
            dgid: attr.dgid.0,
            sgid_index: attr.sgid_index,
            hop_limit: attr.hop_limit,
            ..AddressVector::default()
        };
        self.shared.resolve_av("ibv_create_ah", &av)?;
        Ok(AddressHandle { av, pd: self.id })
    }
}

impl QueuePair {
    /// Brings a UD QP from RESET to RTS (INIT with `qkey`, RTR, RTS with `sq_psn`), as
    /// rdma-core's `ibv_ud_pingpong` does.
    pub fn ready_ud(&self, qkey: QKey, sq_psn: Psn) -> Result<()> {
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )?;
        attr.qp_state = QpState::Rtr;
        self.modify(&attr, AttrMask::STATE)?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = sq_psn;
        self.modify(&attr, AttrMask::STATE | AttrMask::SQ_PSN)
    }

    /// Posts a UD send (`ibv_post_send` with `wr.ud`): SEND or SEND with immediate of at
    /// most the port MTU, to QP `remote_qpn` at `ah`, carrying `remote_qkey` (top bit set:
    /// this QP's own Q_Key). The receiver's buffer gets 40 bytes of GRH first.
    pub fn post_send_ud(
        &self,
        mut wr: SendWr,
        ah: &AddressHandle,
        remote_qpn: Qpn,
        remote_qkey: QKey,
    ) -> Result<()> {
        const V: &str = "ibv_post_send";
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
        crate::engine::kick(&self.shared, self.qpn);
        Ok(())
    }
}
