//! Packets waiting to be sent: the engine writes each into a buffer of the batch (or writes
//! its headers and lends its payload straight from registered memory); a flush frames them
//! (IP/UDP headers and ICRC, once each packet's IPv4 ID is known), groups runs into GSO
//! messages and sends them with one sendmmsg per socket.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use monel_wire::icrc::IcrcStream;
use monel_wire::{FrameRepr, ICRC_LEN, IpAddress, RocePacket};

use super::gso::{self, Message};
use super::mmsg::{SendHeaders, Src};
use super::mr::{Lent, MrShared, MrView};
use super::netio::{MAX_DATAGRAM, Sock, SockTable};

/// A packet queued for sending: the RoCE packet sits at `TX_HEADROOM..TX_HEADROOM + len` of
/// its buffer, except for payload ranges lent from registered memory (`lent` indexes the
/// batch's list). It is framed (ICRC) when the batch is flushed, once its IPv4 ID is known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxItem {
    pub(crate) si: usize,
    /// Which of the GID's sockets sends it (see [`SockTable::sender`]).
    pub(crate) lane: usize,
    pub(crate) peer: SocketAddr,
    pub(crate) len: usize,
    pub(crate) framing: FrameRepr,
    lent: (usize, usize),
    /// Where the payload starts (known for packets with lent payload).
    hdr: usize,
}

/// What one flush did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Flushed {
    pub(crate) sent: u64,
    pub(crate) failed: u64,
    pub(crate) calls: u64,
    /// Packets that left inside GSO messages.
    pub(crate) segmented: u64,
    /// Payload bytes sent straight from registered memory.
    pub(crate) lent_bytes: u64,
}

/// Packets waiting for sendmmsg calls: runs of equal-size packets to one peer leave as GSO
/// messages where the socket allows (see [`crate::gso`]).
///
/// A batch holding lent payloads must be flushed before the memory-key table's lock is
/// released: that lock is what keeps a raw registration's memory valid.
pub(crate) struct TxBatch {
    bufs: Vec<Vec<u8>>,
    items: Vec<TxItem>,
    /// Payload ranges the engine lent to the packet being built (moved to `lent` by `push`).
    pending: RefCell<Vec<Lent>>,
    lent: Vec<Lent>,
    out: SendHeaders,
    mine: Vec<usize>,
    keyed: Vec<(SocketAddr, usize)>,
    msgs: Vec<Message>,
    senders: Vec<(usize, usize)>,
}

/// Room in front of each packet for the IP and UDP headers the ICRC needs.
pub(crate) const TX_HEADROOM: usize = 48;

/// One piece of a packet with lent payload: bytes of its buffer (offsets from the packet's
/// start), or bytes of lent range `k`.
#[derive(Debug, Clone, Copy)]
enum Piece {
    Buf(usize, usize),
    Lent(usize),
}

/// The pieces of a `len`-byte packet whose payload starts at `hdr` and whose lent ranges are
/// `lent` (in payload order), in wire order; `f` gets each with its length.
fn pieces(len: usize, hdr: usize, lent: &[Lent], mut f: impl FnMut(Piece, usize)) {
    let mut at = 0;
    for (k, l) in lent.iter().enumerate() {
        let start = hdr + l.at;
        if start > at {
            f(Piece::Buf(at, start), start - at);
        }
        f(Piece::Lent(k), l.len);
        at = start + l.len;
    }
    if len > at {
        f(Piece::Buf(at, len), len - at);
    }
}

