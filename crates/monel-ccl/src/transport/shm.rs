//! Shared-memory links between two ranks on one host: a pair of single-producer,
//! single-consumer byte rings in one mapped segment (one ring per direction), so a message
//! costs one copy into the ring and one copy (or reduction) out of it, and the ring is small
//! enough to stay in cache while both sides stream through it.
//!
//! The pair's TCP connection stays open beside the segment, carrying no data: it is the
//! doorbell (one byte wakes a peer that went to sleep in poll) and the liveness signal (a
//! peer that exits closes it, so a rank waiting on a dead peer's ring finds out at once).
//!
//! Setup ([`upgrade`], in the messages of [`super::handshake`]): the lower rank creates the
//! segment in `/dev/shm` ([`super::segment`]), writes a random nonce into it and offers its
//! name and the nonce over TCP; the higher rank opens that name in its own directory, maps
//! it and accepts only if it is a private file of this user holding the same nonce (proof
//! that both really share the memory), and the creator then unlinks the file, so nothing
//! outlives the two processes.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use nix::poll::PollFlags;

use super::segment::{Segment, create_sized, open_named};
use super::{Link, Setup};
use monel_copy::{Adaptive, Costs, STREAM_MIN, copy};
use monel_peer::channel::{Channel, bound_reads, first_text};
use monel_sched::tune::TransportKind;

const PAGE: usize = 4096;
/// Most bytes copied before the other side is told (so it can start on them).
const PIECE: usize = 64 << 10;
/// Default ring size per direction.
pub(crate) const DEFAULT_RING: usize = 1 << 20;

/// One cache line holding one counter.
#[repr(C, align(64))]
struct Line(AtomicU64);

/// A ring's shared control block: positions count bytes since the start and only grow.
#[repr(C)]
struct Ctrl {
    /// Bytes the writer has published.
    head: Line,
    /// Bytes the reader has consumed.
    tail: Line,
    /// The reader is (about to be) asleep: the writer rings after publishing.
    reader_waiting: Line,
    /// The writer is (about to be) asleep for room: the reader rings after consuming.
    writer_waiting: Line,
    /// The reader's cost of reading the ring's bytes, by how they were written (f64 bits
    /// of [`Costs`]), for the writer's choice of stores.
    read_costs: CostLine,
    /// How the bytes in each of [`SLOTS`] equal parts of the ring were last written (0:
    /// plain stores, 1: streaming), so the reader knows what it measured.
    ways: Ways,
}

// The control block fits the page the layout gives it.
const _: () = assert!(size_of::<Ctrl>() <= PAGE);

/// The ring is cut into this many parts to tag how each was written.
const SLOTS: usize = 64;

/// Two f64 costs on their own cache line.
#[repr(C, align(64))]
struct CostLine([AtomicU64; 2]);

/// The way each ring part was written.
#[repr(C, align(64))]
struct Ways([AtomicU8; SLOTS]);

/// Segment layout for ring capacity `cap`: a header page (nonce), then per direction a
/// control page and `cap` bytes of data.
fn layout(cap: usize) -> (usize, [usize; 2], [usize; 2]) {
    let ctrl = [PAGE, 2 * PAGE + cap];
    let data = [2 * PAGE, 3 * PAGE + cap];
    (3 * PAGE + 2 * cap, ctrl, data)
}

/// One direction of the pair.
struct Ring {
    ctrl: NonNull<Ctrl>,
    data: NonNull<u8>,
    cap: usize,
    /// This side's copy of its own position (head when writing, tail when reading).
    pos: u64,
    /// The other side's position as last read (the writer's view of `tail`): rereading
    /// it only when it seems short of room keeps the two sides off each other's cache lines.
    seen: u64,
}

