//! The progress engine: the thread that plays the NIC. It receives batches of datagrams,
//! checks and demultiplexes them to QPs, runs timers, gathers outgoing packets from every
//! QP with work, frames them (IP/UDP pseudo-headers for the ICRC) and sends them in batches.
//! It sleeps in poll(2) on the sockets and the doorbell. Application threads that wait on or
//! poll a CQ drive the sockets themselves meanwhile (busy-polling devices spin there).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use monel_rc::Instant;
use monel_rc::time::earliest;
use monel_wire::icrc::{self, Ipv4IdBasis};
use monel_wire::{BthPacket, BthRepr, FrameRepr, ICRC_LEN, IpAddress, RocePacket};
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

use super::mr::PdMemory;
use super::netio::{MAX_DATAGRAM, RxBatch, RxMeta, SockTable};
use super::qp_kind::QpKind;
use super::queues::CqShared;
use super::shared::{Core, DevShared, device_event};
use super::tx::{TX_HEADROOM, TxBatch};
use crate::protect::{Rejected, TRAILER};

/// Checks the ICRC of a datagram received on a UDP socket. IPv6: every covered field is known.
/// IPv4: the IP ID is not visible, so the check first assumes the ID the datagram most likely
/// carried (0 from senders with DF on unconnected sockets; k for the k-th segment of a GSO
/// message, which arrives as the k-th datagram of a coalesced buffer) and otherwise solves
/// for the ID (rxe numbers its packets).
pub(crate) struct IcrcChecker {
    bases: HashMap<usize, Ipv4IdBasis>,
}

/// Outcome of an ICRC check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcrcVerdict {
    /// Matched with the fields as seen.
    Ok,
    /// Matched once the unseen IPv4 ID was solved for.
    OkWithId(u16),
    /// Wrong.
    Bad,
}

impl IcrcChecker {
    pub(crate) fn new() -> Self {
        Self {
            bases: HashMap::new(),
        }
    }

    pub(crate) fn check(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        roce: &[u8],
        likely_id: u16,
    ) -> IcrcVerdict {
        if roce.len() < 12 + ICRC_LEN {
            return IcrcVerdict::Bad;
        }
        let framing = FrameRepr {
            src: IpAddress::from(src.ip()),
            dst: IpAddress::from(dst.ip()),
            src_port: src.port(),
            dst_port: dst.port(),
            traffic_class: 0,
            hop_limit: 0,
            ident: if src.is_ipv4() { likely_id } else { 0 },
            flow_label: 0,
        };
        let hl = framing.header_len();
        let mut hdr = [0u8; 48];
        if framing.emit_headers(&mut hdr[..hl], roce.len()).is_err() {
            return IcrcVerdict::Bad;
        }
        let (ip, udp) = hdr[..hl].split_at(hl - 8);
        let body = &roce[..roce.len() - ICRC_LEN];
        let Ok(computed) = icrc::compute(ip, udp, body) else {
            return IcrcVerdict::Bad;
        };
        let carried =
            u32::from_le_bytes(roce[roce.len() - ICRC_LEN..].try_into().expect("4 bytes"));
        if computed == carried {
            return IcrcVerdict::Ok;
        }
        if src.is_ipv4() {
            let basis = self
                .bases
                .entry(roce.len())
                .or_insert_with(|| Ipv4IdBasis::new(roce.len()));
            // The CRC is affine in the ID: solving from a guess gives guess ^ ID.
            if let Some(d) = basis.solve(computed, carried) {
                return IcrcVerdict::OkWithId(d ^ likely_id);
            }
        }
        IcrcVerdict::Bad
    }
}

fn now(shared: &DevShared) -> Instant {
    Instant::from_nanos(shared.epoch.elapsed().as_nanos() as u64)
}

/// The longest the progress thread sleeps with nothing to do.
const MAX_SLEEP_NS: u64 = 100_000_000;

/// How long the progress thread sleeps at most while an application thread drives the
/// sockets (it then watches only its doorbell and timers).
const CALLER_SLEEP_NS: u64 = 1_000_000;

/// For this long after an application thread polled a CQ, the progress thread wakes at least
/// every [`CALLER_SLEEP_NS`].
const POLLED_NS: u64 = 10_000_000;

