//! Address handles (`ibv_ah`): checked paths to one destination, for UD sends.

use std::sync::Arc;

use crate::device::Gid;
use crate::provider::AhOps;

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
