//! The engine behind a QP slot: the RC engine or the UD one, behind the calls the device
//! makes on both.

use monel_rc::congestion::ControllerMetrics;
use monel_rc::{
    AttrMask, Instant, ModifyError, PostError, QpAttr, QpEvent, QpState, QpStats, RcQp, RecvWr,
    UdQp, WorkCompletion,
};

/// A QP's transport engine. Not boxed: slots live in the device's map and RC, the variant
/// on every packet's path, is the large one.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum QpKind {
    Rc(RcQp),
    Ud(UdQp),
}

impl QpKind {
    /// The RC engine, or an error naming `verb` for a UD QP.
    pub(crate) fn rc(&mut self, verb: &'static str) -> crate::Result<&mut RcQp> {
        match self {
            Self::Rc(q) => Ok(q),
            Self::Ud(_) => Err(crate::VerbsError::invalid(
                verb,
                "a UD QP: sends take an address handle (post_send_ud), no RC operations",
            )),
        }
    }
    /// The UD engine, or an error naming `verb` for an RC QP.
    pub(crate) fn ud(&mut self, verb: &'static str) -> crate::Result<&mut UdQp> {
        match self {
            Self::Ud(q) => Ok(q),
            Self::Rc(_) => Err(crate::VerbsError::invalid(
                verb,
                "an RC QP: sends go to its connected peer (post_send)",
            )),
        }
    }
    pub(crate) fn state(&self) -> QpState {
        match self {
            Self::Rc(q) => q.state(),
            Self::Ud(q) => q.state(),
        }
    }
    pub(crate) fn attr(&self) -> QpAttr {
        match self {
            Self::Rc(q) => q.attr(),
            Self::Ud(q) => q.attr(),
        }
    }
    pub(crate) fn stats(&self) -> QpStats {
        match self {
            Self::Rc(q) => q.stats(),
            Self::Ud(q) => q.stats(),
        }
    }
    pub(crate) fn congestion(&self) -> Option<ControllerMetrics> {
        match self {
            Self::Rc(q) => Some(q.congestion()),
            Self::Ud(_) => None,
        }
    }
    pub(crate) fn outstanding_sends(&self) -> usize {
        match self {
            Self::Rc(q) => q.outstanding_sends(),
            Self::Ud(q) => q.outstanding_sends(),
        }
    }
    pub(crate) fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        match self {
            Self::Rc(q) => q.modify(attr, mask),
            Self::Ud(q) => q.modify(attr, mask),
        }
    }
    pub(crate) fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        match self {
            Self::Rc(q) => q.post_recv(wr),
            Self::Ud(q) => q.post_recv(wr),
        }
    }
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Self::Rc(q) => q.poll_timeout(),
            Self::Ud(_) => None,
        }
    }
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let Self::Rc(q) = self {
            q.handle_timeout(now);
        }
    }
    pub(crate) fn poll_send_completion(&mut self) -> Option<WorkCompletion> {
        match self {
            Self::Rc(q) => q.poll_send_completion(),
            Self::Ud(q) => q.poll_send_completion(),
        }
    }
    pub(crate) fn poll_recv_completion(&mut self) -> Option<WorkCompletion> {
        match self {
            Self::Rc(q) => q.poll_recv_completion(),
            Self::Ud(q) => q.poll_recv_completion(),
        }
    }
    pub(crate) fn poll_event(&mut self) -> Option<QpEvent> {
        match self {
            Self::Rc(q) => q.poll_event(),
            Self::Ud(_) => None,
        }
    }
}