impl Ring {
    fn new(seg: &Segment, ctrl_off: usize, data_off: usize, cap: usize) -> Self {
        let at = |off: usize| {
            assert!(off < seg.len, "offset inside the segment");
            // SAFETY: `off` is inside the mapping (asserted), so the pointer is in bounds
            // and non-null.
            #[allow(unsafe_code)]
            unsafe {
                NonNull::new_unchecked(seg.ptr.as_ptr().add(off))
            }
        };
        Self {
            ctrl: at(ctrl_off).cast(),
            data: at(data_off),
            cap,
            pos: 0,
            seen: 0,
        }
    }

    fn ctrl(&self) -> &Ctrl {
        // SAFETY: the control block is page-aligned inside the live mapping (owned by the
        // same link) and holds only atomics, which are valid for any bit pattern and may be
        // shared across processes.
        #[allow(unsafe_code)]
        unsafe {
            self.ctrl.as_ref()
        }
    }

    /// The other side's position, checked: a peer that corrupts it is an error, not a
    /// wild read.
    fn published(&self, other: &AtomicU64, writer: bool) -> io::Result<u64> {
        let v = other.load(Ordering::Acquire);
        let ok = if writer {
            // We read: head must be within [tail, tail + cap].
            v >= self.pos && v - self.pos <= self.cap as u64
        } else {
            // We write: tail must be within [head - cap, head].
            v <= self.pos && self.pos - v <= self.cap as u64
        };
        if ok {
            Ok(v)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared-memory ring positions are corrupt",
            ))
        }
    }

    /// The ring's `len` data bytes from offset `off`, to write.
    #[allow(clippy::mut_from_ref)]
    fn area_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.cap, "inside the ring");
        // SAFETY: `off..off + len` lies inside the ring's `cap` data bytes (asserted). The
        // writer only asks for free space (the reader consumed it and will not touch it
        // until `head` is published), and one link side at a time holds it.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.data.as_ptr().add(off), len)
        }
    }

    /// The ring's `len` data bytes from offset `off`, to read.
    fn area(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.cap, "inside the ring");
        // SAFETY: inside the data bytes (asserted); the reader only asks for published
        // bytes (below `head`), which the writer does not reuse until `tail` moves past them.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.data.as_ptr().add(off), len)
        }
    }

    /// Copies `src` into the ring at byte position `at` (wrapping), the way `how` finds
    /// fastest for bytes the other core reads next.
    fn put(&self, at: u64, src: &[u8], how: &mut Adaptive) {
        let off = (at % self.cap as u64) as usize;
        let first = src.len().min(self.cap - off);
        if src.len() < STREAM_MIN {
            // Small: plain stores, untimed and untagged (the reader times bulk reads only).
            copy(self.area_mut(off, first), &src[..first]);
            copy(self.area_mut(0, src.len() - first), &src[first..]);
            return;
        }
        let reader = self.read_costs();
        let way = how.copy(self.area_mut(off, first), &src[..first], reader);
        self.tag(off, first, way);
        let way = how.copy(self.area_mut(0, src.len() - first), &src[first..], reader);
        self.tag(0, src.len() - first, way);
    }

    /// The reader's published costs (a peer's garbage only sways the choice of stores).
    fn read_costs(&self) -> Costs {
        let c = &self.ctrl().read_costs.0;
        Costs([0, 1].map(|w| f64::from_bits(c[w].load(Ordering::Relaxed))))
    }

    /// Records how the ring bytes `off..off + len` were written (before `head` publishes
    /// them, so the reader sees the tag with the bytes).
    fn tag(&self, off: usize, len: usize, way: usize) {
        if len == 0 {
            return;
        }
        let slot = |o: usize| o * SLOTS / self.cap;
        for t in &self.ctrl().ways.0[slot(off)..=slot(off + len - 1)] {
            t.store(way as u8, Ordering::Relaxed);
        }
    }

    /// How the ring byte at offset `off` was written.
    fn way_at(&self, off: usize) -> usize {
        usize::from(self.ctrl().ways.0[off * SLOTS / self.cap].load(Ordering::Relaxed) & 1)
    }

    /// Copies from the ring at byte position `at` (wrapping) into `dst`.
    fn get(&self, at: u64, dst: &mut [u8]) {
        let off = (at % self.cap as u64) as usize;
        let first = dst.len().min(self.cap - off);
        let n = dst.len();
        copy(&mut dst[..first], self.area(off, first));
        copy(&mut dst[first..], self.area(0, n - first));
    }

    /// Asks for the cache lines where the next bytes will land, while nothing is there: the
    /// writer's stores take them away again, and the next look fetches them alongside
    /// `head`, instead of after it (one wait for another core's lines per message, not two).
    fn prefetch_next(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let off = (self.pos % self.cap as u64) as usize;
            for k in [0, 64] {
                let at = (off + k) % self.cap;
                let p = self.data.as_ptr().wrapping_add(at).cast::<i8>();
                // SAFETY: a prefetch is a hint that reads nothing into the program and
                // cannot fault (the address lies inside the ring's data bytes anyway, as
                // `at < cap`); SSE is part of x86-64.
                #[allow(unsafe_code)]
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(p);
                }
            }
        }
    }

    /// The published bytes from `pos` up to the wrap point, in place.
    fn contiguous(&self, len: usize) -> &[u8] {
        let off = (self.pos % self.cap as u64) as usize;
        let n = len.min(self.cap - off);
        // SAFETY: `off..off + n` is inside the data area and published (below `head`); the
        // writer does not touch it until this side advances `tail`, which needs `&mut self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.data.as_ptr().add(off), n)
        }
    }
}

