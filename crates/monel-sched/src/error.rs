//! The one error of this crate: a call that cannot be planned, or a schedule that breaks its
//! own rules (a bug).

use std::fmt;

/// What kind of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchedErrorKind {
    /// The call's arguments cannot be planned (bad root, rank outside the order).
    InvalidArgument,
    /// A schedule or buffer layout that is wrong in itself: a bug in Monel.
    Internal,
}

/// A planning or execution error of a schedule, with a message naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedError {
    /// The kind.
    pub kind: SchedErrorKind,
    /// What was wrong.
    pub message: String,
}

/// Result with [`SchedError`].
pub type Result<T, E = SchedError> = std::result::Result<T, E>;

impl SchedError {
    /// A bad argument.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            kind: SchedErrorKind::InvalidArgument,
            message: message.into(),
        }
    }
    /// A bug.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            kind: SchedErrorKind::Internal,
            message: message.into(),
        }
    }
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SchedError {}
