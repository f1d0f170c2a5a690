//! Runs one rank's schedule over its links: each step's local operations, then its sends and
//! receives, all driven without blocking and in posting order per peer; sleeps in poll(2)
//! when nothing moves. Every frame carries the collective's signature, so a rank that called
//! something else is caught at the first message; an idle link is watched for a peer's abort
//! or death, so no rank waits out the timeout for a failure another rank already saw.

use std::os::fd::BorrowedFd;
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::buffers::Buffers;
use crate::error::{CclError, ErrorKind, Result};
use crate::link::{FRAME_ABORT, FRAME_CLOSE, FRAME_DATA, HEADER_LEN, Header, Link, Signature};
use crate::schedule::{Op, Schedule, Span};

/// Largest payload per frame: bigger messages go as several frames.
const FRAME_MAX: usize = 16 << 20;
/// Staging for receives that reduce: received in pieces of this size, then reduced.
const STAGE: usize = 256 << 10;

/// One rank's links, indexed by peer rank (None for itself).
pub(crate) struct Links {
    pub(crate) links: Vec<Option<Box<dyn Link>>>,
    /// Peers that said goodbye (destroyed their communicator).
    pub(crate) closed: Vec<bool>,
    /// Links with a data frame partly written.
    pub(crate) mid_frame: Vec<bool>,
}

impl Links {
    fn link(&mut self, peer: usize) -> Result<&mut Box<dyn Link>> {
        self.links
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| CclError::internal(format!("no link to rank {peer}")))
    }
}

/// What the executor needs besides the schedule and buffers.
pub(crate) struct Ctx<'a> {
    pub(crate) links: &'a mut Links,
    pub(crate) sig: Signature,
    /// Names the collective in messages (`all_reduce(sum) #4`).
    pub(crate) what: String,
    pub(crate) deadline: Instant,
    pub(crate) describe: &'a dyn Fn(&Signature) -> String,
}

struct SendSt {
    peer: usize,
    src: Span,
    total: usize,
    sent: usize,
    hdr: [u8; HEADER_LEN],
    hdr_sent: usize,
    frame_left: usize,
    in_frame: bool,
    done: bool,
}

struct RecvSt {
    peer: usize,
    dst: Span,
    reduce: bool,
    total: usize,
    got: usize,
    hdr: [u8; HEADER_LEN],
    hdr_got: usize,
    frame_left: usize,
    in_frame: bool,
    stage: Vec<u8>,
    fill: usize,
    done: bool,
}

fn lost(peer: usize, what: &str, e: &std::io::Error) -> CclError {
    CclError::new(
        ErrorKind::PeerLost,
        format!("{what}: connection to rank {peer} lost ({e}); did rank {peer} die?"),
    )
    .with_ranks(vec![peer])
}

