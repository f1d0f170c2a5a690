//! What can go wrong with a segment, a descriptor, a batch or a peer's message.

use core::fmt;

/// A transfer engine error. Per descriptor where it concerns one; the batch's other
/// descriptors and the agent go on.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The transport failed (a verb, a socket); the text says which.
    Transport(String),
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
            Self::Timeout(why) => write!(f, "timed out: {why}"),
            Self::DuplicateNotification { from, seq } => {
                write!(f, "notification {seq} from {from:?} arrived before")
            }
        }
    }
}

impl std::error::Error for XferError {}

/// This crate's results.
pub type Result<T> = core::result::Result<T, XferError>;
