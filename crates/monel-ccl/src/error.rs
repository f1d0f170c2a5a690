//! Errors: what went wrong, named in terms a user can act on (which rank, which operation).

use std::fmt;
use std::sync::Arc;

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

/// A collective-layer error: a kind and a message naming the operation and the ranks, and
/// the failure beneath it where there is one ([`std::error::Error::source`]: a socket's, a
/// verb's, a schedule's). Two errors are equal when their kinds, messages and ranks are.
#[derive(Debug, Clone)]
pub struct CclError {
    /// The kind.
    pub kind: ErrorKind,
    /// The message.
    pub message: String,
    /// The ranks the error names (missing, dead or mismatched ones), ascending.
    pub ranks: Vec<usize>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl PartialEq for CclError {
    fn eq(&self, other: &Self) -> bool {
        (&self.kind, &self.message, &self.ranks) == (&other.kind, &other.message, &other.ranks)
    }
}

impl Eq for CclError {}

/// Result with [`CclError`].
pub type Result<T, E = CclError> = std::result::Result<T, E>;

impl CclError {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            ranks: Vec::new(),
            source: None,
        }
    }
    /// With the failure beneath it (its message should already say what it was).
    pub fn with_source(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(e));
        self
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
        Self::new(ErrorKind::System, format!("{context}: {e}")).with_source(e)
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

impl std::error::Error for CclError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<monel_sched::SchedError> for CclError {
    fn from(e: monel_sched::SchedError) -> Self {
        let kind = match e.kind {
            monel_sched::SchedErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
            _ => ErrorKind::Internal,
        };
        Self::new(kind, e.message.clone()).with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn causes_are_kept_and_do_not_change_equality() {
        let e = CclError::io("link", std::io::Error::other("reset by peer"));
        assert_eq!(e.to_string(), "link: reset by peer");
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("reset by peer")
        );
        assert_eq!(e, CclError::new(ErrorKind::System, "link: reset by peer"));
        let s = monel_sched::SchedError::invalid("count 0");
        let c = CclError::from(s);
        assert_eq!(c.kind, ErrorKind::InvalidArgument);
        assert!(
            c.source()
                .is_some_and(|s| s.is::<monel_sched::SchedError>())
        );
        assert!(CclError::invalid("x").source().is_none());
    }
}