impl SendSt {
    fn drive(&mut self, ctx: &mut Ctx<'_>, bufs: &Buffers<'_>) -> Result<bool> {
        let mut progress = false;
        let link = ctx.links.link(self.peer)?;
        loop {
            if !self.in_frame {
                if self.hdr_sent == 0 {
                    let len = (self.total - self.sent).min(FRAME_MAX);
                    self.hdr = Header {
                        kind: FRAME_DATA,
                        sig: ctx.sig,
                        len: len as u32,
                    }
                    .encode();
                    self.frame_left = len;
                }
                let n = link
                    .write_some(&self.hdr[self.hdr_sent..])
                    .map_err(|e| lost(self.peer, &ctx.what, &e))?;
                if n == 0 {
                    return Ok(progress);
                }
                progress = true;
                self.hdr_sent += n;
                if self.hdr_sent < HEADER_LEN {
                    continue;
                }
                self.hdr_sent = 0;
                self.in_frame = true;
            }
            if self.frame_left > 0 {
                let data = bufs.bytes(self.src)?;
                let n = link
                    .write_some(&data[self.sent..self.sent + self.frame_left])
                    .map_err(|e| lost(self.peer, &ctx.what, &e))?;
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

impl RecvSt {
    fn drive(&mut self, ctx: &mut Ctx<'_>, bufs: &mut Buffers<'_>) -> Result<bool> {
        let mut progress = false;
        let es = bufs.elem();
        loop {
            if !self.in_frame {
                let link = ctx.links.link(self.peer)?;
                let n = link
                    .read_some(&mut self.hdr[self.hdr_got..])
                    .map_err(|e| lost(self.peer, &ctx.what, &e))?;
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
                let link = ctx.links.link(self.peer)?;
                let n = if self.reduce {
                    let room = (self.stage.len() - self.fill).min(self.frame_left);
                    let n = link
                        .read_some(&mut self.stage[self.fill..self.fill + room])
                        .map_err(|e| lost(self.peer, &ctx.what, &e))?;
                    self.fill += n;
                    n
                } else {
                    let d = bufs.bytes_mut(self.dst)?;
                    link.read_some(&mut d[self.got..self.got + self.frame_left])
                        .map_err(|e| lost(self.peer, &ctx.what, &e))?
                };
                if n == 0 {
                    return Ok(progress);
                }
                progress = true;
                self.frame_left -= n;
                if self.reduce {
                    let whole = self.fill - self.fill % es;
                    if whole > 0 && (self.fill == self.stage.len() || self.frame_left == 0) {
                        let elems = whole / es;
                        let span = Span {
                            buf: self.dst.buf,
                            off: self.dst.off + self.got / es,
                            len: elems,
                        };
                        bufs.land(span, &self.stage[..whole], true)?;
                        self.stage.copy_within(whole..self.fill, 0);
                        self.fill -= whole;
                        self.got += whole;
                    }
                } else {
                    self.got += n;
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

    fn check_header(&self, ctx: &mut Ctx<'_>) -> Result<Header> {
        let p = self.peer;
        let Some(h) = Header::decode(&self.hdr) else {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "{}: rank {p} sent bytes that are not a Monel frame",
                    ctx.what
                ),
            )
            .with_ranks(vec![p]));
        };
        match h.kind {
            FRAME_ABORT => {
                let payload = read_payload(ctx.links.link(p)?, h.len as usize);
                return Err(abort_error(p, &ctx.what, &payload));
            }
            FRAME_CLOSE => {
                return Err(CclError::new(
                    ErrorKind::PeerLost,
                    format!(
                        "{}: rank {p} destroyed its communicator before taking part",
                        ctx.what
                    ),
                )
                .with_ranks(vec![p]));
            }
            _ => {}
        }
        if h.sig != ctx.sig {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "mismatch: this rank called {} but rank {p} called {}",
                    (ctx.describe)(&ctx.sig),
                    (ctx.describe)(&h.sig)
                ),
            )
            .with_ranks(vec![p]));
        }
        if h.len as usize > self.total - self.got {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "{}: rank {p} sent {} bytes where this rank expects {}",
                    ctx.what,
                    h.len,
                    self.total - self.got
                ),
            )
            .with_ranks(vec![p]));
        }
        Ok(h)
    }
}

/// An abort frame's payload: read with a short bounded wait (abort frames are small and
/// sent whole).
fn read_payload(link: &mut Box<dyn Link>, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len.min(4096)];
    let mut got = 0;
    let until = Instant::now() + std::time::Duration::from_millis(200);
    while got < buf.len() && Instant::now() < until {
        match link.read_some(&mut buf[got..]) {
            Ok(0) => std::thread::sleep(std::time::Duration::from_micros(100)),
            Ok(n) => got += n,
            Err(_) => break,
        }
    }
    buf.truncate(got);
    buf
}

const ABORT_KINDS: [ErrorKind; 4] = [
    ErrorKind::RemoteAbort,
    ErrorKind::Timeout,
    ErrorKind::PeerLost,
    ErrorKind::Mismatch,
];

/// An abort frame's payload: the failure's kind, the ranks it names, its message. A rank
/// that learns of a failure from a peer reports the same kind and the same culprits.
fn abort_payload(from: usize, e: &CclError) -> Vec<u8> {
    let kind = ABORT_KINDS.iter().position(|k| *k == e.kind).unwrap_or(0);
    let ranks = &e.ranks[..e.ranks.len().min(255)];
    let mut out = vec![kind as u8, ranks.len() as u8];
    for &r in ranks {
        out.extend((r as u32).to_le_bytes());
    }
    out.extend(format!("rank {from} gave up: {e}").as_bytes());
    out
}