/// A link over shared memory (see the module docs).
pub(crate) struct ShmLink {
    /// Kept for its lifetime: the rings point into it.
    _seg: Segment,
    tx: Ring,
    rx: Ring,
    sock: TcpStream,
    peer_gone: bool,
    /// How this side writes its ring (plain or streaming stores, by measured speed).
    stores: Adaptive,
    /// What reading the incoming ring costs this side, by how its bytes were written.
    reads: Costs,
}

// SAFETY: the link owns its mapping and the rings point only into it; the ring protocol
// (atomic positions, data touched only in this side's half) holds whichever thread owns the
// link, and `&mut self` keeps one thread at a time.
#[allow(unsafe_code)]
unsafe impl Send for ShmLink {}

fn gone() -> io::Error {
    io::ErrorKind::UnexpectedEof.into()
}

impl ShmLink {
    fn new(seg: Segment, cap: usize, creator: bool, sock: TcpStream) -> io::Result<Self> {
        let (_, ctrl, data) = layout(cap);
        let (t, r) = if creator { (0, 1) } else { (1, 0) };
        let tx = Ring::new(&seg, ctrl[t], data[t], cap);
        let rx = Ring::new(&seg, ctrl[r], data[r], cap);
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        Ok(Self {
            _seg: seg,
            tx,
            rx,
            sock,
            peer_gone: false,
            stores: Adaptive::default(),
            reads: Costs::default(),
        })
    }

    fn ring_doorbell(&self) {
        // A full socket buffer already holds a wake-up; any other failure shows up as the
        // peer's end of the connection closing.
        let _ = (&self.sock).write(&[1]);
    }

    /// Readable bytes, checked.
    fn avail(&self) -> io::Result<usize> {
        let head = self.rx.published(&self.rx.ctrl().head.0, true)?;
        Ok((head - self.rx.pos) as usize)
    }

    /// Free room, checked; rereads the reader's position only when `want` does not fit.
    fn room(&mut self, want: usize) -> io::Result<usize> {
        let free = self.tx.cap - (self.tx.pos - self.tx.seen) as usize;
        if free >= want {
            return Ok(free);
        }
        self.tx.seen = self.tx.published(&self.tx.ctrl().tail.0, false)?;
        Ok(self.tx.cap - (self.tx.pos - self.tx.seen) as usize)
    }

