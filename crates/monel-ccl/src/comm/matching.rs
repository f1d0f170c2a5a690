//! Receives that match by tag and by source (MPI's and torch's): the first message from the
//! source (or from any peer) that carries the tag. Messages with other tags that arrive
//! first are received whole and set aside, in order, for the receives that want them; a
//! size that does not match is refused before anything is consumed.

use std::time::Instant;

use monel_sched::dtype::DataType;

use super::Communicator;
use crate::error::{CclError, ErrorKind, Result};
use crate::exec;
use crate::frame::Signature;

/// Most bytes set aside for receives not posted yet; beyond it a receive fails, naming
/// the peer, rather than let a peer make this rank allocate without bound.
pub const STASH_MAX: usize = 1 << 30;

/// Messages received ahead of their receives, in arrival order.
#[derive(Default)]
pub(super) struct Stash {
    held: Vec<(usize, u32, Vec<u8>)>,
    bytes: usize,
}

impl Communicator {
    /// Receives into `buf` (`count` elements of `dtype`) the first message from `src`
    /// (`None`: from any peer) that carries `tag`; returns the rank it came from. Messages
    /// with other tags that arrive before it are kept for their own receives (at most
    /// [`STASH_MAX`] bytes). A message of another size than `buf` is an error that leaves
    /// the message for a receive of the right size, and the communicator usable.
    pub fn recv_tagged(
        &mut self,
        buf: &mut [u8],
        count: usize,
        dtype: DataType,
        src: Option<usize>,
        tag: u32,
    ) -> Result<usize> {
        if let Some(e) = &self.failed {
            return Err(CclError::new(
                ErrorKind::Aborted,
                format!("communicator failed earlier: {e}"),
            ));
        }
        let (me, n) = (self.rank, self.nranks);
        if let Some(p) = src {
            if p >= n {
                return Err(CclError::invalid(format!(
                    "recv: peer {p} is not a rank (0..{n})"
                )));
            }
        }
        let bytes = count.saturating_mul(dtype.size());
        if buf.len() < bytes {
            return Err(CclError::invalid(format!(
                "recv: buffer has {} bytes, {count} {dtype} elements need {bytes}",
                buf.len()
            )));
        }
        let buf = &mut buf[..bytes];
        if bytes == 0 {
            // Empty messages are no-ops on both sides (as in NCCL).
            return Ok(src.unwrap_or(me));
        }
        if src == Some(me) {
            return Err(CclError::invalid(format!(
                "recv from self (rank {me}) outside a group: put it in one group with its send"
            )));
        }
        let peers: Vec<usize> = match src {
            Some(p) => vec![p],
            None => (0..n).filter(|&j| j != me).collect(),
        };
        let deadline = Instant::now() + self.cfg.timeout;
        match self.recv_matching(buf, &peers, tag, deadline) {
            Err(e) if e.kind != ErrorKind::InvalidArgument => {
                let sig = Signature::p2p(0, bytes as u64, tag);
                self.conclude(sig, Err(e)).map(|()| me)
            }
            r => r,
        }
    }

    /// [`Self::recv_tagged`]'s matching, from any of `peers`, until `deadline`. A wait
    /// that fails returns its error without failing the communicator (the caller decides).
    pub(super) fn recv_matching(
        &mut self,
        buf: &mut [u8],
        peers: &[usize],
        tag: u32,
        deadline: Instant,
    ) -> Result<usize> {
        let bytes = buf.len();
        if let Some(p) = self.stashed(peers, tag) {
            self.take_stashed(p, tag, buf)?;
            return Ok(p);
        }
        let what = match peers {
            [p] => format!("recv of {bytes} bytes, tag {tag}, from rank {p}"),
            _ => format!("recv of {bytes} bytes, tag {tag}, from any of ranks {peers:?}"),
        };
        loop {
            let (p, h) = exec::wait_p2p(&mut self.links, peers, deadline, self.cfg.spin, &what)?;
            let len = usize::try_from(h.sig.count).unwrap_or(usize::MAX);
            if h.sig.tag() == tag {
                if len != bytes {
                    return Err(CclError::invalid(format!(
                        "{what}: rank {p} sent {len} bytes with that tag; the message waits \
                         for a receive of its size"
                    ))
                    .with_ranks(vec![p]));
                }
                self.point_to_point(Vec::new(), vec![(p, tag, buf)])?;
                return Ok(p);
            }
            // Another receive's message: set it aside.
            if len > STASH_MAX - self.stash.bytes {
                return Err(CclError::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{what}: rank {p} sent {len} bytes with tag {} first, more than the \
                         {STASH_MAX} bytes this rank keeps for receives not posted yet \
                         ({} held); post that receive first",
                        h.sig.tag(),
                        self.stash.bytes
                    ),
                )
                .with_ranks(vec![p]));
            }
            let mut data = vec![0u8; len];
            self.point_to_point(Vec::new(), vec![(p, h.sig.tag(), &mut data)])?;
            self.stash.bytes += len;
            self.stash.held.push((p, h.sig.tag(), data));
        }
    }

    /// The source of the first message set aside from one of `peers` with `tag`.
    fn stashed(&self, peers: &[usize], tag: u32) -> Option<usize> {
        self.stash
            .held
            .iter()
            .find(|(p, t, _)| *t == tag && peers.contains(p))
            .map(|(p, _, _)| *p)
    }

    /// Copies the first message set aside from `peer` with `tag` into `buf`, if there is
    /// one (true). One of another size stays, and is an error.
    pub(super) fn take_stashed(&mut self, peer: usize, tag: u32, buf: &mut [u8]) -> Result<bool> {
        let Some(i) = self
            .stash
            .held
            .iter()
            .position(|(p, t, _)| *p == peer && *t == tag)
        else {
            return Ok(false);
        };
        let len = self.stash.held[i].2.len();
        if len != buf.len() {
            return Err(CclError::invalid(format!(
                "recv of {} bytes, tag {tag}, from rank {peer}: rank {peer} sent {len} bytes \
                 with that tag; the message waits for a receive of its size",
                buf.len()
            ))
            .with_ranks(vec![peer]));
        }
        let (_, _, data) = self.stash.held.remove(i);
        buf.copy_from_slice(&data);
        self.stash.bytes -= len;
        Ok(true)
    }
}
