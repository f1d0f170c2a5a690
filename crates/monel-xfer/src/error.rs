//! What can go wrong with a segment, a descriptor, a batch or a peer's message.

use core::fmt;
use std::sync::Arc;

/// The failure beneath an error, kept whole (a verb's, a socket's, a system call's), so
/// [`std::error::Error::source`] hands it on. Two causes are equal when they read the same.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    /// Keeps `e`.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(e))
    }

    /// The error kept.
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

/// A transfer engine error. Per descriptor where it concerns one; the batch's other
/// descriptors and the agent go on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum XferError {
    /// No segment of this name (here, or among what the peer published).
    UnknownSegment(String),
    /// The range is not inside one buffer of the segment.
    OutOfRange {
        /// The segment.
        segment: String,
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// The segment's length.
        size: u64,
    },
    /// A name, count or length over the engine's bounds (named in the text).
    TooLarge(String),
    /// A segment of this name already exists.
    Duplicate(String),
    /// A peer's message that does not parse, or breaks the protocol.
    BadMessage(String),
    /// The peer's path failed (its queue pair, connection or process); what was in flight
    /// to it did not complete.
    PeerLost(String),
    /// No agent of this name is registered in the job.
    UnknownPeer(String),
    /// No batch of this number (never made, or ended and already waited for).
    UnknownBatch(u32),
    /// The transport broke its own rules or lost what it needed; the text says how.
    Transport(String),
    /// A verb, a socket or a system call beneath the transport failed: the cause, kept.
    System(Cause),
    /// Nothing happened in time.
    Timeout(String),
    /// A notification the receiver already had (same sender, same or older number).
    DuplicateNotification {
        /// The sender.
        from: String,
        /// Its number.
        seq: u64,
    },
}

impl fmt::Display for XferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownSegment(n) => write!(f, "no segment named {n:?}"),
            Self::OutOfRange {
                segment,
                offset,
                len,
                size,
            } => write!(
                f,
                "{len} bytes at offset {offset} are not inside one buffer of segment {segment:?} ({size} bytes)"
            ),
            Self::TooLarge(what) => write!(f, "too large: {what}"),
            Self::Duplicate(n) => write!(f, "a segment named {n:?} exists already"),
            Self::BadMessage(why) => write!(f, "bad message from the peer: {why}"),
            Self::PeerLost(why) => write!(f, "peer lost: {why}"),
            Self::UnknownPeer(n) => write!(f, "no agent named {n:?} is registered"),
            Self::UnknownBatch(id) => write!(f, "no batch {id} (or it ended and was waited for)"),
            Self::Transport(why) => write!(f, "transport: {why}"),
            Self::System(cause) => write!(f, "transport: {cause}"),
            Self::Timeout(why) => write!(f, "timed out: {why}"),
            Self::DuplicateNotification { from, seq } => {
                write!(f, "notification {seq} from {from:?} arrived before")
            }
        }
    }
}

impl std::error::Error for XferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::System(cause) => Some(cause.get()),
            _ => None,
        }
    }
}

impl From<std::io::Error> for XferError {
    fn from(e: std::io::Error) -> Self {
        Self::System(Cause::new(e))
    }
}

impl From<monel_verbs::VerbsError> for XferError {
    fn from(e: monel_verbs::VerbsError) -> Self {
        Self::System(Cause::new(e))
    }
}

/// This crate's results.
pub type Result<T> = core::result::Result<T, XferError>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn a_failure_beneath_is_kept_as_the_source() {
        let e = XferError::from(std::io::Error::other("connection reset"));
        assert_eq!(e.to_string(), "transport: connection reset");
        let src = e.source().expect("the io error");
        assert!(src.is::<std::io::Error>());
        assert_eq!(e.clone(), e);
        assert!(XferError::Transport("x".into()).source().is_none());
    }
}
