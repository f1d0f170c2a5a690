//! recvmmsg and sendmmsg over headers that live as long as their batch: nothing is allocated
//! or zeroed per call. Reads the control messages the soft RNIC takes (IPv4 TOS or IPv6
//! traffic class, and the GRO segment size) and gives each sent message its own GSO segment
//! size, so messages of different sizes share one call.

use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// `SOL_UDP` control messages (linux/udp.h).
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Control buffer of a received datagram (aligned words): room for TOS and GRO with margin.
type RecvCtrl = [u64; 16];
/// Control buffer of a sent message: one `UDP_SEGMENT` (u16) message.
type SendCtrl = [u64; 4];

/// One received datagram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Bytes the kernel wrote.
    pub(crate) len: usize,
    /// Longer than its buffer (`MSG_TRUNC`).
    pub(crate) truncated: bool,
    /// The sender, if the kernel gave an IPv4 or IPv6 address.
    pub(crate) src: Option<SocketAddr>,
    /// IPv4 TOS or IPv6 traffic class (ECN in the low two bits).
    pub(crate) tos: u8,
    /// GRO coalesced datagrams of this size.
    pub(crate) gro: Option<usize>,
}

/// Headers for receiving up to `n` datagrams in one call.
pub(crate) struct RecvHeaders {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<RecvCtrl>,
    /// Headers the last call used (their lengths and flags need restoring).
    dirty: usize,
}

fn empty_hdr() -> libc::mmsghdr {
    // SAFETY: mmsghdr is plain C data (integers and pointers); all zeroes is a valid value
    // (null pointers, zero lengths), and every pointer is set before any call reads it.
    #[allow(unsafe_code)]
    unsafe {
        std::mem::zeroed()
    }
}

fn empty_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain C data; all zeroes is AF_UNSPEC.
    #[allow(unsafe_code)]
    unsafe {
        std::mem::zeroed()
    }
}

impl RecvHeaders {
    pub(crate) fn new(n: usize) -> Self {
        let mut r = Self {
            hdrs: (0..n).map(|_| empty_hdr()).collect(),
            iovs: (0..n)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
            names: (0..n).map(|_| empty_storage()).collect(),
            ctrl: vec![[0; 16]; n],
            dirty: 0,
        };
        // The arrays never grow, so these pointers into them stay valid.
        for i in 0..n {
            let h = &mut r.hdrs[i].msg_hdr;
            h.msg_name = (&raw mut r.names[i]).cast();
            h.msg_iov = &raw mut r.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = r.ctrl[i].as_mut_ptr().cast();
        }
        r.reset(n);
        r
    }

    /// Restores the lengths and flags the kernel rewrote in the first `k` headers.
    fn reset(&mut self, k: usize) {
        for h in &mut self.hdrs[..k] {
            h.msg_len = 0;
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = size_of::<RecvCtrl>() as _;
            h.msg_hdr.msg_flags = 0;
        }
    }

    /// Receives without blocking into `bufs` (one datagram each, at most as many as the
    /// headers were made for); hands each one that arrived to `each`, in order. Returns the
    /// count (0 also on an error: the socket is read again later).
    pub(crate) fn recv(
        &mut self,
        fd: RawFd,
        bufs: &mut [Vec<u8>],
        mut each: impl FnMut(Received),
    ) -> usize {
        let n = bufs.len().min(self.hdrs.len());
        for (iov, b) in self.iovs.iter_mut().zip(bufs.iter_mut()) {
            iov.iov_base = b.as_mut_ptr().cast();
            iov.iov_len = b.len();
        }
        self.reset(self.dirty);
        // SAFETY: the first `n` headers point at live buffers of the lengths their headers
        // give: `bufs` (borrowed mutably for this call; its iovecs were just set) and this
        // struct's name, iovec and control arrays, which never grow or move their contents;
        // the kernel writes within them.
        #[allow(unsafe_code)]
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let Ok(got) = usize::try_from(r) else {
            self.dirty = 0;
            return 0;
        };
        self.dirty = got;
        for ((h, name), buf) in self.hdrs.iter().zip(&self.names).zip(&*bufs).take(got) {
            let (tos, gro) = read_ctrl(&h.msg_hdr);
            each(Received {
                len: (h.msg_len as usize).min(buf.len()),
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                src: from_storage(name, h.msg_hdr.msg_namelen),
                tos,
                gro,
            });
        }
        got
    }
}

