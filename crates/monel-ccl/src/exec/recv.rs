//! One receive of a schedule step in flight: frames read without blocking, checked against
//! the call's signature, copied or reduced into place (straight out of a ring where the
//! transport has one).

use crate::error::Result;
use crate::error::{CclError, ErrorKind};
use crate::frame::{FRAME_ABORT, FRAME_CLOSE, HEADER_LEN, Header, Signature};
use monel_sched::buffers::Buffers;
use monel_sched::schedule::Span;

use super::RING_PIECE;
use super::abort::{abort_error, read_payload, sig_mismatch};
use super::ctx::{Ctx, lost};

pub(super) struct RecvSt {
    pub(super) peer: usize,
    /// The signature expected on the peer's frames.
    pub(super) sig: Signature,
    pub(super) dst: Span,
    /// Reduce with this operand into `dst` (`dst = acc op incoming`); copy when `None`.
    pub(super) acc: Option<Span>,
    pub(super) total: usize,
    pub(super) got: usize,
    pub(super) hdr: [u8; HEADER_LEN],
    pub(super) hdr_got: usize,
    pub(super) frame_left: usize,
    pub(super) in_frame: bool,
    /// Bytes of this peer's stage in use for this message.
    pub(super) stage_len: usize,
    pub(super) fill: usize,
    pub(super) done: bool,
}

impl RecvSt {
    /// `len` bytes of the message, from byte `at`, as a span of `base`.
    pub(super) fn piece(&self, base: Span, at: usize, len: usize, es: usize) -> Span {
        Span {
            buf: base.buf,
            off: base.off + at / es,
            len: len / es,
        }
    }

    /// Reduces `data` (whole elements) into the message at byte `self.got`.
    pub(super) fn land(
        &mut self,
        bufs: &mut Buffers<'_>,
        acc: Span,
        data: &[u8],
        es: usize,
    ) -> Result<()> {
        let a = self.piece(acc, self.got, data.len(), es);
        let d = self.piece(self.dst, self.got, data.len(), es);
        bufs.land_onto(a, d, data)?;
        self.got += data.len();
        Ok(())
    }

    pub(super) fn drive(
        &mut self,
        ctx: &mut Ctx<'_>,
        bufs: &mut Buffers<'_>,
        stage: &mut [u8],
    ) -> Result<bool> {
        let mut progress = false;
        let es = bufs.elem();
        let stage = &mut stage[..self.stage_len];
        loop {
            if !self.in_frame {
                let link = ctx.links.link(self.peer)?;
                let n = link
                    .read_some(&mut self.hdr[self.hdr_got..])
                    .map_err(|e| lost(self.peer, &ctx.name.what(), &e))?;
                if n == 0 {
                    return Ok(progress);
                }
                progress = true;
                self.hdr_got += n;
                if self.hdr_got < HEADER_LEN {
                    continue;
                }
                self.hdr_got = 0;
                let h = self.check_header(ctx)?;
                self.frame_left = h.len as usize;
                self.in_frame = true;
            }
            if self.frame_left > 0 {
                let peer = self.peer;
                let link = ctx.links.link(peer)?;
                let n = match self.acc {
                    Some(acc) => {
                        // A ring (shared memory, the soft RNIC): reduce straight out of it.
                        let mut direct = 0;
                        if self.fill == 0 {
                            let max = self.frame_left.min(RING_PIECE);
                            let mut landed = Ok(());
                            let r = link.read_in_place(max, &mut |avail| {
                                let whole = avail.len() - avail.len() % es;
                                if whole > 0 {
                                    landed = self.land(bufs, acc, &avail[..whole], es);
                                }
                                if landed.is_ok() { whole } else { 0 }
                            });
                            if let Some(r) = r {
                                direct = r.map_err(|e| lost(peer, &ctx.name.what(), &e))?;
                                landed?;
                            }
                        }
                        if direct > 0 {
                            direct
                        } else {
                            let room = (stage.len() - self.fill).min(self.frame_left);
                            let n = link
                                .read_some(&mut stage[self.fill..self.fill + room])
                                .map_err(|e| lost(peer, &ctx.name.what(), &e))?;
                            self.fill += n;
                            n
                        }
                    }
                    None => {
                        let d = bufs.bytes_mut(self.dst)?;
                        link.read_some(&mut d[self.got..self.got + self.frame_left])
                            .map_err(|e| lost(peer, &ctx.name.what(), &e))?
                    }
                };
                if n == 0 {
                    return Ok(progress);
                }
                progress = true;
                self.frame_left -= n;
                match self.acc {
                    Some(acc) if self.fill > 0 => {
                        let whole = self.fill - self.fill % es;
                        if whole > 0 && (self.fill == stage.len() || self.frame_left == 0) {
                            self.land(bufs, acc, &stage[..whole], es)?;
                            stage.copy_within(whole..self.fill, 0);
                            self.fill -= whole;
                        }
                    }
                    Some(_) => {}
                    None => self.got += n,
                }
            }
            if self.frame_left == 0 {
                self.in_frame = false;
                if self.got == self.total && self.fill == 0 {
                    self.done = true;
                    return Ok(true);
                }
            }
        }
    }

    pub(super) fn check_header(&self, ctx: &mut Ctx<'_>) -> Result<Header> {
        let p = self.peer;
        let Some(h) = Header::decode(&self.hdr) else {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "{}: rank {p} sent bytes that are not a Monel frame",
                    ctx.name.what()
                ),
            )
            .with_ranks(vec![p]));
        };
        match h.kind {
            FRAME_ABORT => {
                let payload = read_payload(ctx.links.link(p)?, h.len as usize);
                return Err(abort_error(p, &ctx.name.what(), &payload));
            }
            FRAME_CLOSE => {
                return Err(CclError::new(
                    ErrorKind::PeerLost,
                    format!(
                        "{}: rank {p} destroyed its communicator before taking part",
                        ctx.name.what()
                    ),
                )
                .with_ranks(vec![p]));
            }
            _ => {}
        }
        if h.sig != self.sig {
            return Err(sig_mismatch(ctx.name, &self.sig, &h.sig, p));
        }
        if h.len as usize > self.total - self.got {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "{}: rank {p} sent {} bytes where this rank expects {}",
                    ctx.name.what(),
                    h.len,
                    self.total - self.got
                ),
            )
            .with_ranks(vec![p]));
        }
        Ok(h)
    }
}