    /// Releases `n` read bytes ([`Self::readable`]'s or copied out) to the writer.
    pub(crate) fn consume(&mut self, n: usize) {
        if n == 0 {
            // Nothing to release: leave the writer's line alone (a polling reader would
            // otherwise store to it on every look).
            return;
        }
        self.rx.pos += n as u64;
        let c = self.rx.ctrl();
        c.tail.0.store(self.rx.pos, Ordering::SeqCst);
        if c.writer_waiting.0.load(Ordering::SeqCst) != 0
            && c.writer_waiting.0.swap(0, Ordering::SeqCst) != 0
        {
            self.ring_doorbell();
        }
    }

    /// Starts timing a read of `n` bytes (only bulk reads are timed).
    fn read_clock(&self, n: usize) -> Option<Instant> {
        (n >= STREAM_MIN).then(Instant::now)
    }

    /// Ends timing a read of the `n` bytes from the ring position, and publishes what it
    /// cost, by how the bytes were written, for the writer's choice.
    fn read_timed(&mut self, t: Option<Instant>, n: usize) {
        let Some(t) = t.filter(|_| n >= STREAM_MIN) else {
            return;
        };
        let way = self.rx.way_at((self.rx.pos % self.rx.cap as u64) as usize);
        self.reads.add(way, n, t.elapsed().as_nanos());
        let c = &self.rx.ctrl().read_costs.0;
        c[way].store(self.reads.0[way].to_bits(), Ordering::Relaxed);
    }

    /// The readable bytes up to the ring's wrap point, to use in place (reduce straight out
    /// of the ring); [`Self::consume`] releases them. Empty when nothing is there;
    /// `Err(UnexpectedEof)` once the peer is gone and the ring is drained.
    pub(crate) fn readable(&mut self) -> io::Result<&[u8]> {
        let n = self.avail()?;
        if n == 0 && self.peer_gone {
            return Err(gone());
        }
        Ok(self.rx.contiguous(n))
    }
}

impl Link for ShmLink {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn write_some(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_two(data, &[])
    }

    fn write_two(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        if self.peer_gone {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let total = a.len() + b.len();
        let mut done = 0;
        while done < total {
            let want = (total - done).min(PIECE);
            let n = self.room(want)?.min(want);
            if n == 0 {
                break;
            }
            // n bytes of a ++ b, from offset `done`.
            let (mut at, mut left, mut off) = (self.tx.pos, n, done);
            for part in [a, b] {
                if off >= part.len() {
                    off -= part.len();
                    continue;
                }
                let k = (part.len() - off).min(left);
                self.tx.put(at, &part[off..off + k], &mut self.stores);
                at += k as u64;
                left -= k;
                off = 0;
                if left == 0 {
                    break;
                }
            }
            self.tx.pos += n as u64;
            let c = self.tx.ctrl();
            c.head.0.store(self.tx.pos, Ordering::SeqCst);
            if c.reader_waiting.0.load(Ordering::SeqCst) != 0
                && c.reader_waiting.0.swap(0, Ordering::SeqCst) != 0
            {
                self.ring_doorbell();
            }
            done += n;
        }
        Ok(done)
    }

    fn write_whole(&mut self, a: &[u8], b: &[u8]) -> io::Result<bool> {
        let total = a.len() + b.len();
        if self.peer_gone || total > PIECE || self.room(total)? < total {
            return Ok(false);
        }
        Ok(self.write_two(a, b)? == total)
    }

    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.avail()?.min(buf.len() - done).min(PIECE);
            if n == 0 {
                break;
            }
            let t = self.read_clock(n);
            self.rx.get(self.rx.pos, &mut buf[done..done + n]);
            self.read_timed(t, n);
            self.consume(n);
            done += n;
        }
        if done == 0 && !buf.is_empty() && self.peer_gone {
            return Err(gone());
        }
        Ok(done)
    }

    fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.avail()?.min(buf.len());
        if n == 0 && self.peer_gone {
            return Err(gone());
        }
        self.rx.get(self.rx.pos, &mut buf[..n]);
        Ok(n)
    }

    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn counters(&self) -> Option<String> {
        let (own, reader) = (self.stores.own(), self.tx.read_costs());
        let way = ["plain", "streaming"][self.stores.favoured(reader)];
        Some(format!(
            "ring writes {way} (ns/KiB plain/streaming: writing {:.0}/{:.0}, the peer reading \
             {:.0}/{:.0})",
            own.0[0], own.0[1], reader.0[0], reader.0[1]
        ))
    }

    fn arm(&mut self, read: bool, write: bool) -> Option<PollFlags> {
        if self.peer_gone {
            return None;
        }
        let mut ready = false;
        if read {
            self.rx.ctrl().reader_waiting.0.store(1, Ordering::SeqCst);
            ready |= !matches!(self.avail(), Ok(0));
        }
        if write {
            self.tx.ctrl().writer_waiting.0.store(1, Ordering::SeqCst);
            ready |= !matches!(self.room(1), Ok(0));
        }
        if ready {
            self.disarm();
            return None;
        }
        Some(PollFlags::POLLIN)
    }

    fn disarm(&mut self) {
        self.rx.ctrl().reader_waiting.0.store(0, Ordering::SeqCst);
        self.tx.ctrl().writer_waiting.0.store(0, Ordering::SeqCst);
        let mut b = [0u8; 64];
        loop {
            match self.sock.read(&mut b) {
                Ok(0) => {
                    self.peer_gone = true;
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.peer_gone = true;
                    return;
                }
            }
        }
    }

    fn read_in_place(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Option<io::Result<usize>> {
        self.rx.prefetch_next();
        let n = match self.readable() {
            Ok(avail) => avail.len().min(max),
            Err(e) => return Some(Err(e)),
        };
        if n == 0 {
            return Some(Ok(0));
        }
        let t = self.read_clock(n);
        let used = f(self.rx.contiguous(n)).min(n);
        self.read_timed(t, used);
        self.consume(used);
        Some(Ok(used))
    }
}