impl TxBatch {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            bufs: (0..n)
                .map(|_| vec![0u8; TX_HEADROOM + MAX_DATAGRAM])
                .collect(),
            items: Vec::with_capacity(n),
            pending: RefCell::new(Vec::new()),
            lent: Vec::new(),
            out: SendHeaders::new(),
            mine: Vec::with_capacity(n),
            keyed: Vec::with_capacity(n),
            msgs: Vec::with_capacity(n),
            senders: Vec::new(),
        }
    }
    pub(crate) fn is_full(&self) -> bool {
        self.items.len() == self.bufs.len()
    }
    /// The next free buffer.
    pub(crate) fn next_buf(&mut self) -> &mut [u8] {
        self.pending.get_mut().clear();
        let i = self.items.len();
        &mut self.bufs[i]
    }
    /// The next free buffer, and where the engine notes payload ranges it lends to the
    /// packet it writes there instead of copying them (see [`super::mr::PdMemory`]).
    pub(crate) fn next_buf_lending(&mut self) -> (&mut [u8], &RefCell<Vec<Lent>>) {
        self.pending.get_mut().clear();
        let i = self.items.len();
        (&mut self.bufs[i], &self.pending)
    }

    /// Queues the `len`-byte RoCE packet just written after the headroom of the next buffer
    /// (with the payload ranges lent meanwhile). Returns false (nothing queued) if it cannot
    /// be framed.
    pub(crate) fn push(
        &mut self,
        si: usize,
        lane: usize,
        peer: SocketAddr,
        len: usize,
        framing: FrameRepr,
    ) -> bool {
        let pending = self.pending.get_mut();
        // What `FrameRepr::emit` needs, checked here so the flush (which frames once the IP
        // IDs are known) cannot fail.
        let same_family = matches!(
            (framing.src, framing.dst),
            (IpAddress::V4(_), IpAddress::V4(_)) | (IpAddress::V6(_), IpAddress::V6(_))
        );
        let i = self.items.len();
        let fits = len >= 12 + ICRC_LEN && TX_HEADROOM + len <= self.bufs[i].len();
        // Lent ranges must lie inside the payload, in order.
        let hdr = if pending.is_empty() || !fits {
            0
        } else {
            RocePacket::new_checked(&self.bufs[i][TX_HEADROOM..TX_HEADROOM + len])
                .map_or(len, |p| p.header_len())
        };
        let lends_fit = pending.is_empty() || {
            let mut at = 0;
            pending.iter().all(|l| {
                let ok = l.at >= at && hdr + l.at + l.len <= len - ICRC_LEN;
                at = l.at + l.len;
                ok
            })
        };
        if !fits || !same_family || !lends_fit {
            pending.clear();
            return false;
        }
        let start = self.lent.len();
        self.lent.append(pending);
        self.items.push(TxItem {
            si,
            lane,
            peer,
            len,
            framing,
            lent: (start, self.lent.len()),
            hdr,
        });
        true
    }

    /// Frames and sends everything queued, socket by socket, in order.
    pub(crate) fn flush(&mut self, socks: &SockTable) -> Flushed {
        let mut f = Flushed::default();
        // Lent payloads: each region they come from is held for reading until sent.
        let mut views: Vec<(*const MrShared, MrView<'_>)> = Vec::new();
        let mut view_of: Vec<usize> = Vec::with_capacity(self.lent.len());
        for l in &self.lent {
            let p = Arc::as_ptr(&l.mr);
            let v = views.iter().position(|v| v.0 == p).unwrap_or_else(|| {
                views.push((p, l.mr.view()));
                views.len() - 1
            });
            view_of.push(v);
            f.lent_bytes += l.len as u64;
        }
        let slices: Vec<&[u8]> = views.iter().map(|v| v.1.bytes()).collect();
        // The sockets in use, in the order of their first packet.
        self.senders.clear();
        for it in &self.items {
            if !self.senders.contains(&(it.si, it.lane)) {
                self.senders.push((it.si, it.lane));
            }
        }
        for s in 0..self.senders.len() {
            let (si, lane) = self.senders[s];
            self.mine.clear();
            self.mine.extend(
                (0..self.items.len())
                    .filter(|&i| self.items[i].si == si && self.items[i].lane == lane),
            );
            if self.mine.is_empty() {
                continue;
            }
            // The GID was cleared since these packets were queued.
            let Some(sock) = socks.sender(si, lane) else {
                f.failed += self.mine.len() as u64;
                continue;
            };
            self.keyed.clear();
            self.keyed.extend(
                self.mine
                    .iter()
                    .map(|&i| (self.items[i].peer, self.items[i].len)),
            );
            if sock.gso.load(Ordering::Relaxed) {
                gso::plan(&self.keyed, &mut self.msgs);
            } else {
                self.msgs.clear();
                self.msgs
                    .extend(self.keyed.iter().enumerate().map(|(k, p)| Message {
                        first: k,
                        count: 1,
                        seg: p.1,
                    }));
            }
            self.out.clear();
            for m in &self.msgs {
                let peer = self.items[self.mine[m.first]].peer;
                let gso = (m.count > 1).then(|| u16::try_from(m.seg).ok()).flatten();
                self.out.message(peer, gso);
                for k in 0..m.count {
                    let i = self.mine[m.first + k];
                    let it = self.items[i];
                    // The ICRC now that the IPv4 ID is known: the k-th segment of a message
                    // gets k.
                    let mut framing = it.framing;
                    framing.ident = k as u16;
                    let lent = &self.lent[it.lent.0..it.lent.1];
                    let views = &view_of[it.lent.0..it.lent.1];
                    frame(
                        &framing,
                        &mut self.bufs[i],
                        (it.len, it.hdr),
                        lent,
                        views,
                        &slices,
                    );
                    pieces(it.len, it.hdr, lent, |p, n| match p {
                        Piece::Buf(a, _) => self.out.segment(Src::Buf(i), TX_HEADROOM + a, n),
                        Piece::Lent(k) => self.out.segment(Src::View(views[k]), lent[k].off, n),
                    });
                    self.out.packet();
                }
            }
            send_all(&mut self.out, &self.bufs, &slices, sock, &mut f);
        }
        self.items.clear();
        drop(slices);
        drop(views);
        self.lent.clear();
        f
    }
}

