//! Runs one rank's schedule over its links: each step's local operations, then its sends and
//! receives, all driven without blocking and in posting order per peer; sleeps in poll(2)
//! when nothing moves. Every frame carries the collective's signature, so a rank that called
//! something else is caught at the first message; an idle link is watched for a peer's abort
//! or death, so no rank waits out the timeout for a failure another rank already saw.

use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::error::{CclError, ErrorKind, Result};
use crate::frame::{FRAME_ABORT, FRAME_CLOSE, FRAME_DATA, HEADER_LEN, Header, Signature};
use crate::liveness::Liveness;
use crate::transport::Link;
use monel_sched::buffers::Buffers;
use monel_sched::plan::Algorithm;
use monel_sched::schedule::{Buf, Op, Schedule, Span};

/// Largest payload per frame: bigger messages go as several frames.
const FRAME_MAX: usize = 16 << 20;
/// Most bytes reduced straight out of a shared-memory ring before releasing them, so the
/// writer refills the ring while this side works.
const RING_PIECE: usize = 64 << 10;
/// Staging for receives that reduce: received in pieces of this size, then reduced.
const STAGE: usize = 256 << 10;

/// One rank's links, indexed by peer rank (None for itself).
pub(crate) struct Links {
    links: Vec<Option<Box<dyn Link>>>,
    /// Peers that said goodbye (destroyed their communicator).
    closed: Vec<bool>,
    /// Links with a data frame partly written.
    mid_frame: Vec<bool>,
}

impl Links {
    /// The executor's state over fresh links (`None` for this rank).
    pub(crate) fn new(links: Vec<Option<Box<dyn Link>>>) -> Self {
        let n = links.len();
        Self {
            links,
            closed: vec![false; n],
            mid_frame: vec![false; n],
        }
    }

    /// The link to `peer`, if there is one.
    pub(crate) fn get(&self, peer: usize) -> Option<&dyn Link> {
        self.links.get(peer)?.as_deref()
    }

    /// Drops every link (after an abort: the peers see the connections close).
    pub(crate) fn close_all(&mut self) {
        self.links.iter_mut().for_each(|l| *l = None);
    }

    /// Every peer's link, by rank.
    pub(crate) fn all(&self) -> impl Iterator<Item = Option<&dyn Link>> {
        self.links.iter().map(|l| l.as_deref())
    }

