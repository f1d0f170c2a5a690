//! Errors: what went wrong, named in terms a user can act on (which rank, which operation).

use std::fmt;

/// What kind of failure (NCCL's `ncclResult_t`, with the ranks named).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A bad argument on this rank (bad root, buffer too small, wrong type).
    InvalidArgument,
    /// Ranks called different collectives, or the same with different arguments.
    Mismatch,
    /// The operation did not finish within the timeout.
    Timeout,
    /// A peer's connection closed or failed.
    PeerLost,
    /// Another rank aborted the operation (its reason is in the message).
    RemoteAbort,
    /// The communicator was aborted or failed before.
    Aborted,
    /// Bootstrap failed (rendezvous, wrong unique id, missing environment).
    Bootstrap,
    /// A system call failed.
    System,
    /// A bug in Monel.
    Internal,
}

/// A collective-layer error: a kind and a message naming the operation and the ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CclError {
    /// The kind.
    pub kind: ErrorKind,
    /// The message.
    pub message: String,
    /// The ranks the error names (missing, dead or mismatched ones), ascending.
    pub ranks: Vec<usize>,
}

/// Result with [`CclError`].
pub type Result<T, E = CclError> = std::result::Result<T, E>;

impl CclError {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            ranks: Vec::new(),
        }
    }
    /// With the ranks it names.
    pub fn with_ranks(mut self, mut ranks: Vec<usize>) -> Self {
        ranks.sort_unstable();
        ranks.dedup();
        self.ranks = ranks;
        self
    }
    /// A bad argument.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    /// A bug.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    /// A failed system call, with context.
    pub fn io(context: impl fmt::Display, e: std::io::Error) -> Self {
        Self::new(ErrorKind::System, format!("{context}: {e}"))
    }
    /// A bootstrap failure.
    pub fn bootstrap(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Bootstrap, message)
    }
}

impl fmt::Display for CclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CclError {}

impl From<monel_sched::SchedError> for CclError {
    fn from(e: monel_sched::SchedError) -> Self {
        let kind = match e.kind {
            monel_sched::SchedErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
            _ => ErrorKind::Internal,
        };
        Self::new(kind, e.message)
    }
}
