//! Address handles (`ibv_ah`): checked paths to one destination, for UD sends.

use std::sync::Arc;

use crate::device::Gid;
use crate::provider::AhOps;

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

/// An address handle (`ibv_ah`), made by [`crate::ProtectionDomain::create_ah`].
#[derive(Debug, Clone)]
pub struct AddressHandle {
    pub(crate) ops: Arc<dyn AhOps>,
}

impl AddressHandle {
    /// The destination GID.
    pub fn dgid(&self) -> Gid {
        self.ops.dgid()
    }
}