/// The I/O state of an application thread that drives progress itself (see [`wait_cq`]).
struct CallerIo {
    rx: RxBatch,
    tx: TxBatch,
    icrc: IcrcChecker,
}

thread_local! {
    static CALLER_IO: std::cell::RefCell<Option<CallerIo>> = const { std::cell::RefCell::new(None) };
}

/// Packets a send batch holds, per datagram of the receive batch (`ContextConfig::batch`):
/// a GSO message carries up to 15 4 KiB packets, so a 32-packet batch split one 256 KiB WRITE
/// over three or four sendmmsg calls; 128 packets send it in one or two.
const TX_BATCH_FACTOR: usize = 4;

/// Runs `f` with this thread's I/O state (batches of `batch` datagrams received, and
/// `batch * TX_BATCH_FACTOR` packets sent).
fn with_caller_io<R>(shared: &DevShared, f: impl FnOnce(&mut CallerIo) -> R) -> R {
    let (batch, coalesced) = (shared.config.batch, shared.sockets.gro);
    CALLER_IO.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_some_and(|io| io.rx.bufs.len() != batch) {
            *c = None;
        }
        f(c.get_or_insert_with(|| CallerIo {
            rx: RxBatch::new(batch, coalesced),
            tx: TxBatch::new(batch * TX_BATCH_FACTOR),
            icrc: IcrcChecker::new(),
        }))
    })
}

/// The progress loop; returns when the context is dropped. While an application thread waits
/// on a CQ it drives the sockets itself ([`wait_cq`]); this thread then keeps only the timers
/// and the doorbell, so one datagram never wakes two threads.
pub(crate) fn run(shared: &DevShared) {
    // Timers of microseconds need the kernel to wake us when asked (default slack: 50 us).
    let _ = nix::sys::prctl::set_timerslack(1_000);
    let n = shared.config.batch;
    let mut rx = RxBatch::new(n, shared.sockets.gro);
    let mut tx = TxBatch::new(n * TX_BATCH_FACTOR);
    let mut icrc = IcrcChecker::new();
    let mut next_timer: Option<Instant> = None;
    // The sockets of the GID table of the moment, then the doorbell and the address watch;
    // built again when the table changes.
    'table: loop {
        let generation = shared.sockets.generation();
        let table = shared.sockets.load();
        let socks = table.receiving().len();
        let mut fds: Vec<PollFd<'_>> = table
            .receiving()
            .map(|(_, s)| PollFd::new(s.udp.as_fd(), PollFlags::POLLIN))
            .chain([PollFd::new(shared.doorbell.as_fd(), PollFlags::POLLIN)])
            .chain(
                shared
                    .addr_watch
                    .as_ref()
                    .map(|w| PollFd::new(w.as_fd(), PollFlags::POLLIN)),
            )
            .collect();
        loop {
            if shared.sockets.generation() != generation {
                continue 'table;
            }
            if shared.stop.load(Ordering::Acquire) {
                // Last words: what application threads deferred.
                service(shared, &mut tx, Scope::All);
                return;
            }
            let callers = shared.callers.load(Ordering::Acquire) > 0;
            let t0 = now(shared).as_nanos();
            // Nanosecond timeouts: pacing gaps and retransmit timers are microseconds apart.
            // While application threads poll, they may leave ACKs for this thread's next pass.
            // Not watching until the poll time is read: a thread that arms a completion channel
            // meanwhile (resetting `last_poll_ns`, see `CompletionQueue::req_notify`) either sees
            // this and rings, or its reset is seen here.
            shared.engine_watches.store(false, Ordering::SeqCst);
            let at = shared.last_poll_ns.load(Ordering::SeqCst);
            let polled = at != 0 && t0.saturating_sub(at) < POLLED_NS;
            shared
                .engine_watches
                .store(!(callers || polled), Ordering::SeqCst);
            let cap = if callers || polled {
                CALLER_SLEEP_NS
            } else {
                MAX_SLEEP_NS
            };
            let wait_ns = match next_timer {
                None => cap,
                Some(t) => t.as_nanos().saturating_sub(t0).min(cap),
            };
            shared.core().engine_wake_at = Some(Instant::from_nanos(t0 + wait_ns));
            let ts = TimeSpec::from_duration(std::time::Duration::from_nanos(wait_ns));
            // While application threads drive the sockets, a datagram must not wake this one too.
            let set = if callers || polled {
                &mut fds[socks..]
            } else {
                &mut fds[..]
            };
            let _ = ppoll(set, Some(ts), None);
            let _ = shared.doorbell.read();
            if shared.addr_watch.as_ref().is_some_and(|w| w.drain()) {
                follow_addresses(shared);
            }
            // An application thread that started waiting while this one slept owns the sockets.
            if shared.callers.load(Ordering::Acquire) == 0 {
                receive_all(shared, &table, &mut rx, &mut icrc);
            }
            // Timers, transmit, completions.
            next_timer = service(shared, &mut tx, Scope::All);
        }
    }
}

