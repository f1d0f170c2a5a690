//! The progress engine: the thread that plays the NIC. It receives batches of datagrams,
//! checks and demultiplexes them to QPs, runs timers, gathers outgoing packets from every
//! QP with work, frames them (IP/UDP pseudo-headers for the ICRC) and sends them in batches.
//! It sleeps in poll(2) on the sockets and the doorbell unless busy-polling.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use monel_rc::Instant;
use monel_wire::icrc::{self, Ipv4IdBasis};
use monel_wire::{FrameRepr, ICRC_LEN, IpAddress, RocePacket};
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

use crate::context::{Core, DevShared, device_event};
use crate::mr::PdMemory;
use crate::netio::{RxBatch, RxMeta, TX_HEADROOM, TxBatch};

fn wire_ip(ip: IpAddr) -> IpAddress {
    match ip {
        IpAddr::V4(a) => IpAddress::V4(a.octets()),
        IpAddr::V6(a) => IpAddress::V6(a.octets()),
    }
}

/// Checks the ICRC of a datagram received on a UDP socket. IPv6: every covered field is known.
/// IPv4: the IP ID is not visible, so the check assumes 0 (what Monel and other senders with
/// DF on unconnected sockets send) and otherwise solves for the ID (rxe numbers its packets).
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

    pub(crate) fn check(&mut self, src: SocketAddr, dst: SocketAddr, roce: &[u8]) -> IcrcVerdict {
        if roce.len() < 12 + ICRC_LEN {
            return IcrcVerdict::Bad;
        }
        let framing = FrameRepr {
            src: wire_ip(src.ip()),
            dst: wire_ip(dst.ip()),
            src_port: src.port(),
            dst_port: dst.port(),
            traffic_class: 0,
            hop_limit: 0,
            ident: 0,
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
            if let Some(id) = basis.solve(computed, carried) {
                return IcrcVerdict::OkWithId(id);
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

/// The progress loop; returns when the context is dropped.
pub(crate) fn run(shared: &DevShared) {
    // Timers of microseconds need the kernel to wake us when asked (default slack: 50 us).
    let _ = nix::sys::prctl::set_timerslack(1_000);
    let n = shared.config.batch;
    let mut rx = RxBatch::new(n);
    let mut tx = TxBatch::new(n);
    let mut icrc = IcrcChecker::new();
    let mut next_timer: Option<Instant> = None;
    let mut fds: Vec<PollFd<'_>> = shared
        .sockets
        .socks
        .iter()
        .map(|s| PollFd::new(s.udp.as_fd(), PollFlags::POLLIN))
        .chain([PollFd::new(shared.doorbell.as_fd(), PollFlags::POLLIN)])
        .collect();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        if !shared.config.busy_poll {
            // Nanosecond timeouts: pacing gaps and retransmit timers are microseconds apart.
            let wait_ns = match next_timer {
                None => MAX_SLEEP_NS,
                Some(t) => t
                    .as_nanos()
                    .saturating_sub(now(shared).as_nanos())
                    .min(MAX_SLEEP_NS),
            };
            let ts = TimeSpec::from_duration(std::time::Duration::from_nanos(wait_ns));
            let _ = ppoll(&mut fds, Some(ts), None);
            let _ = shared.doorbell.read();
        }
        // Receive.
        for (si, sock) in shared.sockets.socks.iter().enumerate() {
            loop {
                let got = rx.recv(sock);
                if got == 0 {
                    break;
                }
                let mut core = shared.core();
                core.counters.rx_batches += 1;
                let mut mrs = shared.mrs.lock().unwrap_or_else(PoisonError::into_inner);
                let t = now(shared);
                for i in 0..got {
                    let m = rx.meta[i];
                    deliver(
                        &mut core,
                        &mut mrs,
                        &mut icrc,
                        si,
                        sock.local,
                        m,
                        &rx.bufs[i][..m.len],
                        t,
                    );
                }
                drop(mrs);
                drop(core);
                if got < n {
                    break;
                }
            }
        }
        // Timers, transmit, completions.
        next_timer = service(shared, &mut tx);
    }
}

#[allow(clippy::too_many_arguments)]
fn deliver(
    core: &mut Core,
    mrs: &mut crate::mr::MrTable,
    icrc: &mut IcrcChecker,
    sock_index: usize,
    local: SocketAddr,
    m: RxMeta,
    bytes: &[u8],
    t: Instant,
) {
    let c = &mut core.counters;
    c.rx_packets += 1;
    c.rx_bytes += m.len as u64;
    if m.truncated {
        c.malformed += 1;
        return;
    }
    let Ok(pkt) = RocePacket::new_checked(bytes) else {
        c.malformed += 1;
        return;
    };
    let qpn = pkt.bth().dest_qp().value();
    let Some(slot) = core.qps.get_mut(&qpn) else {
        c.unknown_qpn += 1;
        return;
    };
    match slot.peer {
        Some((si, peer)) if si == sock_index && peer.ip() == m.src.ip() => {}
        _ => {
            c.bad_source += 1;
            return;
        }
    }
    match icrc.check(m.src, local, bytes) {
        IcrcVerdict::Ok => {}
        IcrcVerdict::OkWithId(_) => c.icrc_ip_id_solved += 1,
        IcrcVerdict::Bad => {
            c.icrc_errors += 1;
            return;
        }
    }
    let ce = m.tos & 3 == 3;
    if ce {
        c.ecn_ce += 1;
    }
    let mut mem = PdMemory {
        table: mrs,
        pd: slot.pd,
    };
    slot.qp.handle_packet(t, bytes, ce, &mut mem);
}

fn flush(tx: &mut TxBatch, shared: &DevShared, c: &mut crate::DeviceCounters) {
    let (sent, failed, calls) = tx.flush(&shared.sockets);
    c.tx_packets += sent;
    c.tx_errors += failed;
    c.tx_batches += calls;
}

/// Runs due timers, transmits, moves completions and events out. Returns the next deadline.
fn service(shared: &DevShared, tx: &mut TxBatch) -> Option<Instant> {
    let tc = shared.config.traffic_class();
    let mut core = shared.core();
    let mut mrs = shared.mrs.lock().unwrap_or_else(PoisonError::into_inner);
    let t = now(shared);
    let core = &mut *core;
    let mut next: Option<Instant> = None;
    let mut overflowed = Vec::new();
    let mut events = Vec::new();
    for (&qpn, slot) in core.qps.iter_mut() {
        if slot.qp.poll_timeout().is_some_and(|d| d <= t) {
            slot.qp.handle_timeout(t);
        }
        if let Some((si, peer)) = slot.peer {
            let local = shared.sockets.socks[si].local;
            let framing = FrameRepr {
                src: wire_ip(local.ip()),
                dst: wire_ip(peer.ip()),
                src_port: local.port(),
                dst_port: peer.port(),
                traffic_class: tc,
                hop_limit: slot.qp.attr().ah_attr.hop_limit,
                ident: 0,
                flow_label: 0,
            };
            let start = TX_HEADROOM - framing.header_len();
            let mem = PdMemory {
                table: &mut mrs,
                pd: slot.pd,
            };
            loop {
                if tx.is_full() {
                    flush(tx, shared, &mut core.counters);
                }
                let buf = tx.next_buf();
                let Some(out) = slot.qp.poll_transmit(t, &mut buf[TX_HEADROOM..], &mem) else {
                    break;
                };
                if framing.emit(&mut buf[start..], out.len).is_err() {
                    core.counters.tx_errors += 1;
                    continue;
                }
                core.counters.tx_bytes += out.len as u64;
                tx.items.push((si, peer, TX_HEADROOM, out.len));
            }
        }
        let mut wcs = Vec::new();
        while let Some(wc) = slot.qp.poll_send_completion() {
            wcs.push(wc);
        }
        if !wcs.is_empty() && !slot.send_cq.push(wcs.drain(..)) {
            overflowed.push(slot.send_cq.id);
        }
        while let Some(wc) = slot.qp.poll_recv_completion() {
            wcs.push(wc);
        }
        if !wcs.is_empty() && !slot.recv_cq.push(wcs.drain(..)) {
            overflowed.push(slot.recv_cq.id);
        }
        while let Some(e) = slot.qp.poll_event() {
            events.extend(device_event(monel_wire::Qpn::new(qpn), e));
        }
        if let Some(d) = slot.qp.poll_timeout() {
            next = Some(next.map_or(d, |n: Instant| n.min(d)));
        }
    }
    flush(tx, shared, &mut core.counters);
    core.events.extend(events);
    overflowed.dedup();
    core.events.extend(
        overflowed
            .into_iter()
            .map(crate::context::AsyncEvent::CqError),
    );
    next
}

#[cfg(test)]
mod tests {
    use super::*;

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
                src: wire_ip(src.ip()),
                dst: wire_ip(dst.ip()),
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
            assert_eq!(c.check(src, dst, &buf[28..]), want);
            let mut bad = buf[28..].to_vec();
            bad[14] ^= 0x40;
            assert_eq!(c.check(src, dst, &bad), IcrcVerdict::Bad);
            let other: SocketAddr = "10.77.0.3:49441".parse().unwrap();
            assert_eq!(c.check(other, dst, &buf[28..]), IcrcVerdict::Bad);
        }
    }
}