fn abort_error(peer: usize, what: &str, payload: &[u8]) -> CclError {
    let kind = payload
        .first()
        .and_then(|&k| ABORT_KINDS.get(usize::from(k)))
        .cloned()
        .unwrap_or(ErrorKind::RemoteAbort);
    let n = payload.get(1).map_or(0, |&n| usize::from(n));
    let ranks: Vec<usize> = payload
        .get(2..2 + 4 * n)
        .map(|b| {
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4")) as usize)
                .collect()
        })
        .unwrap_or_default();
    let text = payload.get(2 + 4 * n..).unwrap_or_default();
    let ranks = if ranks.is_empty() { vec![peer] } else { ranks };
    CclError::new(kind, format!("{what}: {}", String::from_utf8_lossy(text))).with_ranks(ranks)
}

/// True if `peer`'s link holds, unread, an abort frame from collective `seq`: that rank
/// reached the collective and gave up (it may be gone by now).
pub(crate) fn gave_up_in(links: &Links, peer: usize, seq: u64) -> bool {
    let mut b = [0u8; HEADER_LEN];
    links
        .links
        .get(peer)
        .and_then(Option::as_ref)
        .is_some_and(|l| {
            matches!(l.peek(&mut b), Ok(HEADER_LEN))
                && Header::decode(&b).is_some_and(|h| h.kind == FRAME_ABORT && h.sig.seq == seq)
        })
}

/// Looks at a link this step does not read from: a peer's abort, goodbye or death shows
/// here. Returns true if data for a later step waits there (do not poll it again).
fn watch_idle(ctx: &mut Ctx<'_>, peer: usize) -> Result<bool> {
    let what = ctx.what.clone();
    let link = ctx.links.link(peer)?;
    let mut b = [0u8; HEADER_LEN];
    match link.peek(&mut b) {
        Ok(n) if n < HEADER_LEN => Ok(false),
        Ok(_) => match Header::decode(&b) {
            Some(h) if h.kind == FRAME_ABORT => {
                let mut full = vec![0u8; HEADER_LEN + (h.len as usize).min(4096)];
                let n = link.peek(&mut full).unwrap_or(0);
                Err(abort_error(peer, &what, &full[HEADER_LEN.min(n)..n]))
            }
            Some(h) if h.kind == FRAME_CLOSE => {
                ctx.links.closed[peer] = true;
                Ok(true)
            }
            _ => Ok(true),
        },
        Err(e) => Err(lost(peer, &what, &e)),
    }
}

