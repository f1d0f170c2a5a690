//! Symmetric memory windows (NCCL's `ncclMemAlloc` with `ncclCommWindowRegister`): buffers
//! that every rank of a one-host communicator maps, so a collective on them is loads and
//! stores straight between the ranks' buffers, with no ring and no staging copy.
//!
//! [`crate::Communicator::alloc_window`] is collective: each rank creates a file in the
//! shared-memory directory, the ranks exchange names and nonces with an all-gather, each
//! maps every other rank's file, and they agree (an all-reduce of "mapped everything") that
//! the window is shared before the creators unlink the files. The first window also shares
//! a control page per rank, the meeting point of the direct collectives.
//!
//! A direct collective (`run`) has two meetings. At the first, each rank publishes what
//! it is calling (signature, and where its send and receive buffers lie in which window)
//! and waits for every rank; then every rank checks all the signatures alike (so all agree
//! on a mismatch before any byte moves) and does its share: for a reduction, the part
//! [`monel_sched::schedule::split`] gives it, folded in rank order (the same bits as the
//! deterministic algorithm) and stored into every rank's output; for the rest, it pulls what
//! its own output needs. At the second meeting every rank waits until nobody reads or
//! writes its buffers any more, and returns. Parts are disjoint, so no byte is written by
//! two ranks or read while another writes it.
//!
//! Calls under [`MIN_BYTES`] per rank take the ordinary path, windows or not.
//!
//! Every rank must pass window buffers to the same call (as NCCL requires of symmetric
//! windows); a rank that does not leaves the others waiting at the first meeting until the
//! timeout, which names it.

use std::ops::{Deref, DerefMut, Range};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::error::{CclError, ErrorKind, Result};
use crate::transport::segment::Segment;
use crate::transport::{Link, Registration};
use monel_sched::dtype::{DataType, RedOp};
use monel_sched::plan::Collective;
use monel_sched::reduce;
use monel_sched::schedule::split;

/// The header page in front of a window's bytes (the nonce lives there).
pub(crate) const HEADER: usize = 4096;
/// The smallest call (elements per rank, in bytes) that runs directly: below it the
/// ordinary path is faster (measured with `monel bench -R 1`, 2 and 4 ranks, 2 cores: about
/// 1.2 us against 0.9 us at 8 B on 2 ranks; the window path wins from 4 KiB).
pub const MIN_BYTES: usize = 4096;
/// Bytes reduced per pass (the accumulator stays in cache while n inputs fold into it).
const PASS: usize = 64 << 10;

/// One rank's window and its views of the other ranks' windows of the same id.
pub(crate) struct Region {
    /// The window's registrations with this rank's NIC (dropped first, before the memory).
    registrations: Vec<Registration>,
    pub(crate) id: usize,
    len: usize,
    own: Segment,
    /// By rank: the peer's window of this id, as mapped here (`None` for this rank, or for
    /// every rank when the window is not shared).
    peers: Vec<Option<Segment>>,
}

// SAFETY: a region owns its mappings; the memory is plain bytes, and who may touch which
// bytes when is the direct collectives' protocol (see the module docs), not the thread.
#[allow(unsafe_code)]
unsafe impl Send for Region {}
// SAFETY: as for `Send`; shared references only hand out pointers, never `&mut`.
#[allow(unsafe_code)]
unsafe impl Sync for Region {}

impl Region {
    pub(crate) fn new(id: usize, len: usize, own: Segment, peers: Vec<Option<Segment>>) -> Self {
        debug_assert!(own.len() >= HEADER + len);
        Self {
            registrations: Vec::new(),
            id,
            len,
            own,
            peers,
        }
    }

