//! One send of a schedule step in flight: its frame headers and payload, written without
//! blocking, in frames of at most `FRAME_MAX` bytes.

use crate::error::Result;
use crate::frame::{FRAME_DATA, HEADER_LEN, Header, Signature};
use monel_sched::buffers::Buffers;
use monel_sched::schedule::Span;

use super::FRAME_MAX;
use super::ctx::{Ctx, lost};

pub(super) struct SendSt {
    pub(super) peer: usize,
    pub(super) sig: Signature,
    pub(super) src: Span,
    pub(super) total: usize,
    pub(super) sent: usize,
    pub(super) hdr: [u8; HEADER_LEN],
    pub(super) hdr_sent: usize,
    pub(super) frame_left: usize,
    pub(super) in_frame: bool,
    /// Nothing writes `src` before the call ends ([`Ctx::stable_sends`]).
    pub(super) stable: bool,
    pub(super) done: bool,
}

impl SendSt {
    pub(super) fn drive(&mut self, ctx: &mut Ctx<'_>, bufs: &Buffers<'_>) -> Result<bool> {
        let mut progress = false;
        let link = ctx.links.link(self.peer)?;
        loop {
            if !self.in_frame {
                if self.hdr_sent == 0 {
                    let len = (self.total - self.sent).min(FRAME_MAX);
                    self.hdr = Header {
                        kind: FRAME_DATA,
                        sig: self.sig,
                        len: len as u32,
                    }
                    .encode();
                    self.frame_left = len;
                }
                // The header and as much of the payload as fits, in one go.
                let data = bufs.bytes(self.src)?;
                let (hdr, body) = (
                    &self.hdr[self.hdr_sent..],
                    &data[self.sent..self.sent + self.frame_left],
                );
                let n = if self.stable {
                    link.write_two_stable(hdr, body)
                } else {
                    link.write_two(hdr, body)
                }
                .map_err(|e| lost(self.peer, &ctx.name.what(), &e))?;
                if n == 0 {
                    return Ok(progress);
                }
                progress = true;
                let h = n.min(HEADER_LEN - self.hdr_sent);
                self.hdr_sent += h;
                self.sent += n - h;
                self.frame_left -= n - h;
                if self.hdr_sent < HEADER_LEN {
                    continue;
                }
                self.hdr_sent = 0;
                self.in_frame = true;
            }
            if self.frame_left > 0 {
                let data = bufs.bytes(self.src)?;
                let body = &data[self.sent..self.sent + self.frame_left];
                let n = if self.stable {
                    link.write_two_stable(&[], body)
                } else {
                    link.write_some(body)
                }
                .map_err(|e| lost(self.peer, &ctx.name.what(), &e))?;
                if n == 0 {
                    return Ok(progress);
                }
                progress = true;
                self.sent += n;
                self.frame_left -= n;
            }
            if self.frame_left == 0 {
                self.in_frame = false;
                if self.sent == self.total {
                    self.done = true;
                    return Ok(true);
                }
            }
        }
    }
}