/// Writes the IP/UDP headers into the headroom and the ICRC into the trailer of a `len`-byte
/// packet, whose payload (from `hdr`) may be partly lent: the ICRC runs over its pieces in
/// wire order.
fn frame(
    framing: &FrameRepr,
    buf: &mut [u8],
    (len, hdr): (usize, usize),
    lent: &[Lent],
    views: &[usize],
    slices: &[&[u8]],
) {
    let hl = framing.header_len();
    let start = TX_HEADROOM - hl;
    // Checked by `push`.
    if framing
        .emit_headers(&mut buf[start..TX_HEADROOM], len)
        .is_err()
    {
        return;
    }
    let (head, packet) = buf.split_at_mut(TX_HEADROOM);
    let Ok(mut crc) = IcrcStream::new(
        &head[start..start + hl - 8],
        &head[start + hl - 8..],
        &packet[..12],
    ) else {
        return;
    };
    let body = len - ICRC_LEN;
    pieces(body, hdr, lent, |p, _| match p {
        Piece::Buf(a, b) => crc.update(&packet[a.max(12)..b]),
        Piece::Lent(k) => {
            let l = &lent[k];
            crc.update(&slices[views[k]][l.off..l.off + l.len]);
        }
    });
    packet[body..len].copy_from_slice(&crc.finish().to_le_bytes());
}

/// Sends the messages built for `sock`, waiting for room when its buffer is full.
fn send_all(
    out: &mut SendHeaders,
    bufs: &[Vec<u8>],
    views: &[&[u8]],
    sock: &Sock,
    f: &mut Flushed,
) {
    let (mut done, mut stalls) = (0, 0);
    while done < out.len() {
        f.calls += 1;
        match out.send(sock.udp.as_raw_fd(), bufs, views, done) {
            Ok(n) => {
                for m in done..done + n {
                    let count = out.packets(m) as u64;
                    f.sent += count;
                    if count > 1 {
                        f.segmented += count;
                    }
                }
                done += n;
                if n == 0 {
                    f.failed += out.packets(done) as u64;
                    done += 1;
                }
            }
            Err(nix::errno::Errno::EAGAIN) if stalls < 100 => {
                // Socket buffer full: wait for room rather than drop.
                stalls += 1;
                let mut p = [nix::poll::PollFd::new(
                    sock.udp.as_fd(),
                    nix::poll::PollFlags::POLLOUT,
                )];
                let _ = nix::poll::poll(&mut p, 10u16);
            }
            Err(e) => {
                // Unreachable peer, EMSGSIZE...: the packets are lost; RC retransmits. A
                // kernel or route that refuses segmentation gets plain datagrams from now.
                let count = out.packets(done);
                if count > 1
                    && matches!(
                        e,
                        nix::errno::Errno::EINVAL
                            | nix::errno::Errno::EIO
                            | nix::errno::Errno::EOPNOTSUPP
                            | nix::errno::Errno::ENOPROTOOPT
                    )
                {
                    sock.gso.store(false, Ordering::Relaxed);
                }
                f.failed += count as u64;
                done += 1;
            }
        }
    }
}