    /// Registers the window's bytes with the NIC behind `link` ([`Link::register`]), so
    /// sends from them skip the staging copy; `Ok(false)`: the link has no NIC.
    pub(crate) fn register_with(&mut self, link: &dyn Link) -> std::io::Result<bool> {
        // SAFETY: the region owns the mapping, and drops its registrations before it
        // (they are its first field).
        #[allow(unsafe_code)]
        match unsafe { link.register(self.data(), self.len) } {
            Some(r) => {
                self.registrations.push(r?);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Every rank maps this window (a one-rank window counts).
    pub(crate) fn shared(&self) -> bool {
        self.peers.iter().any(Option::is_some) || self.peers.len() == 1
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: every window segment is at least HEADER + len bytes (asserted at creation).
        #[allow(unsafe_code)]
        unsafe {
            self.own.ptr().as_ptr().add(HEADER)
        }
    }

    /// Rank `j`'s window of this id, as mapped here: its first data byte and its length.
    fn peer(&self, j: usize) -> Option<(*mut u8, usize)> {
        let s = self.peers.get(j)?.as_ref()?;
        let len = s.len().checked_sub(HEADER)?;
        // SAFETY: the segment is longer than HEADER (checked just above).
        #[allow(unsafe_code)]
        let p = unsafe { s.ptr().as_ptr().add(HEADER) };
        Some((p, len))
    }

    /// Where `ptr..ptr + len` lies in this window, as an offset.
    fn offset_of(&self, ptr: *const u8, len: usize) -> Option<usize> {
        let base = self.data() as usize;
        let p = ptr as usize;
        (p >= base && p + len <= base + self.len).then(|| p - base)
    }
}

/// A buffer in a symmetric window: every rank of the communicator that allocated it can
/// reach it directly (when the ranks share one host). Use it as a byte slice; pass (parts
/// of) it to the communicator's collectives on every rank, and they run directly.
pub struct Window {
    region: Arc<Region>,
}

impl Window {
    pub(crate) fn new(region: Arc<Region>) -> Self {
        Self { region }
    }
    /// The window's id in its communicator (windows are numbered in allocation order).
    pub fn id(&self) -> usize {
        self.region.id
    }
    /// True when every rank maps every rank's window (collectives on it run directly).
    pub fn is_shared(&self) -> bool {
        self.region.shared()
    }
}

impl Deref for Window {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the data area is `len` bytes inside the live mapping. Peers write into it
        // only inside a collective this rank is in with these bytes borrowed for it.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.region.data(), self.region.len)
        }
    }
}

impl DerefMut for Window {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`; `&mut self` is the only handle to this rank's bytes.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.region.data(), self.region.len)
        }
    }
}

/// One rank's published state at the meetings: its own cache line for the meeting count,
/// then what it is calling.
#[repr(C, align(64))]
struct Ctl {
    arrived: AtomicU64,
    /// `arrived`'s low 32 bits, the word a waiting rank sleeps on (a futex on the shared
    /// page, so it works between processes).
    bell: AtomicU32,
    /// Ranks asleep on `bell`: an arriving rank wakes them only when there are some.
    sleepers: AtomicU32,
    _pad: [u64; 6],
    /// seq, collective | dtype << 8 | op << 16, count, root, send window + 1 (0: none),
    /// send offset, recv window + 1, recv offset.
    desc: [AtomicU64; 8],
}

/// Bytes of the control segment (header page, then one [`Ctl`]).
pub(crate) const CTL_LEN: usize = 4096;

/// A communicator's windows: the control pages, the windows by id, the meeting count.
#[derive(Default)]
pub(crate) struct Windows {
    ctl: Option<Region>,
    /// The windows still alive, by id (freed ones are pruned as new ones come).
    live: Vec<(usize, Weak<Region>)>,
    /// Windows made so far: the next one's id.
    made: usize,
    meetings: u64,
    /// A window was registered with this rank's NIC: sends may skip the staging copy.
    on_nic: bool,
}

/// Where one buffer of a call lies: (window id, offset), or nowhere (an empty buffer).
pub(crate) type Loc = Option<(usize, usize)>;

impl Windows {
    /// The control pages are shared: windows made from now on can be.
    pub(crate) fn ready(&self) -> bool {
        self.ctl.is_some()
    }
    pub(crate) fn set_ctl(&mut self, ctl: Region) {
        self.ctl = Some(ctl);
    }
    /// Notes whether a new window was registered with the NIC ([`Self::on_nic`]).
    pub(crate) fn note_registered(&mut self, yes: bool) {
        self.on_nic |= yes;
    }
    /// Some window was registered with this rank's NIC.
    pub(crate) fn on_nic(&self) -> bool {
        self.on_nic
    }
    /// The id the next window gets.
    pub(crate) fn next_id(&self) -> usize {
        self.made
    }
    /// Registers a new window (its id is [`Self::next_id`]) and forgets freed ones, so a
    /// program that allocates windows over and over keeps the list as short as its live set.
    pub(crate) fn push(&mut self, r: &Arc<Region>) {
        self.live.retain(|(_, w)| w.strong_count() > 0);
        self.live.push((r.id, Arc::downgrade(r)));
        self.made = self.made.max(r.id + 1);
    }
    /// The live window of id `id`.
    fn get(&self, id: usize) -> Option<Arc<Region>> {
        self.live
            .iter()
            .find(|(i, _)| *i == id)
            .and_then(|(_, w)| w.upgrade())
    }
    /// Windows the list holds (freed ones included until the next [`Self::push`]).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.live.len()
    }

    /// Where `buf` lies in a live shared window of this rank; `None` when it is not in one.
    /// An empty buffer lies nowhere and counts as found.
    pub(crate) fn locate(&self, ptr: *const u8, len: usize) -> Option<Loc> {
        if len == 0 {
            return Some(None);
        }
        self.ctl.as_ref()?;
        self.live
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .find_map(|w| {
                w.shared()
                    .then(|| w.offset_of(ptr, len))
                    .flatten()
                    .map(|o| Some((w.id, o)))
            })
    }
}

/// One call, as this rank sees it.
pub(crate) struct DirectCall<'a> {
    pub(crate) coll: Collective,
    pub(crate) coll_code: u8,
    pub(crate) dtype: DataType,
    pub(crate) count: usize,
    pub(crate) seq: u64,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    /// This rank's send bytes (the in-place buffer in place), where they lie, and their
    /// length as this collective needs them.
    pub(crate) send: (*const u8, Loc, usize),
    /// This rank's receive bytes.
    pub(crate) recv: (*mut u8, Loc, usize),
    pub(crate) deadline: Instant,
    /// Hand the core over while waiting (more ranks than cores).
    pub(crate) yield_often: bool,
    pub(crate) scratch: &'a mut Vec<u8>,
}

fn ctl_of(seg: &Segment) -> &Ctl {
    // SAFETY: control segments are CTL_LEN bytes (checked when mapped) and the Ctl block
    // sits at HEADER, 64-byte aligned (page-aligned mapping); it holds only atomics, valid
    // for any bits and shareable across processes.
    #[allow(unsafe_code)]
    unsafe {
        &*seg.ptr().as_ptr().add(HEADER).cast::<Ctl>()
    }
}

const _: () = assert!(size_of::<Ctl>() <= CTL_LEN);

/// Every rank's control block: this rank's own, then the peers' as mapped here.
fn ctls(ctl: &Region, n: usize, me: usize) -> Result<Vec<&Ctl>> {
    (0..n)
        .map(|j| {
            if j == me {
                return Ok(ctl_of(&ctl.own));
            }
            match ctl.peers.get(j).and_then(Option::as_ref) {
                Some(s) if s.len() >= HEADER + size_of::<Ctl>() => Ok(ctl_of(s)),
                _ => Err(CclError::internal(format!(
                    "the window control page of rank {j} is not mapped"
                ))),
            }
        })
        .collect()
}

/// This rank arrives at meeting `m`: publishes it and wakes the ranks asleep on it.
fn arrive(mine: &Ctl, m: u64) {
    mine.arrived.store(m, Ordering::SeqCst);
    mine.bell.store(m as u32, Ordering::SeqCst);
    // Ordered after the stores (SeqCst): a rank that counted itself in before this load is
    // woken; one that counts itself in after it sees the new values and does not sleep.
    if mine.sleepers.load(Ordering::SeqCst) > 0 {
        futex(&mine.bell, libc::FUTEX_WAKE, i32::MAX as u32, None);
    }
}

/// Sleeps until rank `c` arrives at meeting `m` (or `until`; a wake may come early, the
/// caller looks again).
fn sleep_until_arrived(c: &Ctl, m: u64, until: Instant) {
    c.sleepers.fetch_add(1, Ordering::SeqCst);
    let bell = c.bell.load(Ordering::SeqCst);
    if c.arrived.load(Ordering::SeqCst) < m {
        let left = until.saturating_duration_since(Instant::now());
        // The kernel sleeps only while the bell still reads `bell`: an arrival after the
        // load above returns at once.
        futex(&c.bell, libc::FUTEX_WAIT, bell, Some(left));
    }
    c.sleepers.fetch_sub(1, Ordering::SeqCst);
}

/// `futex(2)` on a shared word (not private: ranks are separate processes).
fn futex(word: &AtomicU32, op: libc::c_int, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned 32-bit atomic (in the shared control page, which
    // outlives the call); FUTEX_WAIT only reads it and sleeps, FUTEX_WAKE only wakes; `tsp`
    // is null or points to `ts`, alive across the call. Errors (EAGAIN: the word changed,
    // ETIMEDOUT, EINTR) need no handling: the caller looks at the word again.
    #[allow(unsafe_code)]
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            tsp,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Waits until every rank has arrived at meeting `m`; names the ranks that did not. Spins,
/// then yields, then sleeps on the first missing rank's bell (woken when it arrives).
fn meet(ctls: &[&Ctl], m: u64, deadline: Instant, yield_often: bool, what: &str) -> Result<()> {
    let mut spins = 0u32;
    loop {
        if ctls.iter().all(|c| c.arrived.load(Ordering::Acquire) >= m) {
            return Ok(());
        }
        spins += 1;
        if spins < 64 && !yield_often {
            std::hint::spin_loop();
        } else if spins < 4096 {
            std::thread::yield_now();
        } else {
            if Instant::now() >= deadline {
                let missing: Vec<usize> = ctls
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.arrived.load(Ordering::Acquire) < m)
                    .map(|(j, _)| j)
                    .collect();
                return Err(CclError::new(
                    ErrorKind::Timeout,
                    format!(
                        "{what} on window buffers: ranks {missing:?} did not reach the \
                         window meeting (a rank that passes buffers outside the window \
                         takes the ordinary path and never comes)"
                    ),
                )
                .with_ranks(missing));
            }
            if let Some(c) = ctls.iter().find(|c| c.arrived.load(Ordering::Acquire) < m) {
                sleep_until_arrived(c, m, deadline);
            }
        }
    }
}

/// A rank's buffer as mapped in this process: first byte and the bytes the window has
/// from there.
#[derive(Clone, Copy)]
struct View {
    ptr: *mut u8,
    room: usize,
}

impl View {
    /// `len` bytes at `off`, checked against the window (a peer that publishes a bad
    /// offset gets an error, never a wild access).
    fn at(self, off: usize, len: usize, who: usize) -> Result<*mut u8> {
        if off.checked_add(len).is_some_and(|e| e <= self.room) {
            // SAFETY: off + len <= room, the bytes mapped from ptr.
            #[allow(unsafe_code)]
            Ok(unsafe { self.ptr.add(off) })
        } else {
            Err(CclError::new(
                ErrorKind::Mismatch,
                format!("rank {who}'s buffer does not fit its window ({len} bytes at {off})"),
            )
            .with_ranks(vec![who]))
        }
    }
}

/// Runs one collective directly on window buffers (see the module docs).
pub(crate) fn run(w: &mut Windows, mut c: DirectCall<'_>) -> Result<()> {
    let (n, me) = (c.nranks, c.rank);
    let ctl = w
        .ctl
        .as_ref()
        .ok_or_else(|| CclError::internal("direct collective without window control pages"))?;
    let all = ctls(ctl, n, me)?;
    let first = w.meetings + 1;
    let op = c.coll.op().unwrap_or(RedOp::Sum);
    let root = c.coll.root().unwrap_or(0);
    let enc = |l: Loc| l.map_or((0, 0), |(id, off)| (id as u64 + 1, off as u64));
    let (sw, so) = enc(c.send.1);
    let (rw, ro) = enc(c.recv.1);
    let desc = [
        c.seq,
        u64::from(c.coll_code) | u64::from(c.dtype.code()) << 8 | u64::from(op.code()) << 16,
        c.count as u64,
        root as u64,
        sw,
        so,
        rw,
        ro,
    ];
    for (slot, v) in all[me].desc.iter().zip(desc) {
        slot.store(v, Ordering::Relaxed);
    }
    arrive(all[me], first);
    w.meetings += 2;
    let name = c.coll.name();
    meet(&all, first, c.deadline, c.yield_often, name)?;
    // Everyone checks every signature against rank 0's, so all see the same mismatch.
    let sig =
        |j: usize| -> [u64; 4] { std::array::from_fn(|k| all[j].desc[k].load(Ordering::Relaxed)) };
    let base = sig(0);
    let odd: Vec<usize> = (0..n).filter(|&j| sig(j) != base).collect();
    let res = if odd.is_empty() {
        work(w, &mut c, &all, op, root)
    } else {
        Err(CclError::new(
            ErrorKind::Mismatch,
            format!(
                "{name} on window buffers: ranks {odd:?} called something else than rank 0 \
                 (sequence, collective, type, op, count or root differ)"
            ),
        )
        .with_ranks(odd))
    };
    // The second meeting even after an error here: peers may still be reading this
    // rank's buffers.
    arrive(all[me], first + 1);
    let met = meet(&all, first + 1, c.deadline, c.yield_often, name);
    res.and(met)
}

/// This rank's share of the call, after the first meeting.
fn work(w: &Windows, c: &mut DirectCall<'_>, all: &[&Ctl], op: RedOp, root: usize) -> Result<()> {
    let (n, me, es) = (c.nranks, c.rank, c.dtype.size());
    let count = c.count;
    // Each rank's send and receive buffers as mapped here.
    let view = |j: usize, recv: bool| -> Result<Option<View>> {
        if j == me {
            let (p, len) = if recv {
                (c.recv.0, c.recv.2)
            } else {
                (c.send.0.cast_mut(), c.send.2)
            };
            return Ok((len > 0).then_some(View { ptr: p, room: len }));
        }
        let k = if recv { 6 } else { 4 };
        let id = all[j].desc[k].load(Ordering::Relaxed);
        if id == 0 {
            return Ok(None);
        }
        let off = all[j].desc[k + 1].load(Ordering::Relaxed) as usize;
        let region = usize::try_from(id - 1)
            .ok()
            .and_then(|i| w.get(i))
            .ok_or_else(|| {
                CclError::new(
                    ErrorKind::Mismatch,
                    format!("rank {j} passes window {} that this rank freed", id - 1),
                )
                .with_ranks(vec![j])
            })?;
        let (p, len) = region.peer(j).ok_or_else(|| {
            CclError::internal(format!("window {} of rank {j} is not mapped", id - 1))
        })?;
        if off > len {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!("rank {j}'s buffer lies outside its window"),
            )
            .with_ranks(vec![j]));
        }
        // SAFETY: off <= len, inside the peer's mapped window.
        #[allow(unsafe_code)]
        let p = unsafe { p.add(off) };
        // The Region stays alive in this rank's list for as long as its Window does; a
        // window freed mid-call was found above.
        Ok(Some(View {
            ptr: p,
            room: len - off,
        }))
    };
    let need = |j: usize, recv: bool| -> Result<View> {
        view(j, recv)?.ok_or_else(|| {
            CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "rank {j} passed no {} buffer",
                    if recv { "receive" } else { "send" }
                ),
            )
            .with_ranks(vec![j])
        })
    };
    if count == 0 {
        return Ok(());
    }
    let bytes = |r: Range<usize>| r.start * es..r.end * es;
    match c.coll {
        Collective::AllReduce(_) | Collective::Reduce(..) => {
            let part = bytes(split(count, n)[me].clone());
            let srcs = (0..n)
                .map(|j| need(j, false)?.at(part.start, part.len(), j))
                .collect::<Result<Vec<_>>>()?;
            let dsts = if matches!(c.coll, Collective::AllReduce(_)) {
                (0..n)
                    .map(|j| need(j, true)?.at(part.start, part.len(), j))
                    .collect::<Result<Vec<_>>>()?
            } else {
                vec![need(root, true)?.at(part.start, part.len(), root)?]
            };
            fold(&srcs, &dsts, part.len(), c.dtype, op, n, c.scratch);
        }
        Collective::ReduceScatter(_) => {
            let len = count * es;
            let srcs = (0..n)
                .map(|j| need(j, false)?.at(me * len, len, j))
                .collect::<Result<Vec<_>>>()?;
            let dst = need(me, true)?.at(0, len, me)?;
            fold(&srcs, &[dst], len, c.dtype, op, n, c.scratch);
        }
        Collective::AllGather | Collective::Gather(_) => {
            if matches!(c.coll, Collective::Gather(r) if r != me) {
                return Ok(());
            }
            let len = count * es;
            let out = need(me, true)?;
            for j in 0..n {
                let src = need(j, false)?.at(0, len, j)?;
                copy(src, out.at(j * len, len, me)?, len);
            }
        }
        Collective::Broadcast(_) => {
            let len = count * es;
            let src = need(root, false)?.at(0, len, root)?;
            copy(src, need(me, true)?.at(0, len, me)?, len);
        }
        Collective::Scatter(_) => {
            let len = count * es;
            let src = need(root, false)?.at(me * len, len, root)?;
            copy(src, need(me, true)?.at(0, len, me)?, len);
        }
        Collective::AllToAll => {
            let len = count * es;
            let out = need(me, true)?;
            for j in 0..n {
                let src = need(j, false)?.at(me * len, len, j)?;
                copy(src, out.at(j * len, len, me)?, len);
            }
        }
        Collective::Barrier => {}
    }
    Ok(())
}

/// Copies `len` bytes; nothing when source and destination are the same bytes (in place).
fn copy(src: *const u8, dst: *mut u8, len: usize) {
    if std::ptr::eq(src, dst) || len == 0 {
        return;
    }
    // SAFETY: both ranges were bounds-checked against their windows ([`View::at`]); they
    // do not overlap (different ranks' buffers, or disjoint parts of one: the collectives'
    // layouts never overlap a rank's own part with another's), and by the meeting protocol
    // no other rank touches the destination part meanwhile.
    #[allow(unsafe_code)]
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src, len),
            std::slice::from_raw_parts_mut(dst, len),
        )
    };
    monel_copy::copy(d, s);
}

/// Folds the n sources in rank order into every destination, a pass at a time.
fn fold(
    srcs: &[*mut u8],
    dsts: &[*mut u8],
    len: usize,
    dtype: DataType,
    op: RedOp,
    n: usize,
    scratch: &mut Vec<u8>,
) {
    let es = dtype.size();
    let pass = (PASS / es).max(1) * es;
    if scratch.len() < pass.min(len) {
        scratch.resize(pass.min(len), 0);
    }
    let mut at = 0;
    while at < len {
        let k = pass.min(len - at);
        let acc = &mut scratch[..k];
        let piece = |p: *mut u8| -> &[u8] {
            // SAFETY: at + k <= len, inside the range checked for this source; no rank
            // writes this part while its owner (this rank) folds it.
            #[allow(unsafe_code)]
            unsafe {
                std::slice::from_raw_parts(p.add(at), k)
            }
        };
        if n > 1 {
            reduce::reduce_to(acc, piece(srcs[0]), piece(srcs[1]), dtype, op);
        } else {
            acc.copy_from_slice(piece(srcs[0]));
        }
        for &s in srcs.iter().skip(2) {
            reduce::reduce_into(acc, piece(s), dtype, op);
        }
        if op == RedOp::Avg {
            reduce::divide(acc, dtype, n);
        }
        for &d in dsts {
            // SAFETY: as above, at + k <= len inside the destination's checked range.
            #[allow(unsafe_code)]
            let d = unsafe { d.add(at) };
            copy(acc.as_ptr(), d, k);
        }
        at += k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_range_outside_the_window_is_an_error_naming_the_rank() {
        let mut mem = vec![0u8; 100];
        let v = View {
            ptr: mem.as_mut_ptr(),
            room: mem.len(),
        };
        assert!(v.at(0, 100, 3).is_ok());
        assert!(v.at(60, 40, 3).is_ok());
        for (off, len) in [(61, 40), (101, 0), (usize::MAX, 2), (0, usize::MAX)] {
            let e = v.at(off, len, 3).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Mismatch);
            assert_eq!(e.ranks, vec![3], "{off} {len}");
        }
    }

    #[test]
    fn freed_windows_leave_the_list_and_ids_keep_counting() {
        let mut w = Windows::default();
        let make = |id| {
            Arc::new(Region::new(
                id,
                64,
                Segment::anonymous(HEADER + 64).unwrap(),
                vec![None],
            ))
        };
        let kept = make(w.next_id());
        w.push(&kept);
        for _ in 0..100 {
            let r = make(w.next_id());
            w.push(&r);
        }
        assert_eq!(w.next_id(), 101);
        let last = make(w.next_id());
        w.push(&last);
        // The hundred freed ones are gone; the ids go on.
        assert_eq!(w.held(), 2);
        assert_eq!(w.get(0).map(|r| r.id), Some(0));
        assert_eq!(w.get(101).map(|r| r.id), Some(101));
        assert!(w.get(50).is_none());
        assert_eq!(w.next_id(), 102);
    }

    #[test]
    fn a_window_locates_only_what_it_holds() {
        let seg = Segment::anonymous(HEADER + 64).unwrap();
        let r = Region::new(0, 64, seg, vec![None]);
        let base = r.data().cast_const();
        assert_eq!(r.offset_of(base, 64), Some(0));
        // SAFETY: base + 10 is inside the 64 data bytes.
        #[allow(unsafe_code)]
        let p = unsafe { base.add(10) };
        assert_eq!(r.offset_of(p, 54), Some(10));
        assert_eq!(r.offset_of(p, 55), None);
        assert_eq!(r.offset_of(base.wrapping_sub(1), 1), None);
    }
}