/// TOS/traffic class and GRO segment size from a received header's control messages.
fn read_ctrl(h: &libc::msghdr) -> (u8, Option<usize>) {
    let (mut tos, mut gro) = (0u8, None);
    // SAFETY: `h` was filled by recvmmsg: its control pointer and (kernel-shrunk) length
    // describe this struct's live control buffer, so the CMSG_* walk stays inside it; each
    // data read is bounds-checked against the message's own length and reads unaligned.
    #[allow(unsafe_code)]
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let m = &*c;
            let data = libc::CMSG_DATA(c);
            let room = (m.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            let int = |d: *const u8| -> Option<i32> {
                (room >= size_of::<i32>()).then(|| d.cast::<i32>().read_unaligned())
            };
            match (m.cmsg_level, m.cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) if room >= 1 => tos = *data,
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    tos = int(data).map_or(0, |v| v as u8);
                }
                (SOL_UDP, UDP_GRO) => {
                    gro = int(data)
                        .and_then(|g| usize::try_from(g).ok())
                        .filter(|&g| g > 0);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    (tos, gro)
}

/// The socket address in `s` (of `len` bytes, as the kernel wrote it).
fn from_storage(s: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the kernel wrote an AF_INET address of sockaddr_in's size into this
            // storage, which is larger and at least as aligned.
            #[allow(unsafe_code)]
            let a = unsafe { &*(&raw const *s).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            #[allow(unsafe_code)]
            let a = unsafe { &*(&raw const *s).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `a` as a sockaddr for the kernel, with its length.
fn to_storage(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    let mut s = empty_storage();
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and as aligned as sockaddr_in.
            #[allow(unsafe_code)]
            unsafe {
                (&raw mut s).cast::<libc::sockaddr_in>().write(sin);
            }
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            #[allow(unsafe_code)]
            unsafe {
                (&raw mut s).cast::<libc::sockaddr_in6>().write(sin6);
            }
            size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

/// Where a segment's bytes are: one of the caller's packet buffers, or one of its views of
/// registered memory (zero-copy payloads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Src {
    Buf(usize),
    View(usize),
}

/// One message being built: its segments `first..first + count` of the segment list.
#[derive(Clone, Copy)]
struct Msg {
    first: usize,
    count: usize,
    packets: usize,
    gso: Option<u16>,
}

/// Messages for sendmmsg, each a gather of byte ranges of the caller's buffers to one peer,
/// with its own GSO segment size.
pub(crate) struct SendHeaders {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    ctrl: Vec<SendCtrl>,
    msgs: Vec<Msg>,
    /// (source, start, length).
    segs: Vec<(Src, usize, usize)>,
    /// Peer of the newest message (its sockaddr is reused while the peer stays).
    last_peer: Option<SocketAddr>,
}

impl SendHeaders {
    pub(crate) fn new() -> Self {
        Self {
            hdrs: Vec::new(),
            iovs: Vec::new(),
            names: Vec::new(),
            ctrl: Vec::new(),
            msgs: Vec::new(),
            segs: Vec::new(),
            last_peer: None,
        }
    }

    /// Forgets every message.
    pub(crate) fn clear(&mut self) {
        self.msgs.clear();
        self.segs.clear();
    }

    /// Messages queued.
    pub(crate) fn len(&self) -> usize {
        self.msgs.len()
    }

    /// Starts a message to `peer`; `gso`: the kernel cuts it into datagrams of that size.
    pub(crate) fn message(&mut self, peer: SocketAddr, gso: Option<u16>) {
        let k = self.msgs.len();
        if self.names.len() <= k {
            self.names.push((empty_storage(), 0));
            self.ctrl.push([0; 4]);
            self.hdrs.push(empty_hdr());
        }
        self.names[k] = if k > 0 && self.last_peer == Some(peer) {
            self.names[k - 1]
        } else {
            to_storage(peer)
        };
        self.last_peer = Some(peer);
        self.msgs.push(Msg {
            first: self.segs.len(),
            count: 0,
            packets: 0,
            gso,
        });
    }

    /// Adds bytes `start..start + len` of `src` to the newest message.
    pub(crate) fn segment(&mut self, src: Src, start: usize, len: usize) {
        if let Some(m) = self.msgs.last_mut() {
            m.count += 1;
            self.segs.push((src, start, len));
        }
    }

    /// Packets in message `i` (the iovecs of a packet sent from several pieces count once:
    /// see [`Self::packet`]).
    pub(crate) fn packets(&self, i: usize) -> usize {
        self.msgs[i].packets
    }

    /// Marks the end of a packet in the newest message.
    pub(crate) fn packet(&mut self) {
        if let Some(m) = self.msgs.last_mut() {
            m.packets += 1;
        }
    }

    /// Sends messages `from..` in one sendmmsg call without blocking, gathering from
    /// `bufs` and `views`. Returns how many messages the kernel took.
    ///
    /// # Panics
    /// If a segment lies outside its source (a caller bug).
    pub(crate) fn send(
        &mut self,
        fd: RawFd,
        bufs: &[Vec<u8>],
        views: &[&[u8]],
        from: usize,
    ) -> nix::Result<usize> {
        let msgs = &self.msgs[from..];
        if msgs.is_empty() {
            return Ok(0);
        }
        self.iovs.clear();
        for &(src, start, len) in &self.segs[msgs[0].first..] {
            let s = match src {
                Src::Buf(b) => &bufs[b][start..start + len],
                Src::View(v) => &views[v][start..start + len],
            };
            self.iovs.push(libc::iovec {
                iov_base: s.as_ptr().cast_mut().cast(),
                iov_len: s.len(),
            });
        }
        let base = msgs[0].first;
        for (k, m) in msgs.iter().enumerate() {
            let i = from + k;
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&raw mut self.names[i].0).cast();
            h.msg_namelen = self.names[i].1;
            h.msg_iov = self.iovs[m.first - base..].as_mut_ptr();
            h.msg_iovlen = m.count as _;
            h.msg_flags = 0;
            match m.gso {
                Some(g) => {
                    let c = self.ctrl[i].as_mut_ptr().cast::<u8>();
                    h.msg_control = c.cast();
                    // SAFETY: CMSG_SPACE(2) is 24 bytes, inside the 32-byte, 8-aligned
                    // control buffer of this message; the header and its u16 payload are
                    // written within it.
                    #[allow(unsafe_code)]
                    unsafe {
                        h.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as _;
                        let cm = libc::CMSG_FIRSTHDR(h);
                        (*cm).cmsg_level = SOL_UDP;
                        (*cm).cmsg_type = UDP_SEGMENT;
                        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                        libc::CMSG_DATA(cm).cast::<u16>().write_unaligned(g);
                    }
                }
                None => {
                    h.msg_control = std::ptr::null_mut();
                    h.msg_controllen = 0;
                }
            }
        }
        // SAFETY: headers `from..from + msgs.len()` point at this struct's live name,
        // control and iovec arrays (not resized during the call) and the iovecs at byte
        // ranges of `bufs` and `views`, borrowed for the call and checked in bounds above;
        // the kernel only reads them.
        #[allow(unsafe_code)]
        let r = unsafe {
            libc::sendmmsg(
                fd,
                self.hdrs[from..].as_mut_ptr(),
                msgs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(r).map_err(|_| nix::errno::Errno::last())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{setsockopt, sockopt};
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    fn pair(gro: bool) -> (UdpSocket, UdpSocket) {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        setsockopt(&rx, sockopt::IpRecvTos, &true).unwrap();
        setsockopt(&tx, sockopt::Ipv4Tos, &0x6a).unwrap();
        if gro {
            setsockopt(&rx, sockopt::UdpGroSegment, &true).unwrap();
        }
        (tx, rx)
    }

    /// Receives until `want` datagrams arrived (loopback delivers before sendmmsg returns).
    fn receive(rx: &UdpSocket, want: usize) -> (Vec<Received>, Vec<Vec<u8>>) {
        let mut h = RecvHeaders::new(8);
        let mut bufs = vec![vec![0u8; 2048]; 8];
        let mut out = Vec::new();
        let got = h.recv(rx.as_raw_fd(), &mut bufs, |r| out.push(r));
        assert_eq!(got, want, "{out:?}");
        // A second call reuses the headers the first one dirtied: nothing is left.
        assert_eq!(h.recv(rx.as_raw_fd(), &mut bufs, |_| ()), 0);
        (out, bufs)
    }

    fn send_mixed(tx: &UdpSocket, to: SocketAddr) -> usize {
        // One GSO message of three 100-byte segments (gathered from three buffers, the
        // last segment from two pieces), then a plain 50-byte datagram.
        let bufs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i + 1; 100]).collect();
        let view = [4u8; 40];
        let mut s = SendHeaders::new();
        s.message(to, Some(100));
        s.segment(Src::Buf(0), 0, 100);
        s.packet();
        s.segment(Src::Buf(1), 0, 100);
        s.packet();
        s.segment(Src::Buf(2), 0, 60);
        s.segment(Src::View(0), 0, 40);
        s.packet();
        s.message(to, None);
        s.segment(Src::Buf(3), 0, 50);
        s.packet();
        assert_eq!((s.len(), s.packets(0), s.packets(1)), (2, 3, 1));
        s.send(tx.as_raw_fd(), &bufs, &[&view[..]], 0).unwrap()
    }

    #[test]
    fn gso_messages_and_plain_datagrams_share_one_call_and_arrive_cut() {
        let (tx, rx) = pair(false);
        let to = rx.local_addr().unwrap();
        assert_eq!(send_mixed(&tx, to), 2);
        let (got, bufs) = receive(&rx, 4);
        let lens: Vec<usize> = got.iter().map(|r| r.len).collect();
        assert_eq!(lens, [100, 100, 100, 50]);
        for r in &got {
            assert_eq!(r.src, Some(tx.local_addr().unwrap()));
            assert_eq!(r.tos, 0x6a);
            assert!(!r.truncated && r.gro.is_none());
        }
        assert!(bufs[0][..100].iter().all(|&b| b == 1));
        assert!(bufs[2][..60].iter().all(|&b| b == 3));
        assert!(bufs[2][60..100].iter().all(|&b| b == 4));
        assert!(bufs[3][..50].iter().all(|&b| b == 4));
    }

    #[test]
    fn gro_hands_over_a_message_whole_with_its_segment_size() {
        let (tx, rx) = pair(true);
        let to = rx.local_addr().unwrap();
        assert_eq!(send_mixed(&tx, to), 2);
        let (got, _) = receive(&rx, 2);
        assert_eq!((got[0].len, got[0].gro), (300, Some(100)));
        assert_eq!(got[1].len, 50);
        assert!(got.iter().all(|r| r.tos == 0x6a));
    }

    #[test]
    fn a_datagram_longer_than_its_buffer_is_marked_truncated() {
        let (tx, rx) = pair(false);
        tx.send_to(&[7u8; 3000], rx.local_addr().unwrap()).unwrap();
        let (got, _) = receive(&rx, 1);
        assert!(got[0].truncated);
        assert_eq!(got[0].len, 2048);
    }

    #[test]
    fn addresses_round_trip_through_sockaddr_storage() {
        for a in [
            "10.1.2.3:4791".parse::<SocketAddr>().unwrap(),
            "[fe80::1%7]:4791".parse().unwrap(),
            "[2001:db8::5]:65535".parse().unwrap(),
        ] {
            let (s, len) = to_storage(a);
            assert_eq!(from_storage(&s, len), Some(a));
            // Too short for its family: no address.
            assert_eq!(from_storage(&s, 4), None);
        }
    }
}
