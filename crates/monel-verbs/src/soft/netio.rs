//! The I/O edge: one UDP socket per GID, batched with recvmmsg/sendmmsg, TOS/ECN carried in
//! control messages, plus send-only sockets that give QPs their own UDP source ports. The
//! only module of the soft RNIC that makes system calls.

use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicBool;

use nix::sys::socket::{setsockopt, sockopt};

use super::mmsg::RecvHeaders;
use crate::config::ContextConfig;
use crate::device::{Device, is_link_local};
use crate::error::{Result, VerbsError};

/// Largest datagram accepted: 4096-byte MTU plus every header, with room to spare, so an
/// oversized packet is seen whole and dropped rather than truncated into something valid.
pub(crate) const MAX_DATAGRAM: usize = 4096 + 256;

/// Most send-only sockets per GID (`ContextConfig::source_ports`).
pub(crate) const MAX_SOURCE_PORTS: usize = 256;

/// One bound socket.
#[derive(Debug)]
pub(crate) struct Sock {
    pub(crate) udp: UdpSocket,
    pub(crate) local: SocketAddr,
    /// Send runs of equal-size packets as one GSO message (cleared if the kernel refuses).
    pub(crate) gso: AtomicBool,
}

/// The device's sockets, indexed like its GID table.
#[derive(Debug)]
pub(crate) struct Sockets {
    /// Bound to the RoCE port: everything is received here, and sent from here by default.
    pub(crate) socks: Vec<Sock>,
    /// Per GID, send-only sockets on ports the kernel picked: a QP sends from one of them
    /// (chosen by its QPN), so switches hashing the 5-tuple spread QPs over paths, as
    /// RoCE NICs and rxe do with per-QP source ports. Empty when disabled.
    pub(crate) lanes: Vec<Vec<Sock>>,
    /// The kernel may hand over coalesced datagrams (UDP GRO), up to 64 KiB at once.
    pub(crate) gro: bool,
}

fn set_int(fd: RawFd, level: i32, name: i32, val: i32) -> std::io::Result<()> {
    // SAFETY: `fd` is an open socket owned by the caller; the option value is a live i32
    // whose size is passed; setsockopt does not retain the pointer.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const val).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A UDP socket bound to `addr` even while the address is not usable yet (an IPv6 address
/// still tentative, or an interface without carrier): with `IP_FREEBIND`, as rxe keeps its
/// GIDs across link changes, the socket receives as soon as the address works.
fn bind_free(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, bind, socket};
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::IpFreebind, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(UdpSocket::from(fd))
}

/// Binds a socket at `ip`:`port` (0: any free port) with the RoCE socket options; returns it
/// and whether the kernel takes UDP GRO on it (never on a `send_only` socket).
fn open(
    ip: IpAddr,
    port: u16,
    ifindex: u32,
    config: &ContextConfig,
    send_only: bool,
) -> Result<(Sock, bool)> {
    const V: &str = "ibv_open_device";
    let addr = match ip {
        IpAddr::V6(a) if is_link_local(&ip) => {
            SocketAddr::V6(SocketAddrV6::new(a, port, 0, ifindex))
        }
        _ => SocketAddr::new(ip, port),
    };
    let udp = bind_free(addr).map_err(|e| {
        VerbsError::io(
            V,
            std::io::Error::new(e.kind(), format!("bind UDP {addr}: {e}")),
        )
    })?;
    udp.set_nonblocking(true)
        .map_err(|e| VerbsError::io(V, e))?;
    let fd = udp.as_raw_fd();
    let tc = i32::from(config.traffic_class());
    let r = if ip.is_ipv4() {
        // DF with IP ID 0 on an unconnected socket: the peer can recompute our ICRC.
        set_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
        .and_then(|()| setsockopt(&udp, sockopt::IpRecvTos, &true).map_err(Into::into))
        .and_then(|()| setsockopt(&udp, sockopt::Ipv4Tos, &tc).map_err(Into::into))
    } else {
        set_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
        // rxe sends UDP checksum 0 even over IPv6.
        .and_then(|()| set_int(fd, libc::IPPROTO_UDP, 102 /* UDP_NO_CHECK6_RX */, 1))
        .and_then(|()| setsockopt(&udp, sockopt::Ipv6RecvTClass, &true).map_err(Into::into))
        .and_then(|()| setsockopt(&udp, sockopt::Ipv6TClass, &tc).map_err(Into::into))
    };
    r.map_err(|e| VerbsError::io(V, e))?;
    // Best effort: the kernel caps these at rmem_max/wmem_max. A send-only socket is never
    // read, so it keeps the smallest receive buffer.
    let rcvbuf = if send_only { 0 } else { 4 << 20 };
    let _ = setsockopt(&udp, sockopt::RcvBuf, &rcvbuf);
    let _ = setsockopt(&udp, sockopt::SndBuf, &(4 << 20));
    // GRO: a run of datagrams from one sender arrives as one buffer with its segment
    // size (on loopback and veth, a GSO message is never cut at all).
    let gro = !send_only && config.gso && setsockopt(&udp, sockopt::UdpGroSegment, &true).is_ok();
    let local = udp.local_addr().map_err(|e| VerbsError::io(V, e))?;
    let sock = Sock {
        udp,
        local,
        gso: AtomicBool::new(config.gso),
    };
    Ok((sock, gro))
}