/// What shared memory this rank offers or accepts.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// Shared memory allowed at all.
    pub enabled: bool,
    /// Ring bytes per direction (a power of two).
    pub ring: usize,
    /// Where segments are created (`/dev/shm`).
    pub dir: PathBuf,
    /// This rank's host identity: ranks that name different hosts never share memory, even
    /// when they could (`MONEL_HOST`; lets one machine stand in for several).
    pub host: Option<String>,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ring: DEFAULT_RING,
            dir: PathBuf::from("/dev/shm"),
            host: None,
        }
    }
}

const OFFER: u8 = 1;
const NO_OFFER: u8 = 0;
const ACCEPT: u8 = 1;
const DECLINE: u8 = 0;

/// A segment this rank created and offered.
struct Offered {
    name: String,
    path: PathBuf,
    seg: Segment,
    nonce: [u8; 16],
}

fn create(dir: &Path, cap: usize) -> io::Result<Offered> {
    let (len, _, _) = layout(cap);
    let (name, path, seg, nonce) = create_sized(dir, len)?;
    Ok(Offered {
        name,
        path,
        seg,
        nonce,
    })
}

/// Maps the segment a peer offered and checks its nonce.
fn open(dir: &Path, name: &[u8], cap: usize, nonce: &[u8]) -> Result<Segment, String> {
    open_named(dir, name, layout(cap).0, nonce)
}

/// How a shared-memory link describes itself in the path log.
fn shm_detail(cfg: &ShmConfig) -> String {
    format!(
        "(same host: {} KiB rings in {})",
        cfg.ring.next_power_of_two() >> 10,
        cfg.dir.display()
    )
}

