//! Control-path errors: every failure names the verb and what was wrong.

use std::fmt;
use std::io;

use monel_rc::{ModifyError, PostError};

/// Why a verb failed.
#[non_exhaustive]
#[derive(Debug)]
pub enum ErrorKind {
    /// An argument is out of range or inconsistent; the text says which.
    InvalidArgument(String),
    /// The QP state machine refused a modify.
    Modify(ModifyError),
    /// A post was refused.
    Post(PostError),
    /// The object is still in use (e.g. a CQ with QPs, an MR a QP still needs).
    Busy(String),
    /// No such device, GID index, key or QP.
    NotFound(String),
    /// The operation is not supported by this provider.
    Unsupported(String),
    /// The peer of a connection setup failed to authenticate or spoke garbage.
    Peer(String),
    /// A system call failed.
    Io(io::Error),
    /// A timeout expired.
    Timeout(String),
}

/// A failed verb: which one, and why.
#[derive(Debug)]
pub struct VerbsError {
    /// The verb, named as in libibverbs (`ibv_modify_qp`, `ibv_reg_mr`, ...).
    pub verb: &'static str,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl VerbsError {
    /// An error of `verb`.
    pub fn new(verb: &'static str, kind: ErrorKind) -> Self {
        Self { verb, kind }
    }
    /// An invalid-argument error of `verb`.
    pub fn invalid(verb: &'static str, what: impl Into<String>) -> Self {
        Self::new(verb, ErrorKind::InvalidArgument(what.into()))
    }
    /// An I/O error of `verb`.
    pub fn io(verb: &'static str, e: impl Into<io::Error>) -> Self {
        Self::new(verb, ErrorKind::Io(e.into()))
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.verb)?;
        match &self.kind {
            ErrorKind::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            ErrorKind::Modify(e) => write!(f, "{e}"),
            ErrorKind::Post(e) => write!(f, "{e}"),
            ErrorKind::Busy(s) => write!(f, "busy: {s}"),
            ErrorKind::NotFound(s) => write!(f, "not found: {s}"),
            ErrorKind::Unsupported(s) => write!(f, "not supported: {s}"),
            ErrorKind::Peer(s) => write!(f, "peer: {s}"),
            ErrorKind::Io(e) => write!(f, "{e}"),
            ErrorKind::Timeout(s) => write!(f, "timed out: {s}"),
        }
    }
}

impl std::error::Error for VerbsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Result of a verb.
pub type Result<T> = std::result::Result<T, VerbsError>;