/// The interface's addresses changed: the GID table follows (threads waiting on a CQ take
/// the new table within [`TABLE_CHECK`]).
fn follow_addresses(shared: &DevShared) {
    let Ok(addrs) = crate::device::interface_addresses(&shared.device.ifname) else {
        return;
    };
    shared
        .sockets
        .follow(&shared.device.name, &addrs, &shared.config);
}

/// Reads every socket of `table` dry, delivering to the QPs. Returns the datagrams read.
fn receive_all(
    shared: &DevShared,
    table: &SockTable,
    rx: &mut RxBatch,
    icrc: &mut IcrcChecker,
) -> usize {
    let n = rx.bufs.len();
    let _order = shared
        .rx_lock
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut total = 0;
    for (si, sock) in table.receiving() {
        loop {
            let got = rx.recv(sock);
            if got == 0 {
                break;
            }
            total += got;
            let mut core = shared.core();
            core.counters.rx_batches += 1;
            let mut mrs = shared.mrs.lock().unwrap_or_else(PoisonError::into_inner);
            let t = now(shared);
            for i in 0..got {
                let m = rx.meta[i];
                if m.truncated || m.seg >= m.len {
                    deliver(
                        &mut core,
                        &mut mrs,
                        icrc,
                        si,
                        sock.local,
                        m,
                        &mut rx.bufs[i][..m.len],
                        t,
                    );
                    continue;
                }
                // GRO coalesced datagrams of one size (the last may be shorter).
                for (k, d) in rx.bufs[i][..m.len].chunks_mut(m.seg).enumerate() {
                    core.counters.rx_coalesced += 1;
                    let one = RxMeta {
                        len: d.len(),
                        truncated: d.len() > MAX_DATAGRAM,
                        index: k as u16,
                        ..m
                    };
                    deliver(&mut core, &mut mrs, icrc, si, sock.local, one, d, t);
                }
            }
            drop(mrs);
            drop(core);
            if got < n {
                break;
            }
        }
    }
    total
}

/// After a post: sends what QP `qpn` now has on the calling thread, with no hop to the
/// progress thread, and wakes that thread only if the QP now needs a timer sooner than it
/// planned to wake. Packet order holds: every transmission happens under the device lock.
pub(crate) fn kick(shared: &DevShared, qpn: u32) {
    with_caller_io(shared, |io| service(shared, &mut io.tx, Scope::Posted(qpn)));
}

/// One pass of an application thread polling an empty CQ: sends what was deferred, then
/// receives and processes what the sockets hold, without blocking.
pub(crate) fn progress_once(shared: &DevShared) {
    shared
        .last_poll_ns
        .store(now(shared).as_nanos().max(1), Ordering::SeqCst);
    // As a waiting thread's pass: deferred responses first, so a stream keeps its ACKs.
    send_deferred(shared);
    if caller_receive(shared) {
        hand_over_deferred(shared);
    }
}

/// An application thread receives and processes what the sockets hold, deferring the
/// responses (so an ACK leaves with its next post). Returns true if anything was received.
fn caller_receive(shared: &DevShared) -> bool {
    with_caller_io(shared, |io| {
        let got = receive_all(shared, &shared.sockets.load(), &mut io.rx, &mut io.icrc) > 0;
        if got {
            service(shared, &mut io.tx, Scope::Received);
        }
        got
    })
}