impl Sockets {
    pub(crate) fn bind(device: &Device, config: &ContextConfig) -> Result<Self> {
        if config.source_ports > MAX_SOURCE_PORTS {
            return Err(VerbsError::invalid(
                "ibv_open_device",
                format!(
                    "source_ports {}: at most {MAX_SOURCE_PORTS} per GID",
                    config.source_ports
                ),
            ));
        }
        let mut socks = Vec::new();
        let mut lanes = Vec::new();
        let mut gro = false;
        for g in &device.gids {
            let ip = g.gid.to_ip();
            let (sock, takes_gro) = open(ip, config.udp_port, g.ifindex, config, false)?;
            gro |= takes_gro;
            socks.push(sock);
            let extra = (0..config.source_ports)
                .map(|_| open(ip, 0, g.ifindex, config, true).map(|(s, _)| s))
                .collect::<Result<Vec<_>>>()?;
            lanes.push(extra);
        }
        Ok(Self { socks, lanes, gro })
    }

    /// The lane (0: the RoCE-port socket; k: the k-th send-only socket) QP `qpn` sends from.
    pub(crate) fn lane_of(&self, si: usize, qpn: u32) -> usize {
        let k = self.lanes.get(si).map_or(0, Vec::len);
        if k == 0 {
            return 0;
        }
        // A multiplicative hash: consecutive QPNs land on different lanes.
        1 + (qpn.wrapping_mul(0x9e37_79b1) >> 16) as usize % k
    }

    /// The socket of lane `lane` of GID `si`.
    pub(crate) fn sender(&self, si: usize, lane: usize) -> &Sock {
        match lane {
            0 => &self.socks[si],
            k => &self.lanes[si][k - 1],
        }
    }

    pub(crate) fn local_addr(&self, i: usize) -> Result<SocketAddr> {
        self.socks.get(i).map(|s| s.local).ok_or_else(|| {
            VerbsError::invalid("ibv_query_gid", format!("no socket for GID index {i}"))
        })
    }
}

/// One received datagram's metadata.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxMeta {
    pub(crate) len: usize,
    pub(crate) src: SocketAddr,
    pub(crate) tos: u8,
    /// The datagram did not fit the buffer, or is longer than any packet.
    pub(crate) truncated: bool,
    /// GRO coalesced datagrams of this size (the last may be shorter); else `len`.
    pub(crate) seg: usize,
    /// Position in a coalesced buffer: the IPv4 ID the datagram most likely carried (a GSO
    /// message numbers its segments from 0).
    pub(crate) index: u16,
}

/// Room for any UDP payload: what a coalesced (GRO) receive can hold.
pub(crate) const MAX_COALESCED: usize = 65_536;

/// Buffers for one recvmmsg call.
pub(crate) struct RxBatch {
    pub(crate) bufs: Vec<Vec<u8>>,
    pub(crate) meta: Vec<RxMeta>,
    headers: RecvHeaders,
}

impl RxBatch {
    /// Buffers for `n` datagrams; `coalesced`: each takes a GRO receive (64 KiB, touched
    /// only as far as used).
    pub(crate) fn new(n: usize, coalesced: bool) -> Self {
        let size = if coalesced {
            MAX_COALESCED
        } else {
            MAX_DATAGRAM + 1
        };
        Self {
            bufs: (0..n).map(|_| vec![0u8; size]).collect(),
            meta: Vec::with_capacity(n),
            headers: RecvHeaders::new(n),
        }
    }

    /// Receives what is queued on `sock` without blocking; fills `meta`. Returns the count.
    pub(crate) fn recv(&mut self, sock: &Sock) -> usize {
        self.meta.clear();
        let size = self.bufs.first().map_or(0, Vec::len);
        let meta = &mut self.meta;
        self.headers
            .recv(sock.udp.as_raw_fd(), &mut self.bufs, |m| {
                // meta[i] describes bufs[i]: a datagram without a usable source is kept, marked
                // unusable (the engine drops it as malformed).
                let len = m.len.min(size);
                meta.push(RxMeta {
                    len,
                    src: m.src.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
                    tos: m.tos,
                    // Too big for one packet (a coalesced buffer is checked datagram by datagram).
                    truncated: m.src.is_none()
                        || m.len >= size
                        || m.truncated
                        || (m.gro.is_none() && m.len > MAX_DATAGRAM),
                    seg: m.gro.unwrap_or(len),
                    index: 0,
                });
            });
        self.meta.len()
    }
}