/// Runs `sched` on `bufs` over `ctx`'s links.
pub(crate) fn run(ctx: &mut Ctx<'_>, sched: &Schedule, bufs: &mut Buffers<'_>) -> Result<()> {
    bufs.reserve_scratch(sched.scratch);
    let es = bufs.elem();
    let npeers = ctx.links.links.len();
    for step in &sched.steps {
        for op in &step.ops {
            match *op {
                Op::Copy { src, dst } => bufs.copy(src, dst)?,
                Op::Reduce { src, dst } => bufs.reduce(src, dst)?,
                Op::Divide { dst } => bufs.divide(dst)?,
                _ => {}
            }
        }
        let mut sends: Vec<SendSt> = Vec::new();
        let mut recvs: Vec<RecvSt> = Vec::new();
        for op in &step.ops {
            match *op {
                Op::Send { peer, src } => sends.push(SendSt {
                    peer,
                    src,
                    total: src.len * es,
                    sent: 0,
                    hdr: [0; HEADER_LEN],
                    hdr_sent: 0,
                    frame_left: 0,
                    in_frame: false,
                    done: false,
                }),
                Op::Recv { peer, dst, reduce } => recvs.push(RecvSt {
                    peer,
                    dst,
                    reduce,
                    total: dst.len * es,
                    got: 0,
                    hdr: [0; HEADER_LEN],
                    hdr_got: 0,
                    frame_left: 0,
                    in_frame: false,
                    stage: if reduce {
                        vec![0u8; (STAGE - STAGE % es).min(dst.len * es).max(es)]
                    } else {
                        Vec::new()
                    },
                    fill: 0,
                    done: false,
                }),
                _ => {}
            }
        }
        let mut early = vec![false; npeers];
        loop {
            let mut progress = false;
            let mut busy_send = vec![false; npeers];
            for s in sends.iter_mut().filter(|s| !s.done) {
                if busy_send[s.peer] {
                    continue;
                }
                busy_send[s.peer] = true;
                progress |= s.drive(ctx, bufs)?;
                ctx.links.mid_frame[s.peer] = s.in_frame || s.hdr_sent > 0;
            }
            let mut busy_recv = vec![false; npeers];
            for r in recvs.iter_mut().filter(|r| !r.done) {
                if busy_recv[r.peer] {
                    continue;
                }
                busy_recv[r.peer] = true;
                progress |= r.drive(ctx, bufs)?;
            }
            let pending_send: Vec<usize> =
                sends.iter().filter(|s| !s.done).map(|s| s.peer).collect();
            let pending_recv: Vec<usize> =
                recvs.iter().filter(|r| !r.done).map(|r| r.peer).collect();
            if pending_send.is_empty() && pending_recv.is_empty() {
                break;
            }
            if progress {
                continue;
            }
            // Nothing moved: sleep until something can, watching the idle links too.
            let now = Instant::now();
            if now >= ctx.deadline {
                let mut waiting = pending_recv;
                waiting.extend(&pending_send);
                return Err(CclError::new(
                    ErrorKind::Timeout,
                    format!("{}: timed out waiting for ranks {waiting:?}", ctx.what),
                )
                .with_ranks(waiting));
            }
            let mut want: Vec<(usize, i32, PollFlags)> = Vec::new();
            for (p, &early) in early.iter().enumerate() {
                let Some(l) = ctx.links.links[p].as_ref() else {
                    continue;
                };
                let mut f = PollFlags::empty();
                if pending_recv.contains(&p) || (!early && !ctx.links.closed[p]) {
                    f |= PollFlags::POLLIN;
                }
                if pending_send.contains(&p) {
                    f |= PollFlags::POLLOUT;
                }
                if !f.is_empty() {
                    want.push((p, l.fd(), f));
                }
            }
            // SAFETY: every descriptor belongs to a link in `ctx.links`, which outlives
            // this poll call; none is closed meanwhile (this thread owns the links).
            #[allow(unsafe_code)]
            let mut fds: Vec<PollFd<'_>> = want
                .iter()
                .map(|&(_, fd, f)| PollFd::new(unsafe { BorrowedFd::borrow_raw(fd) }, f))
                .collect();
            let ms = (ctx.deadline - now).as_millis().clamp(1, 100) as u16;
            let _ = poll(&mut fds, PollTimeout::from(ms));
            // An idle link that became readable: a peer's abort, goodbye or death, or data
            // for a later step (not watched again this step).
            let ready: Vec<usize> = want
                .iter()
                .zip(&fds)
                .filter(|((p, _, _), f)| {
                    !pending_recv.contains(p) && f.revents().is_some_and(|r| !r.is_empty())
                })
                .map(|((p, _, _), _)| *p)
                .collect();
            for p in ready {
                early[p] = watch_idle(ctx, p)?;
            }
        }
    }
    Ok(())
}

/// Tells every peer that rank `from` gave up, and why (an abort frame; see
/// [`write_all_bounded`] for links caught mid-frame).
pub(crate) fn send_abort(links: &mut Links, sig: Signature, from: usize, e: &CclError) {
    let payload = abort_payload(from, e);
    let h = Header {
        kind: FRAME_ABORT,
        sig,
        len: payload.len() as u32,
    }
    .encode();
    let mut frame = h.to_vec();
    frame.extend_from_slice(&payload);
    write_all_bounded(links, &frame);
}

/// Says goodbye to every peer.
pub(crate) fn send_close(links: &mut Links, sig: Signature) {
    let h = Header {
        kind: FRAME_CLOSE,
        sig,
        len: 0,
    }
    .encode();
    write_all_bounded(links, &h);
}

/// Writes a control frame to every link between frames. A link caught in the middle of a
/// data frame (the call failed while sending) is closed instead, so the peer sees the
/// connection end rather than a frame inside another.
fn write_all_bounded(links: &mut Links, frame: &[u8]) {
    let until = Instant::now() + std::time::Duration::from_millis(500);
    for (slot, mid) in links.links.iter_mut().zip(&links.mid_frame) {
        if *mid {
            *slot = None;
        }
    }
    for l in links.links.iter_mut().flatten() {
        let mut at = 0;
        while at < frame.len() && Instant::now() < until {
            match l.write_some(&frame[at..]) {
                Ok(0) => std::thread::sleep(std::time::Duration::from_micros(200)),
                Ok(n) => at += n,
                Err(_) => break,
            }
        }
    }
}