/// An application thread sends what was deferred.
pub(crate) fn send_deferred(shared: &DevShared) {
    with_caller_io(shared, |io| service(shared, &mut io.tx, Scope::Deferred));
}

/// Deferred transmissions leave with the caller's next post, or within the progress
/// thread's next pass, which must then come within a millisecond.
fn hand_over_deferred(shared: &DevShared) {
    let ring = {
        let core = shared.core();
        !core.pending_tx.is_empty()
            && engine_late(
                &core,
                Instant::from_nanos(now(shared).as_nanos() + CALLER_SLEEP_NS),
            )
    };
    if ring {
        shared.ring();
    }
}

/// True if a deadline at `t` comes before the progress thread's planned wake-up.
fn engine_late(core: &Core, t: Instant) -> bool {
    core.engine_wake_at.is_none_or(|p| t < p)
}

/// What a waiting thread sleeps on: the device's sockets, then the CQ's channel. Held on the
/// stack for up to [`PollSet::INLINE`] sockets (a wait allocates nothing).
enum PollSet<'a> {
    Inline([PollFd<'a>; PollSet::INLINE + 1], usize),
    Heap(Vec<PollFd<'a>>),
}

impl<'a> PollSet<'a> {
    const INLINE: usize = 3;

    fn new(
        mut socks: impl ExactSizeIterator<Item = BorrowedFd<'a>>,
        channel: BorrowedFd<'a>,
    ) -> Self {
        let n = socks.len();
        let mut fd = || PollFd::new(socks.next().unwrap_or(channel), PollFlags::POLLIN);
        if n <= Self::INLINE {
            Self::Inline(std::array::from_fn(|_| fd()), n + 1)
        } else {
            Self::Heap((0..=n).map(|_| fd()).collect())
        }
    }

    fn fds(&mut self) -> &mut [PollFd<'a>] {
        match self {
            Self::Inline(a, n) => &mut a[..*n],
            Self::Heap(v) => v,
        }
    }
}

/// How often a thread waiting on a CQ looks for a new GID table (the progress thread, which
/// follows the addresses, leaves the sockets to it meanwhile).
const TABLE_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Blocks until `cq` has a completion or `deadline` passes, driving the device's sockets on
/// this thread meanwhile. The datagram that completes a work request wakes the thread
/// waiting for it directly.
pub(crate) fn wait_cq(shared: &DevShared, cq: &CqShared, deadline: std::time::Instant) -> bool {
    if cq.has_completions() {
        return true;
    }
    shared.callers.fetch_add(1, Ordering::AcqRel);
    let got = 'table: loop {
        // The sockets of the GID table of the moment (taken again when it changes).
        let generation = shared.sockets.generation();
        let table = shared.sockets.load();
        let mut set = PollSet::new(
            table.receiving().map(|(_, s)| s.udp.as_fd()),
            cq.channel.as_fd(),
        );
        let fds = set.fds();
        break loop {
            if cq.has_completions() {
                break true;
            }
            if shared.sockets.generation() != generation {
                continue 'table;
            }
            let now_w = std::time::Instant::now();
            if now_w >= deadline {
                break false;
            }
            // Not returning yet: what was deferred goes out now (a streaming sender must not
            // wait for its ACKs until the sockets run dry).
            send_deferred(shared);
            if shared.config.busy_poll {
                // Responses to what arrives wait in `pending_tx` for the caller's next post or
                // the next pass here.
                if !caller_receive(shared) {
                    std::hint::spin_loop();
                }
                continue;
            }
            // Sleep on the sockets and the CQ's channel (the progress thread may complete work
            // for this CQ through a timer). ppoll is the check for data too: no read is tried
            // on a socket it has not found readable.
            cq.req_notify();
            if cq.has_completions() {
                break true;
            }
            let ts = TimeSpec::from_duration((deadline - now_w).min(TABLE_CHECK));
            let _ = ppoll(fds, Some(ts), None);
            // Woken by a datagram: this thread completes its own work, with no channel write.
            cq.disarm();
            let ready = |f: &PollFd<'_>| {
                f.revents()
                    .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLERR))
            };
            if fds.last().is_some_and(ready) {
                let _ = cq.channel.read();
            }
            if fds[..fds.len() - 1].iter().any(ready) {
                caller_receive(shared);
            }
        };
    };
    shared.callers.fetch_sub(1, Ordering::AcqRel);
    hand_over_deferred(shared);
    got
}