/// Tries to turn each TCP connection into a shared-memory link. Every pair runs the same
/// handshake (the lower rank offers, the higher accepts or declines with a reason), so both
/// ends always agree on the transport. Blocking, bounded by `deadline`.
pub(crate) fn upgrade(
    streams: Vec<Option<Channel>>,
    rank: usize,
    cfg: &ShmConfig,
    deadline: Instant,
) -> io::Result<Vec<Option<Setup<ShmLink>>>> {
    let n = streams.len();
    let mut streams = streams;
    bound_reads(&mut streams, deadline)?;
    let host = cfg.host.clone().unwrap_or_default();
    let cap = cfg.ring.next_power_of_two().max(PAGE);
    // Offers to every higher rank first (small writes: never block), then answers to every
    // lower rank's offer, then the higher ranks' answers: no pair waits on another.
    let mut offered: Vec<Option<Result<Offered, String>>> = (0..n).map(|_| None).collect();
    for (j, s) in streams.iter_mut().enumerate().skip(rank + 1) {
        let Some(s) = s else { continue };
        let o = if cfg.enabled {
            create(&cfg.dir, cap).map_err(|e| {
                format!(
                    "cannot create a segment in {} ({e}); is /dev/shm mounted and big enough?",
                    cfg.dir.display()
                )
            })
        } else {
            Err("shared memory disabled on this rank (MONEL_TRANSPORT)".into())
        };
        match &o {
            Ok(o) => s.send(
                OFFER,
                &[
                    o.name.as_bytes(),
                    &o.nonce,
                    &(cap as u64).to_le_bytes(),
                    host.as_bytes(),
                ],
            )?,
            Err(why) => s.send(NO_OFFER, &[why.as_bytes()])?,
        }
        offered[j] = Some(o);
    }
    let mut out: Vec<Option<Setup<ShmLink>>> = (0..n).map(|_| None).collect();
    for (j, slot) in streams.iter_mut().enumerate().take(rank) {
        let Some(mut s) = slot.take() else { continue };
        let (kind, f) = s.recv()?;
        let verdict: Result<(Segment, usize), String> = if kind != OFFER {
            Err(format!("rank {j} offered none: {}", first_text(&f)))
        } else if f.len() < 4 {
            Err("malformed offer".into())
        } else if !cfg.enabled {
            Err("shared memory disabled on this rank (MONEL_TRANSPORT)".into())
        } else if f[3] != host.as_bytes() {
            Err(format!(
                "different hosts (MONEL_HOST {:?} vs {:?})",
                String::from_utf8_lossy(&f[3]),
                host
            ))
        } else {
            let peer_cap = f[2]
                .get(..8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8")) as usize);
            if !peer_cap.is_power_of_two() || !(PAGE..=1 << 30).contains(&peer_cap) {
                Err(format!("offered ring of {peer_cap} bytes"))
            } else {
                open(&cfg.dir, &f[0], peer_cap, &f[1]).map(|seg| (seg, peer_cap))
            }
        };
        match verdict {
            Ok((seg, c)) => {
                s.send(ACCEPT, &[])?;
                s.s.set_read_timeout(None)?;
                out[j] = Some(Setup::Up(
                    ShmLink::new(seg, c, false, s.s)?,
                    shm_detail(cfg),
                ));
            }
            Err(why) => {
                s.send(DECLINE, &[why.as_bytes()])?;
                s.s.set_read_timeout(None)?;
                out[j] = Some(Setup::Declined(s, why));
            }
        }
    }
    for (j, slot) in streams.iter_mut().enumerate().skip(rank + 1) {
        let Some(mut s) = slot.take() else { continue };
        let reply = s.recv();
        let o = offered[j].take().expect("offered to every higher rank");
        if let Ok(o) = &o {
            let _ = std::fs::remove_file(&o.path);
        }
        let (kind, f) = reply?;
        s.s.set_read_timeout(None)?;
        out[j] = Some(match (o, kind) {
            (Ok(o), ACCEPT) => Setup::Up(ShmLink::new(o.seg, cap, true, s.s)?, shm_detail(cfg)),
            (Ok(_), _) => Setup::Declined(
                s,
                format!("rank {j} declined shared memory: {}", first_text(&f)),
            ),
            (Err(why), _) => Setup::Declined(s, why),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    fn channel_pair() -> (Channel, Channel) {
        monel_peer::channel::loopback_pair(&monel_peer::Key::from_secret(b"link")).unwrap()
    }
    use super::*;
    use std::time::Duration;

    fn pair(cap: usize) -> (ShmLink, ShmLink) {
        let (a, b) = channel_pair();
        let cfg = ShmConfig {
            ring: cap,
            ..ShmConfig::default()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let cfg2 = cfg.clone();
        let t = std::thread::spawn(move || upgrade(vec![None, Some(b)], 0, &cfg2, deadline));
        let mut hi = upgrade(vec![Some(a), None], 1, &cfg, deadline).unwrap();
        let mut lo = t.join().unwrap().unwrap();
        let (Some(Setup::Up(x, _)), Some(Setup::Up(y, _))) = (lo[1].take(), hi[0].take()) else {
            panic!("expected shared memory both ways");
        };
        (x, y)
    }

    #[test]
    fn bytes_cross_in_order_through_a_wrapping_ring() {
        let (mut a, mut b) = pair(PAGE);
        let msg: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut got = Vec::new();
        let mut sent = 0;
        let mut buf = vec![0u8; 3000];
        while got.len() < msg.len() {
            sent += a.write_some(&msg[sent..]).unwrap();
            let n = b.read_some(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, msg);
        // The other direction, with peek.
        assert_eq!(b.write_some(b"hello").unwrap(), 5);
        let mut p = [0u8; 8];
        assert_eq!(a.peek(&mut p).unwrap(), 5);
        assert_eq!(&p[..5], b"hello");
        assert_eq!(a.readable().unwrap(), b"hello");
        a.consume(5);
        assert_eq!(a.read_some(&mut p).unwrap(), 0);
    }

    /// The writer's choice of stores is fed by the reader: bulk reads are timed by how
    /// their bytes were written (the tag the writer left) and published in the ring's
    /// control page; when the reader says plain bytes cost it dearly, the writer streams,
    /// and the bytes arrive intact either way.
    #[test]
    fn the_reader_s_costs_reach_the_writer_and_steer_its_stores() {
        let cap = 256 << 10;
        let (mut a, mut b) = pair(cap);
        let msg: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 13 % 251) as u8).collect();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let mut round = |a: &mut ShmLink, b: &mut ShmLink| {
            let mut sent = 0;
            got.clear();
            while got.len() < msg.len() {
                sent += a.write_some(&msg[sent..]).unwrap();
                let n = b.read_some(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, msg);
        };
        round(&mut a, &mut b);
        // Both ways were tried and the reader timed both.
        let seen = a.tx.read_costs();
        assert!(seen.0.iter().all(|&c| c > 0.0), "{seen:?}");
        assert_eq!(seen, b.reads, "the writer sees what the reader published");
        assert!(a.stores.own().0.iter().all(|&c| c > 0.0));
        // A reader for whom plain bytes cost a thousand times more: the writer streams
        // (every copy but the exploring ones), tagging the ring as it goes.
        let line = &a.tx.ctrl().read_costs.0;
        line[0].store(1e9f64.to_bits(), Ordering::Relaxed);
        assert_eq!(a.stores.favoured(a.tx.read_costs()), 1);
        let at = (a.tx.pos % cap as u64) as usize;
        a.write_some(&msg[..cap / 2]).unwrap();
        // Two 64 KiB copies: at most one explores plain stores.
        let streamed = (0..cap / 2)
            .step_by(cap / SLOTS)
            .filter(|&o| a.tx.way_at((at + o) % cap) == 1)
            .count();
        assert!(streamed >= SLOTS / 4, "{streamed} of {} parts", SLOTS / 2);
        let text = a.counters().unwrap();
        assert!(text.starts_with("ring writes streaming"), "{text}");
        let mut half = vec![0u8; cap / 2];
        let mut n = 0;
        while n < half.len() {
            n += b.read_some(&mut half[n..]).unwrap();
        }
        assert_eq!(half, msg[..cap / 2]);
    }

    #[test]
    fn a_full_ring_takes_no_more_and_a_dead_peer_is_seen() {
        let (mut a, b) = pair(PAGE);
        let big = vec![9u8; 3 * PAGE];
        assert_eq!(a.write_some(&big).unwrap(), PAGE);
        assert_eq!(a.write_some(&big).unwrap(), 0);
        assert_eq!(a.arm(false, true), Some(PollFlags::POLLIN));
        drop(b);
        std::thread::sleep(Duration::from_millis(20));
        a.disarm();
        assert_eq!(
            a.write_some(&big).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        let mut p = [0u8; 4];
        assert_eq!(
            a.read_some(&mut p).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn a_sleeping_reader_is_woken_by_the_writer() {
        let (mut a, mut b) = pair(PAGE);
        assert_eq!(b.arm(true, false), Some(PollFlags::POLLIN));
        a.write_some(b"x").unwrap();
        let mut fds = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&b.sock),
            PollFlags::POLLIN,
        )];
        let n = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(2000u16)).unwrap();
        assert_eq!(n, 1, "the doorbell rang");
        b.disarm();
        let mut p = [0u8; 1];
        assert_eq!(b.read_some(&mut p).unwrap(), 1);
    }

    #[test]
    fn corrupt_positions_are_an_error_not_a_wild_read() {
        let (a, mut b) = pair(PAGE);
        a.tx.ctrl().head.0.store(10 * PAGE as u64, Ordering::SeqCst);
        let mut p = [0u8; 4];
        assert_eq!(
            b.read_some(&mut p).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn different_hosts_decline_with_a_reason() {
        let (a, b) = channel_pair();
        let deadline = Instant::now() + Duration::from_secs(5);
        let lo_cfg = ShmConfig {
            host: Some("a".into()),
            ..ShmConfig::default()
        };
        let t = std::thread::spawn(move || upgrade(vec![None, Some(b)], 0, &lo_cfg, deadline));
        let hi_cfg = ShmConfig {
            host: Some("b".into()),
            ..ShmConfig::default()
        };
        let hi = upgrade(vec![Some(a), None], 1, &hi_cfg, deadline).unwrap();
        let lo = t.join().unwrap().unwrap();
        let Some(Setup::Declined(_, why)) = &hi[0] else {
            panic!("expected TCP")
        };
        assert!(why.contains("different hosts"), "{why}");
        let Some(Setup::Declined(_, why)) = &lo[1] else {
            panic!("expected TCP")
        };
        assert!(why.contains("declined"), "{why}");
    }

    /// A directory of its own under the system's temporary one.
    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("monel-shm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A peer (one that holds the link key: a rank of the job gone bad) offers a segment by
    /// a path outside the directory: the rank declines it (the pair stays on TCP) and
    /// touches nothing.
    #[test]
    fn an_offer_naming_an_outside_path_is_declined() {
        let dir = scratch("offer");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let (real, mut impostor) = channel_pair();
        let cfg = ShmConfig {
            dir: dir.clone(),
            ..ShmConfig::default()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let path = victim.as_os_str().as_encoded_bytes().to_vec();
        let cap = (PAGE as u64).to_le_bytes();
        let t = std::thread::spawn(move || {
            impostor
                .send(OFFER, &[&path, &[1u8; 16], &cap, b""])
                .unwrap();
            impostor.recv().unwrap()
        });
        let out = upgrade(vec![Some(real), None], 1, &cfg, deadline).unwrap();
        let Some(Setup::Declined(_, why)) = &out[0] else {
            panic!("expected a refusal");
        };
        assert!(why.contains("not one Monel makes"), "{why}");
        let (kind, f) = t.join().unwrap();
        assert_eq!(kind, DECLINE);
        assert!(first_text(&f).contains("not one Monel makes"));
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
