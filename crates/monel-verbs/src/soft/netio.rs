//! The I/O edge: one UDP socket per GID, batched with recvmmsg/sendmmsg, TOS/ECN carried in
//! control messages, plus send-only sockets that give QPs their own UDP source ports. The
//! only module of the soft RNIC that makes system calls.

use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use nix::sys::socket::{setsockopt, sockopt};

use super::gid_table::{self, MAX_GIDS};
use super::mmsg::RecvHeaders;
use crate::config::ContextConfig;
use crate::device::{Device, GidEntry, is_link_local};
use crate::error::{ErrorKind, Result, VerbsError};
use monel_peer::gid::Gid;

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

/// One GID's sockets.
#[derive(Debug)]
pub(crate) struct GidSocks {
    /// Bound to the RoCE port: everything is received here, and sent from here by default.
    pub(crate) main: Sock,
    /// Send-only sockets on ports the kernel picked: a QP sends from one of them (chosen by
    /// its QPN), so switches hashing the 5-tuple spread QPs over paths, as RoCE NICs and rxe
    /// do with per-QP source ports. Empty when disabled.
    pub(crate) lanes: Vec<Sock>,
}

/// The GID table as it stands, with each entry's sockets (`None` for a cleared entry).
#[derive(Debug, Default)]
pub(crate) struct SockTable {
    pub(crate) gids: Vec<GidEntry>,
    socks: Vec<Option<Arc<GidSocks>>>,
    /// The entries that have sockets, with their index: what is received on.
    live: Vec<(usize, Arc<GidSocks>)>,
}

/// The device's sockets, indexed like its GID table, which may change while the device is
/// open ([`Sockets::follow`]): users take the table of the moment ([`Sockets::load`]) and
/// the progress loop and waiting threads watch [`Sockets::generation`] to see it change.
#[derive(Debug)]
pub(crate) struct Sockets {
    table: RwLock<Arc<SockTable>>,
    generation: AtomicU64,
    /// Receive buffers take coalesced datagrams (UDP GRO), up to 64 KiB at once.
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

/// Binds a socket at `ip`:`port` (0: any free port) with the RoCE socket options, and UDP
/// GRO where the kernel takes it (never on a `send_only` socket).
fn open(
    ip: IpAddr,
    port: u16,
    ifindex: u32,
    config: &ContextConfig,
    send_only: bool,
) -> Result<Sock> {
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
    if !send_only && config.gso {
        let _ = setsockopt(&udp, sockopt::UdpGroSegment, &true);
    }
    let local = udp.local_addr().map_err(|e| VerbsError::io(V, e))?;
    Ok(Sock {
        udp,
        local,
        gso: AtomicBool::new(config.gso),
    })
}

/// The sockets of one GID entry.
fn open_gid(g: &GidEntry, config: &ContextConfig) -> Result<GidSocks> {
    let ip = g.gid.to_ip();
    let main = open(ip, config.udp_port, g.ifindex, config, false)?;
    let lanes = (0..config.source_ports)
        .map(|_| open(ip, 0, g.ifindex, config, true))
        .collect::<Result<Vec<_>>>()?;
    Ok(GidSocks { main, lanes })
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
        let gids: Vec<GidEntry> = device.gids.iter().take(MAX_GIDS).copied().collect();
        let socks = gids
            .iter()
            .map(|g| open_gid(g, config).map(|s| Some(Arc::new(s))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            table: RwLock::new(Arc::new(SockTable::new(gids, socks))),
            generation: AtomicU64::new(0),
            gro: config.gso,
        })
    }

    /// The table of the moment.
    pub(crate) fn load(&self) -> Arc<SockTable> {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Counts the table's changes.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Makes the table follow the interface's addresses `addrs` ([`gid_table::follow`]):
    /// binds sockets for new entries, closes those of cleared ones (when their last user
    /// lets go). An address whose sockets cannot be bound stays out of the table, logged.
    /// Returns whether the table changed.
    pub(crate) fn follow(
        &self,
        device: &str,
        addrs: &[(IpAddr, u32)],
        config: &ContextConfig,
    ) -> bool {
        let old = self.load();
        let mut gids = gid_table::follow(&old.gids, addrs);
        if gids == old.gids {
            return false;
        }
        let mut socks = Vec::with_capacity(gids.len());
        for (i, g) in gids.iter_mut().enumerate() {
            if g.gid == Gid::default() {
                socks.push(None);
            } else if old.gids.get(i) == Some(g) {
                socks.push(old.socks[i].clone());
            } else {
                match open_gid(g, config) {
                    Ok(s) => {
                        tracing::info!(
                            "{device}: GID {i} is {} (an address appeared)",
                            g.gid.to_ip()
                        );
                        socks.push(Some(Arc::new(s)));
                    }
                    Err(e) => {
                        tracing::warn!("{device}: no GID for {}: {e}", g.gid.to_ip());
                        *g = GidEntry {
                            gid: Gid::default(),
                            ..*g
                        };
                        socks.push(None);
                    }
                }
            }
        }
        for (i, g) in old.gids.iter().enumerate() {
            if g.gid != Gid::default() && gids.get(i).is_none_or(|n| n.gid != g.gid) {
                tracing::info!(
                    "{device}: GID {i} ({}) cleared: its address is gone",
                    g.gid.to_ip()
                );
            }
        }
        while gids.last().is_some_and(|g| g.gid == Gid::default()) {
            gids.pop();
            socks.pop();
        }
        *self.table.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(SockTable::new(gids, socks));
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }
}

impl SockTable {
    fn new(gids: Vec<GidEntry>, socks: Vec<Option<Arc<GidSocks>>>) -> Self {
        let live = socks
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, s.clone()?)))
            .collect();
        Self { gids, socks, live }
    }

    /// The entries that have sockets, with their GID index.
    pub(crate) fn receiving(&self) -> impl ExactSizeIterator<Item = (usize, &Sock)> {
        self.live.iter().map(|(i, g)| (*i, &g.main))
    }

    /// The lane (0: the RoCE-port socket; k: the k-th send-only socket) QP `qpn` sends from.
    pub(crate) fn lane_of(&self, si: usize, qpn: u32) -> usize {
        let k = self
            .socks
            .get(si)
            .and_then(Option::as_ref)
            .map_or(0, |s| s.lanes.len());
        if k == 0 {
            return 0;
        }
        // A multiplicative hash: consecutive QPNs land on different lanes.
        1 + (qpn.wrapping_mul(0x9e37_79b1) >> 16) as usize % k
    }

    /// The socket of lane `lane` of GID `si`; `None` once the entry is cleared.
    pub(crate) fn sender(&self, si: usize, lane: usize) -> Option<&Sock> {
        let g = self.socks.get(si)?.as_ref()?;
        match lane {
            0 => Some(&g.main),
            k => g.lanes.get(k - 1),
        }
    }

    /// The UDP address bound for GID `i`.
    pub(crate) fn local_addr(&self, i: usize) -> Result<SocketAddr> {
        self.sender(i, 0).map(|s| s.local).ok_or_else(|| {
            VerbsError::invalid("ibv_query_gid", format!("no socket for GID index {i}"))
        })
    }

    /// GID entry `i` (a zero GID for a cleared entry).
    pub(crate) fn gid(&self, i: usize) -> Result<GidEntry> {
        self.gids.get(i).copied().ok_or_else(|| {
            VerbsError::new(
                "ibv_query_gid",
                ErrorKind::NotFound(format!("GID index {i} (table has {})", self.gids.len())),
            )
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