#[allow(clippy::too_many_arguments)]
fn deliver(
    core: &mut Core,
    mrs: &mut super::mr::MrTable,
    icrc: &mut IcrcChecker,
    sock_index: usize,
    local: SocketAddr,
    m: RxMeta,
    bytes: &mut [u8],
    t: Instant,
) {
    let c = &mut core.counters;
    c.rx_packets += 1;
    c.rx_bytes += m.len as u64;
    if m.truncated || bytes.len() < BthRepr::LEN + ICRC_LEN {
        c.malformed += 1;
        return;
    }
    let bth = BthPacket::new_unchecked(&bytes[..BthRepr::LEN]);
    let (qpn, opcode) = (bth.dest_qp().value(), bth.opcode());
    let Some(slot) = core.qps.get_mut(&qpn) else {
        c.unknown_qpn += 1;
        return;
    };
    // A connected QP takes packets from its peer only (from one UDP source port, once it
    // is pinned); a datagram QP from anyone.
    let datagram = matches!(slot.qp, QpKind::Ud(_));
    match slot.peer {
        Some((si, peer))
            if si == sock_index
                && peer.ip() == m.src.ip()
                && slot.src_port.is_none_or(|p| p == m.src.port()) => {}
        None if datagram => {}
        _ => {
            c.bad_source += 1;
            return;
        }
    }
    match icrc.check(m.src, local, bytes, m.index) {
        IcrcVerdict::Ok => {}
        IcrcVerdict::OkWithId(_) => c.icrc_ip_id_solved += 1,
        IcrcVerdict::Bad => {
            c.icrc_errors += 1;
            return;
        }
    }
    let mut bytes = bytes;
    if let Some(sealer) = slot.sealer.as_mut() {
        let Some(layout) = opcode.layout() else {
            c.malformed += 1;
            return;
        };
        let n = bytes.len();
        match sealer.open(bytes, n, BthRepr::LEN + layout.len()) {
            Ok(plain) => bytes = &mut bytes[..plain],
            Err(Rejected::Forged) => {
                c.auth_failed += 1;
                return;
            }
            Err(Rejected::Replayed) => {
                c.replayed += 1;
                return;
            }
        }
    }
    let bytes = &*bytes;
    if RocePacket::new_checked(bytes).is_err() {
        c.malformed += 1;
        return;
    }
    let ce = m.tos & 3 == 3;
    if ce {
        c.ecn_ce += 1;
    }
    let mut mem = PdMemory {
        table: mrs,
        pd: slot.pd,
        lends: None,
    };
    match &mut slot.qp {
        QpKind::Rc(q) => {
            // A QP on a shared receive queue takes a WQE when this packet needs one.
            if let Some(id) = slot.srq {
                if q.needs_recv_for(bytes) {
                    if let Some(wr) = core
                        .srqs
                        .get_mut(&id)
                        .and_then(|s| s.take(id, &mut core.events))
                    {
                        let _ = q.post_recv(wr);
                    }
                }
            }
            // Until the peer's port is pinned, see whether the engine takes this packet.
            let before = slot.src_port.is_none().then(|| q.stats());
            q.handle_packet(t, bytes, ce, &mut mem);
            if before.is_some_and(|b| accepted(&b, &q.stats())) {
                slot.src_port = Some(m.src.port());
            }
        }
        QpKind::Ud(q) => {
            let grh = monel_rc::ud::grh_for(
                IpAddress::from(m.src.ip()),
                IpAddress::from(local.ip()),
                m.tos,
                0,
                bytes.len(),
            );
            q.handle_packet(bytes, &grh, &mut mem);
        }
    }
    if core.dirty.last() != Some(&qpn) {
        core.dirty.push(qpn);
    }
}

