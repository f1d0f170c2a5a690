//! The soft RNIC's address handles: a resolved address vector and the PD it belongs to.

use std::any::Any;

use monel_rc::AddressVector;

use crate::device::Gid;
use crate::error::{Result, VerbsError};
use crate::provider::AhOps;

/// An address handle of the soft RNIC.
#[derive(Debug, Clone)]
pub(crate) struct SoftAh {
    pub(crate) av: AddressVector,
    pub(crate) pd: u32,
}

impl SoftAh {
    /// The soft RNIC's handle behind `ah`; an error if another provider made it.
    pub(crate) fn of(ah: &dyn AhOps) -> Result<&Self> {
        ah.as_any().downcast_ref().ok_or_else(|| {
            VerbsError::invalid("ibv_post_send", "wr.ud.ah belongs to another device")
        })
    }
}

impl AhOps for SoftAh {
    fn dgid(&self) -> Gid {
        Gid(self.av.dgid)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
