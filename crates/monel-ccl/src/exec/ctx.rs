//! What one call of the executor runs under: its links, its signature and name, its
//! deadline and spinning, point-to-point numbering and the liveness watch.

use std::time::{Duration, Instant};

use crate::error::{CclError, ErrorKind};
use crate::frame::Signature;
use crate::liveness::Liveness;
use monel_sched::schedule::Buf;

use super::links::Links;

/// What the executor needs besides the schedule and buffers.
pub(crate) struct Ctx<'a> {
    pub(crate) links: &'a mut Links,
    /// The collective's signature, and how to name it in messages.
    pub(crate) name: Name<'a>,
    /// How long the call may wait, counted from its first wait (a call that never waits
    /// reads no clock for it).
    pub(crate) timeout: Duration,
    /// Set at the first wait: when the call gives up.
    pub(crate) deadline: Option<Instant>,
    /// How long to poll without sleeping when nothing moves.
    pub(crate) spin: Duration,
    /// Yield the CPU every this many idle rounds: 1 when this host has more ranks than
    /// cores (a spinning rank would hold the core its peer needs), else rarely.
    pub(crate) yield_every: u32,
    /// Point-to-point numbering, for send/recv groups: each message carries its own
    /// signature (`P2P_CODE`, the pair's message number, its length in bytes).
    pub(crate) p2p: Option<P2pSeqs<'a>>,
    /// Names a peer that stops answering while the call waits on it (`None`: only the
    /// timeout does).
    pub(crate) liveness: Option<Liveness<'a>>,
    /// Sends of bytes nothing writes before the call ends may leave them where they lie
    /// for the transport (memory registered with the NIC skips the staging copy); the call
    /// then waits at its end until the transports read them no more.
    pub(crate) stable_sends: bool,
}

/// The numbers of the last message sent to and received from each peer, and the tags of
/// the group's sends and receives (by part).
pub(crate) struct P2pSeqs<'a> {
    pub(crate) send: &'a mut [u64],
    pub(crate) recv: &'a mut [u64],
    pub(crate) send_tags: &'a [u32],
    pub(crate) recv_tags: &'a [u32],
}

pub(crate) use crate::frame::P2P_CODE;

impl Ctx<'_> {
    /// The signature the next message to (`send`) or from `peer` of `bytes` carries, into
    /// or out of buffer `buf` (a group's part: its tag).
    pub(super) fn next_sig(
        &mut self,
        peer: usize,
        bytes: usize,
        send: bool,
        buf: Buf,
    ) -> Signature {
        let Some(p) = self.p2p.as_mut() else {
            return self.name.sig;
        };
        let (seq, tags) = if send {
            (&mut p.send[peer], p.send_tags)
        } else {
            (&mut p.recv[peer], p.recv_tags)
        };
        *seq += 1;
        let tag = match buf {
            Buf::SendPart(i) | Buf::RecvPart(i) => tags.get(usize::from(i)).copied(),
            _ => None,
        };
        Signature::p2p(*seq, bytes as u64, tag.unwrap_or(0))
    }
}

/// A collective's signature and its description, formatted only when a message needs it.
#[derive(Clone, Copy)]
pub(crate) struct Name<'a> {
    pub(crate) sig: Signature,
    pub(crate) describe: &'a dyn Fn(&Signature) -> String,
}

impl Name<'_> {
    /// `all_reduce #4 count 1024 float op sum`.
    pub(crate) fn what(&self) -> String {
        (self.describe)(&self.sig)
    }
}

pub(super) fn lost(peer: usize, what: &str, e: &std::io::Error) -> CclError {
    CclError::new(
        ErrorKind::PeerLost,
        format!("{what}: connection to rank {peer} lost ({e}); did rank {peer} die?"),
    )
    .with_ranks(vec![peer])
}