/// Whether the RC engine took a packet (it counted no drop, error or duplicate): the first
/// such packet pins the peer's UDP source port.
fn accepted(before: &monel_rc::QpStats, after: &monel_rc::QpStats) -> bool {
    let rejects = |s: &monel_rc::QpStats| {
        s.dropped
            + s.out_of_sequence
            + s.access_errors
            + s.invalid_requests
            + s.duplicate_requests
            + s.duplicate_responses
            + s.seq_naks_sent
    };
    rejects(before) == rejects(after)
}

fn flush(tx: &mut TxBatch, socks: &SockTable, c: &mut crate::DeviceCounters) {
    let f = tx.flush(socks);
    c.tx_packets += f.sent;
    c.tx_errors += f.failed;
    c.tx_batches += f.calls;
    c.tx_segmented += f.segmented;
    c.tx_zero_copy_bytes += f.lent_bytes;
}

/// Which QPs a [`service`] pass looks at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Every QP: the progress thread's pass (it plans its next wake-up from the result).
    All,
    /// The QPs that received packets; their transmissions are deferred to `pending_tx`.
    Received,
    /// A QP just posted to, with the deferred ones.
    Posted(u32),
    /// The deferred ones.
    Deferred,
}

/// Runs due timers, transmits (or defers), moves completions and events out, for the QPs
/// `scope` names. Returns the earliest deadline among them; outside the progress thread's
/// own pass, rings it if that deadline comes before it planned to wake.
fn service(shared: &DevShared, tx: &mut TxBatch, scope: Scope) -> Option<Instant> {
    let mut guard = shared.core();
    let core = &mut *guard;
    // The QP list reuses one buffer: swapped with the list it takes over.
    let mut list = std::mem::take(&mut core.scratch);
    list.clear();
    match scope {
        Scope::All => {
            // A timer armed after this pass and before the thread plans its sleep must ring
            // (a ring before it sleeps ends the sleep).
            core.engine_wake_at = None;
            core.dirty.clear();
            core.pending_tx.clear();
            list.extend(core.qps.keys().copied());
        }
        Scope::Received => std::mem::swap(&mut list, &mut core.dirty),
        Scope::Posted(qpn) => {
            std::mem::swap(&mut list, &mut core.pending_tx);
            if !list.contains(&qpn) {
                list.push(qpn);
            }
        }
        Scope::Deferred => std::mem::swap(&mut list, &mut core.pending_tx),
    }
    if list.is_empty() {
        core.scratch = list;
        return None;
    }
    let transmit = scope != Scope::Received;
    let socks = shared.sockets.load();
    let mut mrs = shared.mrs.lock().unwrap_or_else(PoisonError::into_inner);
    let t = now(shared);
    let mut next: Option<Instant> = None;
    let mut out = Outputs::default();
    for &qpn in &list {
        let Some(slot) = core.qps.get_mut(&qpn) else {
            continue;
        };
        let d = service_slot(
            shared,
            &socks,
            tx,
            &mut mrs,
            &mut core.counters,
            &mut out,
            qpn,
            slot,
            t,
            transmit,
        );
        next = earliest(next, d);
        if !transmit && !core.pending_tx.contains(&qpn) {
            core.pending_tx.push(qpn);
        }
    }
    flush(tx, &socks, &mut core.counters);
    drop(mrs);
    core.scratch = list;
    core.events.extend(out.events);
    out.overflowed.dedup();
    core.events
        .extend(out.overflowed.into_iter().map(crate::AsyncEvent::CqError));
    let ring = scope != Scope::All && next.is_some_and(|d| engine_late(core, d));
    drop(guard);
    if ring {
        shared.ring();
    }
    next
}