    /// One data frame each way with `peer`, outside a schedule, for calls too small for
    /// the executor's machinery: sends `payload` under `sig` whole, then looks for the
    /// peer's frame of the same signature and length for up to `spins` rounds, handing its
    /// payload to `land` where it lies (a ring). `None`: nothing was sent (no ring link, a
    /// frame already in progress, or no room); `Some(false)`: sent, but the peer's frame is
    /// not there (the executor receives it, with whatever else arrives first).
    pub(crate) fn exchange_whole(
        &mut self,
        peer: usize,
        sig: Signature,
        payload: &[u8],
        spins: u32,
        yield_often: bool,
        land: &mut dyn FnMut(&[u8]),
    ) -> Option<bool> {
        if *self.closed.get(peer)? || self.mid_frame[peer] {
            return None;
        }
        let link = self.links[peer].as_mut()?;
        let hdr = Header {
            kind: FRAME_DATA,
            sig,
            len: u32::try_from(payload.len()).ok()?,
        };
        if !link.write_whole(&hdr.encode(), payload).unwrap_or(false) {
            return None;
        }
        let want = HEADER_LEN + payload.len();
        let mut landed = false;
        for round in 0..spins {
            let r = link.read_in_place(want, &mut |b| {
                if b.len() < want
                    || Header::decode(b[..HEADER_LEN].try_into().expect("header")) != Some(hdr)
                {
                    return 0;
                }
                land(&b[HEADER_LEN..]);
                landed = true;
                want
            });
            match r {
                Some(Ok(_)) if landed => break,
                None | Some(Err(_)) => break,
                _ if yield_often || round % 64 == 63 => std::thread::yield_now(),
                _ => std::hint::spin_loop(),
            }
        }
        Some(landed)
    }

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
    fn next_sig(&mut self, peer: usize, bytes: usize, send: bool, buf: Buf) -> Signature {
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

/// What the executor keeps between calls, so a call allocates nothing it had before.
#[derive(Default)]
pub(crate) struct Pool {
    sends: Vec<SendSt>,
    recvs: Vec<RecvSt>,
    /// Staging for reducing receives, one per peer (one receive per peer is in flight).
    stages: Vec<Vec<u8>>,
    early: Vec<bool>,
    /// Per peer, one past the last step that sends to or receives from it (0: none).
    last: Vec<usize>,
    driven: Vec<u8>,
    armed: Vec<(usize, i32, PollFlags)>,
    /// With stable sends: the schedule's writes (step, by a receive, address range).
    writes: Vec<Write>,
    /// Per peer: stable sends went to it, so the call ends by settling its link.
    settle: Vec<bool>,
}

struct SendSt {
    peer: usize,
    sig: Signature,
    src: Span,
    total: usize,
    sent: usize,
    hdr: [u8; HEADER_LEN],
    hdr_sent: usize,
    frame_left: usize,
    in_frame: bool,
    /// Nothing writes `src` before the call ends ([`Ctx::stable_sends`]).
    stable: bool,
    done: bool,
}

struct RecvSt {
    peer: usize,
    /// The signature expected on the peer's frames.
    sig: Signature,
    dst: Span,
    /// Reduce with this operand into `dst` (`dst = acc op incoming`); copy when `None`.
    acc: Option<Span>,
    total: usize,
    got: usize,
    hdr: [u8; HEADER_LEN],
    hdr_got: usize,
    frame_left: usize,
    in_frame: bool,
    /// Bytes of this peer's stage in use for this message.
    stage_len: usize,
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

impl RecvSt {
    /// `len` bytes of the message, from byte `at`, as a span of `base`.
    fn piece(&self, base: Span, at: usize, len: usize, es: usize) -> Span {
        Span {
            buf: base.buf,
            off: base.off + at / es,
            len: len / es,
        }
    }

    /// Reduces `data` (whole elements) into the message at byte `self.got`.
    fn land(&mut self, bufs: &mut Buffers<'_>, acc: Span, data: &[u8], es: usize) -> Result<()> {
        let a = self.piece(acc, self.got, data.len(), es);
        let d = self.piece(self.dst, self.got, data.len(), es);
        bufs.land_onto(a, d, data)?;
        self.got += data.len();
        Ok(())
    }

    fn drive(
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

    fn check_header(&self, ctx: &mut Ctx<'_>) -> Result<Header> {
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

/// An abort frame's payload: read with a short bounded wait (abort frames are small and
/// sent whole).
fn read_payload(link: &mut Box<dyn Link>, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len.min(4096)];
    let mut got = 0;
    let until = Instant::now() + Duration::from_millis(200);
    while got < buf.len() && Instant::now() < until {
        match link.read_some(&mut buf[got..]) {
            Ok(0) => std::thread::sleep(Duration::from_micros(100)),
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

/// The error for a frame from rank `p` whose signature `theirs` differs from this rank's
/// `mine`: another collective, type, count, root or operation, or the same call run with
/// another algorithm.
fn sig_mismatch(name: Name<'_>, mine: &Signature, theirs: &Signature, p: usize) -> CclError {
    let message = if *theirs
        == (Signature {
            algo: theirs.algo,
            ..*mine
        }) {
        let algo = |c| Algorithm::from_code(c).map_or("no algorithm", Algorithm::name);
        format!(
            "mismatch: this rank runs {} with {} but rank {p} with {} (MONEL_ALGO or \
             set_algorithm differ between the ranks)",
            (name.describe)(mine),
            algo(mine.algo),
            algo(theirs.algo)
        )
    } else {
        format!(
            "mismatch: this rank called {} but rank {p} called {}",
            (name.describe)(mine),
            (name.describe)(theirs)
        )
    };
    CclError::new(ErrorKind::Mismatch, message).with_ranks(vec![p])
}

/// Looks at a link this step does not read from: a peer's abort, goodbye or death shows
/// here. Returns true if data for a later step waits there, or the link ended after the
/// peer's part in this call (`done_with`: what this step exchanges with it is done and no
/// later step sends to it or receives from it; a peer that finished its part and left is
/// no failure of this call, the next call sees it): do not poll it again.
fn watch_idle(ctx: &mut Ctx<'_>, peer: usize, done_with: bool) -> Result<bool> {
    let name = ctx.name;
    let link = ctx.links.link(peer)?;
    let mut b = [0u8; HEADER_LEN];
    match link.peek(&mut b) {
        Ok(n) if n < HEADER_LEN => Ok(false),
        Ok(_) => match Header::decode(&b) {
            Some(h) if h.kind == FRAME_ABORT => {
                let mut full = vec![0u8; HEADER_LEN + (h.len as usize).min(4096)];
                let n = link.peek(&mut full).unwrap_or(0);
                Err(abort_error(peer, &name.what(), &full[HEADER_LEN.min(n)..n]))
            }
            Some(h) if h.kind == FRAME_CLOSE => {
                ctx.links.closed[peer] = true;
                Ok(true)
            }
            // Data of this very call (not of a later one the peer already began): it must
            // be the call this rank runs, and one a later step of it takes. A peer on
            // another schedule would otherwise leave it waiting here until the timeout.
            // Point-to-point messages number themselves per pair, so their numbers say
            // nothing about collectives: a peer that finished this call may already send.
            Some(h) if ctx.p2p.is_none() && h.sig.coll != P2P_CODE && h.sig.seq == name.sig.seq => {
                if h.sig != name.sig {
                    Err(sig_mismatch(name, &name.sig, &h.sig, peer))
                } else if done_with {
                    Err(CclError::new(
                        ErrorKind::Mismatch,
                        format!(
                            "{}: rank {peer} sent a message that this rank's schedule does \
                             not take (the ranks run different schedules)",
                            name.what()
                        ),
                    )
                    .with_ranks(vec![peer]))
                } else {
                    Ok(true)
                }
            }
            _ => Ok(true),
        },
        Err(_) if done_with => Ok(true),
        Err(e) => Err(lost(peer, &name.what(), &e)),
    }
}

/// A send to `peer` failed because its link is gone. A rank that fails sends its reason (an
/// abort frame) before it leaves, so if one waits unread on the link, behind data this rank
/// has not taken yet, that reason is the error: the lost link would blame the messenger for
/// the rank that failed first. `skip`: unread bytes of the frame being received, before the
/// next frame starts.
fn reason_behind(ctx: &mut Ctx<'_>, peer: usize, skip: usize) -> Option<CclError> {
    if skip > SCAN_MAX {
        return None;
    }
    let what = ctx.name.what();
    let link = ctx.links.link(peer).ok()?;
    let mut buf = vec![0u8; skip + SCAN_MAX];
    let n = link.peek(&mut buf).ok()?;
    let body = abort_in(&buf[..n], skip)?;
    Some(abort_error(peer, &what, &buf[body]))
}

/// Unread bytes [`reason_behind`] looks through for an abort frame.
const SCAN_MAX: usize = 64 << 10;

/// Where the payload of the first abort frame in `bytes` lies, frames starting at `at`;
/// `None` when the frames there hold none (or stop making sense).
fn abort_in(bytes: &[u8], mut at: usize) -> Option<std::ops::Range<usize>> {
    while at + HEADER_LEN <= bytes.len() {
        let h = Header::decode(bytes[at..at + HEADER_LEN].try_into().ok()?)?;
        let body = at + HEADER_LEN;
        let end = body.checked_add(h.len as usize)?;
        if h.kind == FRAME_ABORT {
            return Some(body..end.min(bytes.len()));
        }
        at = end;
    }
    None
}

/// Waits briefly without sleeping: one pause hint (about 70 ns on recent Intel cores), and
/// every `every` rounds a yield, so a peer that shares this core runs.
fn spin_pause(round: u32, every: u32) {
    if round % every.max(1) == every.max(1) - 1 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Runs `sched` on `bufs` over `ctx`'s links.
pub(crate) fn run(
    ctx: &mut Ctx<'_>,
    sched: &Schedule,
    bufs: &mut Buffers<'_>,
    pool: &mut Pool,
) -> Result<()> {
    bufs.reserve_scratch(sched.scratch);
    let es = bufs.elem();
    let npeers = ctx.links.links.len();
    let Pool {
        sends,
        recvs,
        stages,
        early,
        last,
        driven,
        armed,
        writes,
        settle,
    } = pool;
    stages.resize_with(npeers, Vec::new);
    early.clear();
    early.resize(npeers, false);
    driven.resize(npeers, 0);
    last.clear();
    last.resize(npeers, 0);
    for (i, step) in sched.steps.iter().enumerate() {
        for op in &step.ops {
            if let Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } = *op
            {
                if let Some(l) = last.get_mut(peer) {
                    *l = i + 1;
                }
            }
        }
    }
    writes.clear();
    settle.clear();
    settle.resize(npeers, false);
    if ctx.stable_sends {
        note_writes(sched, bufs, writes)?;
    }
    for (now_at, step) in sched.steps.iter().enumerate() {
        for op in &step.ops {
            match *op {
                Op::Copy { src, dst } => bufs.copy(src, dst)?,
                Op::Reduce { src, dst } => bufs.reduce(src, dst)?,
                Op::Divide { dst } => bufs.divide(dst)?,
                _ => {}
            }
        }
        sends.clear();
        recvs.clear();
        for op in &step.ops {
            let (peer, dst, acc) = match *op {
                Op::Send { peer, src } => {
                    let stable = ctx.stable_sends && stays(writes, now_at, src, bufs)?;
                    if stable {
                        if let Some(s) = settle.get_mut(peer) {
                            *s = true;
                        }
                    }
                    sends.push(SendSt {
                        peer,
                        sig: ctx.next_sig(peer, src.len * es, true, src.buf),
                        src,
                        total: src.len * es,
                        sent: 0,
                        hdr: [0; HEADER_LEN],
                        hdr_sent: 0,
                        frame_left: 0,
                        in_frame: false,
                        stable,
                        done: false,
                    });
                    continue;
                }
                Op::Recv { peer, dst, reduce } => (peer, dst, reduce.then_some(dst)),
                Op::RecvReduce { peer, acc, dst } => (peer, dst, Some(acc)),
                _ => continue,
            };
            recvs.push(RecvSt {
                peer,
                sig: ctx.next_sig(peer, dst.len * es, false, dst.buf),
                dst,
                acc,
                total: dst.len * es,
                got: 0,
                hdr: [0; HEADER_LEN],
                hdr_got: 0,
                frame_left: 0,
                in_frame: false,
                stage_len: if acc.is_some() {
                    let len = (STAGE - STAGE % es).min(dst.len * es).max(es);
                    if stages[peer].len() < len {
                        stages[peer].resize(len, 0);
                    }
                    len
                } else {
                    0
                },
                fill: 0,
                done: false,
            });
        }
        let mut idle_since: Option<Instant> = None;
        // Since when nothing moved at all (sleeps included), for the liveness check.
        let mut stalled_since: Option<Instant> = None;
        let mut round = 0u32;
        loop {
            // One send and one receive in flight per peer, in posting order. `driven[p]`
            // ends the pass with bit 1 set if a send to p is still pending, bit 2 a receive.
            let mut progress = false;
            driven.fill(0);
            for s in sends.iter_mut().filter(|s| !s.done) {
                if driven[s.peer] & 1 != 0 {
                    continue;
                }
                progress |= match s.drive(ctx, bufs) {
                    Ok(p) => p,
                    Err(e) if e.kind == ErrorKind::PeerLost => {
                        // Where this side stands in the peer's incoming stream: the frame
                        // boundary the unread bytes start from, if any.
                        let skip = recvs.iter().find(|r| r.peer == s.peer && !r.done).map_or(
                            Some(0),
                            |r| match (r.hdr_got, r.in_frame) {
                                (0, true) => Some(r.frame_left),
                                (0, false) => Some(0),
                                _ => None,
                            },
                        );
                        return Err(skip
                            .and_then(|k| reason_behind(ctx, s.peer, k))
                            .unwrap_or(e));
                    }
                    Err(e) => return Err(e),
                };
                ctx.links.mid_frame[s.peer] = s.in_frame || s.hdr_sent > 0;
                if !s.done {
                    driven[s.peer] |= 1;
                }
            }
            for r in recvs.iter_mut().filter(|r| !r.done) {
                if driven[r.peer] & 2 != 0 {
                    continue;
                }
                progress |= r.drive(ctx, bufs, &mut stages[r.peer])?;
                if !r.done {
                    driven[r.peer] |= 2;
                }
            }
            if driven.iter().all(|&d| d == 0) {
                break;
            }
            if progress {
                idle_since = None;
                stalled_since = None;
                continue;
            }
            let now = Instant::now();
            let deadline = *ctx.deadline.get_or_insert(now + ctx.timeout);
            if now >= deadline {
                let waiting: Vec<usize> = (0..npeers).filter(|&p| driven[p] != 0).collect();
                return Err(CclError::new(
                    ErrorKind::Timeout,
                    format!(
                        "{}: Timed out waiting {} ms for ranks {waiting:?}",
                        ctx.name.what(),
                        ctx.timeout.as_millis()
                    ),
                )
                .with_ranks(waiting));
            }
            // Nothing moved: spin a while (a peer is usually a moment behind), then sleep
            // until something can move, watching the idle links too.
            let since = *idle_since.get_or_insert(now);
            let stalled = *stalled_since.get_or_insert(now);
            if ctx.liveness.as_ref().is_some_and(|l| l.due(now, stalled)) {
                let waiting: Vec<usize> = (0..npeers).filter(|&p| driven[p] != 0).collect();
                let what = ctx.name.what();
                let links = &ctx.links.links;
                let progress = |p: usize| {
                    links
                        .get(p)
                        .and_then(Option::as_ref)
                        .and_then(|l| l.path_progress())
                };
                if let Some(l) = ctx.liveness.as_mut() {
                    l.check(now, stalled, &waiting, &what, &progress)?;
                }
            }
            if now - since < ctx.spin {
                spin_pause(round, ctx.yield_every);
                round = round.wrapping_add(1);
                continue;
            }
            armed.clear();
            let mut ready = false;
            for p in 0..npeers {
                let Some(l) = ctx.links.links[p].as_mut() else {
                    continue;
                };
                let recv = driven[p] & 2 != 0;
                let idle = !recv && !early[p] && !ctx.links.closed[p];
                let write = driven[p] & 1 != 0;
                if !(recv || idle || write) {
                    continue;
                }
                match l.arm(recv || idle, write) {
                    Some(f) => armed.push((p, l.fd(), f)),
                    None if idle && !write => {
                        // Something waits on a link this step does not read: look at it.
                        early[p] = watch_idle(ctx, p, last[p] <= now_at + 1)?;
                        ready = true;
                    }
                    None => ready = true,
                }
            }
            let mut woke: Vec<usize> = Vec::new();
            if !ready {
                let fired = sleep_on(armed.iter().map(|&(_, fd, f)| (fd, f)), deadline - now);
                woke = armed
                    .iter()
                    .zip(fired)
                    .filter(|&(&(p, _, _), fired)| fired && driven[p] & 2 == 0)
                    .map(|(&(p, _, _), _)| p)
                    .collect();
            }
            for &(p, _, _) in armed.iter() {
                if let Some(l) = ctx.links.links[p].as_mut() {
                    l.disarm();
                }
            }
            // An idle link that became readable: a peer's abort, goodbye or death, or data
            // for a later step (not watched again this step).
            for p in woke {
                early[p] = watch_idle(ctx, p, last[p] <= now_at + 1)?;
            }
            idle_since = None;
        }
    }
    // The transports may still read bytes sent in place: the caller gets them back once the
    // peers have them.
    for (p, _) in settle.iter().enumerate().filter(|(_, s)| **s) {
        let deadline = *ctx
            .deadline
            .get_or_insert_with(|| Instant::now() + ctx.timeout);
        let what = ctx.name.what();
        ctx.links
            .link(p)?
            .settle(deadline)
            .map_err(|e| lost(p, &what, &e))?;
    }
    Ok(())
}

/// The byte addresses a span's bytes take.
fn span_range(b: &[u8]) -> std::ops::Range<usize> {
    let p = b.as_ptr() as usize;
    p..p + b.len()
}

/// A write of a schedule: its step, whether a receive makes it, the addresses it writes.
type Write = (usize, bool, std::ops::Range<usize>);

/// True when a send of `src` at step `now_at` may leave its bytes in place: they are not
/// scratch, and none of `writes` touches them once the step's local operations have run (its
/// sends go after them): no later step writes them, nor a receive of this step.
fn stays(writes: &[Write], now_at: usize, src: Span, bufs: &Buffers<'_>) -> Result<bool> {
    if src.buf == Buf::Scratch {
        return Ok(false);
    }
    let at = span_range(bufs.bytes(src)?);
    Ok(!writes.iter().any(|(k, by_recv, w)| {
        (*k > now_at || (*k == now_at && *by_recv)) && w.start < at.end && at.start < w.end
    }))
}

/// Collects every write of `sched` outside scratch: its step, whether a receive makes it,
/// and the addresses it writes.
fn note_writes(sched: &Schedule, bufs: &Buffers<'_>, out: &mut Vec<Write>) -> Result<()> {
    for (k, step) in sched.steps.iter().enumerate() {
        for op in &step.ops {
            let (dst, by_recv) = match *op {
                Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } => (dst, true),
                Op::Copy { dst, .. } | Op::Reduce { dst, .. } | Op::Divide { dst } => (dst, false),
                Op::Send { .. } => continue,
            };
            if dst.buf != Buf::Scratch && dst.len > 0 {
                out.push((k, by_recv, span_range(bufs.bytes(dst)?)));
            }
        }
    }
    Ok(())
}

/// Waits until the link of one of `peers` holds a point-to-point frame header at its front,
/// and returns that peer and the header; nothing is consumed. A peer whose link holds
/// something else first (a later collective's frame, its goodbye) cannot send this message
/// now and is left out; with none left the wait fails. An abort frame is its sender's
/// error, a lost link names the peer, and `deadline` ends the wait with a timeout.
pub(crate) fn wait_p2p(
    links: &mut Links,
    peers: &[usize],
    deadline: Instant,
    spin: Duration,
    what: &str,
) -> Result<(usize, Header)> {
    let started = Instant::now();
    let waits = deadline.saturating_duration_since(started).as_millis();
    let mut live: Vec<usize> = peers.to_vec();
    let mut left_out: Vec<usize> = Vec::new();
    let mut round = 0u32;
    loop {
        let mut b = [0u8; HEADER_LEN];
        let mut i = 0;
        while i < live.len() {
            let p = live[i];
            if links.closed[p] {
                left_out.push(live.remove(i));
                continue;
            }
            let link = links.link(p)?;
            let n = link.peek(&mut b).map_err(|e| lost(p, what, &e))?;
            if n < HEADER_LEN {
                i += 1;
                continue;
            }
            match Header::decode(&b) {
                None => {
                    return Err(CclError::new(
                        ErrorKind::Mismatch,
                        format!("{what}: rank {p} sent bytes that are not a Monel frame"),
                    )
                    .with_ranks(vec![p]));
                }
                Some(h) if h.kind == FRAME_ABORT => {
                    let mut full = vec![0u8; HEADER_LEN + (h.len as usize).min(4096)];
                    let n = link.peek(&mut full).unwrap_or(0);
                    return Err(abort_error(p, what, &full[HEADER_LEN.min(n)..n]));
                }
                Some(h) if h.kind == FRAME_DATA && h.sig.coll == P2P_CODE => return Ok((p, h)),
                Some(h) => {
                    if h.kind == FRAME_CLOSE {
                        links.closed[p] = true;
                    }
                    left_out.push(live.remove(i));
                }
            }
        }
        if live.is_empty() {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "{what}: ranks {left_out:?} moved on to a collective or destroyed their \
                     communicator without sending it"
                ),
            )
            .with_ranks(left_out));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(CclError::new(
                ErrorKind::Timeout,
                format!("{what}: Timed out waiting {waits} ms for ranks {live:?}"),
            )
            .with_ranks(live));
        }
        if now - started < spin {
            spin_pause(round, 64);
            round = round.wrapping_add(1);
            continue;
        }
        let mut armed: Vec<(RawFd, PollFlags)> = Vec::new();
        let mut ready = false;
        for &p in &live {
            let l = links.link(p)?;
            match l.arm(true, false) {
                Some(f) => armed.push((l.fd(), f)),
                None => ready = true,
            }
        }
        if !ready {
            sleep_on(armed.iter().copied(), deadline - now);
        }
        for &p in &live {
            links.link(p)?.disarm();
        }
    }
}

/// Sleeps until one of the armed link descriptors fires, or `left` passes (100 ms at most,
/// so the caller looks at its deadline and the idle links again); says which fired.
fn sleep_on(armed: impl Iterator<Item = (RawFd, PollFlags)>, left: Duration) -> Vec<bool> {
    // SAFETY: every descriptor belongs to a link the calling thread owns, which outlives
    // this poll call; none is closed meanwhile.
    #[allow(unsafe_code)]
    let mut fds: Vec<PollFd<'_>> = armed
        .map(|(fd, f)| PollFd::new(unsafe { BorrowedFd::borrow_raw(fd) }, f))
        .collect();
    let ms = left.as_millis().clamp(1, 100) as u16;
    let _ = poll(&mut fds, PollTimeout::from(ms));
    fds.iter()
        .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
        .collect()
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
    let until = Instant::now() + Duration::from_millis(500);
    for (slot, mid) in links.links.iter_mut().zip(&links.mid_frame) {
        if *mid {
            *slot = None;
        }
    }
    for l in links.links.iter_mut().flatten() {
        let mut at = 0;
        while at < frame.len() && Instant::now() < until {
            match l.write_some(&frame[at..]) {
                Ok(0) => std::thread::sleep(Duration::from_micros(200)),
                Ok(n) => at += n,
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let sig = Signature {
            seq: 4,
            coll: 1,
            dtype: 7,
            op: 0,
            root: 0,
            count: 3,
            algo: 1,
        };
        let mut f = Header {
            kind,
            sig,
            len: payload.len() as u32,
        }
        .encode()
        .to_vec();
        f.extend_from_slice(payload);
        f
    }

    /// Which sends of `sched`, in order, may leave their bytes in place.
    fn stable_flags(sched: &Schedule, bufs: &Buffers<'_>) -> Vec<bool> {
        let mut w = Vec::new();
        note_writes(sched, bufs, &mut w).unwrap();
        let mut out = Vec::new();
        for (k, step) in sched.steps.iter().enumerate() {
            for op in &step.ops {
                if let Op::Send { src, .. } = *op {
                    out.push(stays(&w, k, src, bufs).unwrap());
                }
            }
        }
        out
    }

    #[test]
    fn sends_stay_in_place_only_when_nothing_writes_their_bytes_before_the_call_ends() {
        use monel_sched::schedule as sch;
        use monel_sched::{DataType, RedOp};
        let (f32, sum) = (DataType::F32, RedOp::Sum);
        let mut buf = vec![0u8; 4 * 12];
        let input = vec![0u8; 4 * 12];
        // In-place ring AllReduce: the reduce-scatter half sends a chunk that the
        // all-gather half overwrites; the all-gather half sends finished chunks.
        let b = Buffers::in_place(&mut buf, 0, 0, f32, sum, 3);
        let ring = sch::allreduce_ring(3, 0, 12, false);
        assert_eq!(stable_flags(&ring, &b), [false, false, true, true]);
        // Out of place the first send reads the input, which nothing writes.
        let b = Buffers::separate(&input, &mut buf, f32, sum, 3);
        assert_eq!(stable_flags(&ring, &b), [true, false, true, true]);
        // In-place AllToAll: the block sent to a peer is where that peer's block lands, in
        // the same step.
        let a2a = sch::alltoall_direct(3, 0, 4);
        let b = Buffers::in_place(&mut buf, 0, 0, f32, sum, 3);
        assert_eq!(stable_flags(&a2a, &b), [false, false]);
        let b = Buffers::separate(&input, &mut buf, f32, sum, 3);
        assert_eq!(stable_flags(&a2a, &b), [true, true]);
        // A ring AllGather forwards blocks that are never written again.
        let ag = sch::all_gather_ring(3, 0, 4);
        let b = Buffers::separate(&input[..16], &mut buf, f32, sum, 3);
        assert_eq!(stable_flags(&ag, &b), [true, true]);
    }

    /// The reason a failed rank sent is found behind data this rank has not read, from the
    /// middle of a frame too, and turns back into the error it was.
    #[test]
    fn an_abort_waiting_behind_data_is_found_and_decoded() {
        let why = CclError::new(ErrorKind::PeerLost, "rank 0 left").with_ranks(vec![0]);
        let mut bytes = vec![7u8; 5]; // the rest of a frame being received
        bytes.extend(frame(FRAME_DATA, &[1; 12]));
        bytes.extend(frame(FRAME_CLOSE, &[]));
        bytes.extend(frame(FRAME_ABORT, &abort_payload(1, &why)));
        let body = abort_in(&bytes, 5).expect("found");
        let e = abort_error(1, "all_reduce #4", &bytes[body]);
        assert_eq!(e.kind, ErrorKind::PeerLost);
        assert_eq!(e.ranks, vec![0]);
        assert!(e.message.contains("rank 0 left"), "{e}");
        // Without the abort, or out of step with the frames, or cut short: nothing, or what
        // arrived of it.
        let data_only = frame(FRAME_DATA, &[1; 12]);
        assert_eq!(abort_in(&data_only, 0), None);
        assert_eq!(
            abort_in(&bytes, 3),
            None,
            "garbage where a header should be"
        );
        let cut = &bytes[..bytes.len() - 2];
        let body = abort_in(cut, 5).expect("found");
        assert_eq!(body.end, cut.len());
        assert_eq!(abort_in(&bytes[..20], 0), None);
    }
}