/// Frames and queues a UD QP's packets, each to the destination its work request named.
fn transmit_datagrams(
    shared: &DevShared,
    socks: &SockTable,
    tx: &mut TxBatch,
    mrs: &mut super::mr::MrTable,
    counters: &mut crate::DeviceCounters,
    (qpn, pd): (u32, u32),
    ud: &mut monel_rc::UdQp,
) {
    let mem = PdMemory {
        table: mrs,
        pd,
        lends: None,
    };
    loop {
        if tx.is_full() {
            flush(tx, socks, counters);
        }
        let buf = tx.next_buf();
        let Some(o) = ud.poll_transmit(&mut buf[TX_HEADROOM..], &mem) else {
            break;
        };
        // The address handle was checked when it was made; a GID table that changed since
        // makes this packet undeliverable.
        let Ok((si, peer)) = shared.resolve_av("ibv_post_send", &o.av) else {
            counters.tx_errors += 1;
            continue;
        };
        let lane = socks.lane_of(si, qpn);
        let Some(framing) = framing_to(shared, socks, si, lane, peer, o.av.hop_limit) else {
            counters.tx_errors += 1;
            continue;
        };
        queue_packet(tx, counters, &framing, (si, lane), peer, o.len);
    }
}

/// The IP/UDP framing of packets from socket `si` to `peer` (`None` once GID `si` is
/// cleared).
fn framing_to(
    shared: &DevShared,
    socks: &SockTable,
    si: usize,
    lane: usize,
    peer: SocketAddr,
    hop_limit: u8,
) -> Option<FrameRepr> {
    let local = socks.sender(si, lane)?.local;
    Some(FrameRepr {
        src: IpAddress::from(local.ip()),
        dst: IpAddress::from(peer.ip()),
        src_port: local.port(),
        dst_port: peer.port(),
        traffic_class: shared.config.traffic_class(),
        hop_limit,
        ident: 0,
        flow_label: 0,
    })
}

/// Queues for `peer` the `len`-byte RoCE packet just written after the headroom of the
/// batch's next buffer (framed, ICRC included, when the batch is flushed).
fn queue_packet(
    tx: &mut TxBatch,
    counters: &mut crate::DeviceCounters,
    framing: &FrameRepr,
    (si, lane): (usize, usize),
    peer: SocketAddr,
    len: usize,
) {
    if tx.push(si, lane, peer, len, *framing) {
        counters.tx_bytes += len as u64;
    } else {
        counters.tx_errors += 1;
    }
}

/// Events and overflowed CQs gathered while servicing QPs.
#[derive(Default)]
struct Outputs {
    overflowed: Vec<u32>,
    events: Vec<crate::AsyncEvent>,
}

/// One QP's timers, transmissions and completions. Returns its next deadline.
#[allow(clippy::too_many_arguments)]
fn service_slot(
    shared: &DevShared,
    socks: &SockTable,
    tx: &mut TxBatch,
    mrs: &mut super::mr::MrTable,
    counters: &mut crate::DeviceCounters,
    out: &mut Outputs,
    qpn: u32,
    slot: &mut super::shared::QpSlot,
    t: Instant,
    transmit: bool,
) -> Option<Instant> {
    if slot.qp.poll_timeout().is_some_and(|d| d <= t) {
        slot.qp.handle_timeout(t);
    }
    // A QP whose source GID was cleared sends nothing: its retry timer ends it.
    let rc_path = match (transmit, slot.peer, &slot.qp) {
        (true, Some((si, peer)), QpKind::Rc(rc)) => {
            let lane = socks.lane_of(si, qpn);
            framing_to(shared, socks, si, lane, peer, rc.attr().ah_attr.hop_limit)
                .map(|f| (f, si, lane, peer))
        }
        _ => None,
    };
    if let (Some((framing, si, lane, peer)), QpKind::Rc(rc)) = (rc_path, &mut slot.qp) {
        loop {
            if tx.is_full() {
                flush(tx, socks, counters);
            }
            // Payloads of requests are lent straight from registered memory, unless the
            // packet is sealed (its tag covers the payload).
            let (buf, lends) = tx.next_buf_lending();
            let mem = PdMemory {
                table: &mut *mrs,
                pd: slot.pd,
                lends: (shared.config.zero_copy && slot.sealer.is_none()).then_some(lends),
            };
            let room = buf.len() - TRAILER;
            let Some(o) = rc.poll_transmit(t, &mut buf[TX_HEADROOM..room], &mem) else {
                break;
            };
            let len = match slot.sealer.as_mut() {
                Some(s) => {
                    let p = &mut buf[TX_HEADROOM..];
                    let hdr = RocePacket::new_checked(&p[..o.len]).map_or(0, |p| p.header_len());
                    s.seal(p, o.len, hdr)
                }
                None => o.len,
            };
            queue_packet(tx, counters, &framing, (si, lane), peer, len);
        }
    }
    if let (true, QpKind::Ud(ud)) = (transmit, &mut slot.qp) {
        transmit_datagrams(shared, socks, tx, mrs, counters, (qpn, slot.pd), ud);
    }
    // Completions go to their CQ in one locked push, without a buffer of their own.
    if let Some(first) = slot.qp.poll_send_completion() {
        let rest = std::iter::from_fn(|| slot.qp.poll_send_completion());
        if !slot.send_cq.push(std::iter::once(first).chain(rest)) {
            out.overflowed.push(slot.send_cq.id);
        }
    }
    if let Some(first) = slot.qp.poll_recv_completion() {
        let rest = std::iter::from_fn(|| slot.qp.poll_recv_completion());
        if !slot.recv_cq.push(std::iter::once(first).chain(rest)) {
            out.overflowed.push(slot.recv_cq.id);
        }
    }
    while let Some(e) = slot.qp.poll_event() {
        out.events
            .extend(device_event(monel_wire::Qpn::new(qpn), e));
    }
    slot.qp.poll_timeout()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_set_lists_the_sockets_then_the_channel_on_the_stack_or_the_heap() {
        use std::os::fd::AsRawFd;
        let socks: Vec<std::net::UdpSocket> = (0..5)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let channel = nix::sys::eventfd::EventFd::new().unwrap();
        for k in 0..=socks.len() {
            let mut set = PollSet::new(socks[..k].iter().map(|s| s.as_fd()), channel.as_fd());
            assert_eq!(matches!(set, PollSet::Inline(..)), k <= PollSet::INLINE);
            let raw: Vec<i32> = set.fds().iter().map(|f| f.as_fd().as_raw_fd()).collect();
            let mut want: Vec<i32> = socks[..k].iter().map(|s| s.as_raw_fd()).collect();
            want.push(channel.as_raw_fd());
            assert_eq!(raw, want, "{k} sockets");
        }
    }

    #[test]
    fn icrc_check_accepts_zero_id_and_solves_other_ids() {
        let src: SocketAddr = "10.77.0.2:49441".parse().unwrap();
        let dst: SocketAddr = "10.77.0.1:4791".parse().unwrap();
        let roce_len = 12 + 8 + ICRC_LEN;
        let mut buf = vec![0u8; 28 + roce_len];
        buf[28] = 0x04; // SEND_ONLY
        buf[30] = 0xff;
        buf[31] = 0xff;
        buf[35] = 0x11;
        buf[40..48].copy_from_slice(b"payload!");
        for ident in [0u16, 0x1234] {
            let f = FrameRepr {
                src: IpAddress::from(src.ip()),
                dst: IpAddress::from(dst.ip()),
                src_port: src.port(),
                dst_port: dst.port(),
                traffic_class: 0x02,
                hop_limit: 1,
                ident,
                flow_label: 0,
            };
            f.emit(&mut buf, roce_len).unwrap();
            let mut c = IcrcChecker::new();
            let want = if ident == 0 {
                IcrcVerdict::Ok
            } else {
                IcrcVerdict::OkWithId(ident)
            };
            assert_eq!(c.check(src, dst, &buf[28..], 0), want);
            // The right guess (a GSO segment's place in a coalesced buffer) needs no solving;
            // a wrong one still finds the ID.
            assert_eq!(c.check(src, dst, &buf[28..], ident), IcrcVerdict::Ok);
            if ident != 0 {
                assert_eq!(
                    c.check(src, dst, &buf[28..], 7),
                    IcrcVerdict::OkWithId(ident)
                );
            }
            let mut bad = buf[28..].to_vec();
            bad[14] ^= 0x40;
            for guess in [0, 7, ident] {
                assert_eq!(c.check(src, dst, &bad, guess), IcrcVerdict::Bad);
            }
            let other: SocketAddr = "10.77.0.3:49441".parse().unwrap();
            assert_eq!(c.check(other, dst, &buf[28..], 0), IcrcVerdict::Bad);
        }
    }
}
