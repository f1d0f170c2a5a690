//! The I/O edge: one UDP socket per GID, batched with recvmmsg/sendmmsg, TOS/ECN carried in
//! control messages. The only module of the soft RNIC that makes system calls.

use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg, setsockopt,
    sockopt,
};
use nix::sys::time::TimeSpec;

use crate::context::ContextConfig;
use crate::device::{Device, is_link_local};
use crate::error::{Result, VerbsError};

/// Largest datagram accepted: 4096-byte MTU plus every header, with room to spare, so an
/// oversized packet is seen whole and dropped rather than truncated into something valid.
pub(crate) const MAX_DATAGRAM: usize = 4096 + 256;

/// One bound socket.
#[derive(Debug)]
pub(crate) struct Sock {
    pub(crate) udp: UdpSocket,
    pub(crate) local: SocketAddr,
}

/// The device's sockets, indexed like its GID table.
#[derive(Debug)]
pub(crate) struct Sockets {
    pub(crate) socks: Vec<Sock>,
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

impl Sockets {
    pub(crate) fn bind(device: &Device, config: &ContextConfig) -> Result<Self> {
        const V: &str = "ibv_open_device";
        let mut socks = Vec::new();
        for g in &device.gids {
            let ip = g.gid.to_ip();
            let addr = match ip {
                IpAddr::V6(a) if is_link_local(&ip) => {
                    SocketAddr::V6(SocketAddrV6::new(a, config.udp_port, 0, g.ifindex))
                }
                _ => SocketAddr::new(ip, config.udp_port),
            };
            let udp = UdpSocket::bind(addr).map_err(|e| {
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
            // Best effort: the kernel caps these at rmem_max/wmem_max.
            let _ = setsockopt(&udp, sockopt::RcvBuf, &(4 << 20));
            let _ = setsockopt(&udp, sockopt::SndBuf, &(4 << 20));
            let local = udp.local_addr().map_err(|e| VerbsError::io(V, e))?;
            socks.push(Sock { udp, local });
        }
        Ok(Self { socks })
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
    /// The datagram did not fit the buffer.
    pub(crate) truncated: bool,
}

/// Buffers for one recvmmsg call.
pub(crate) struct RxBatch {
    pub(crate) bufs: Vec<Vec<u8>>,
    pub(crate) meta: Vec<RxMeta>,
    headers: MultiHeaders<SockaddrStorage>,
}

fn to_std(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        Some(SocketAddr::from((v4.ip(), v4.port())))
    } else {
        a.as_sockaddr_in6()
            .map(|v6| SocketAddr::V6(SocketAddrV6::new(v6.ip(), v6.port(), 0, v6.scope_id())))
    }
}

impl RxBatch {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            bufs: (0..n).map(|_| vec![0u8; MAX_DATAGRAM + 1]).collect(),
            meta: Vec::with_capacity(n),
            headers: MultiHeaders::preallocate(n, Some(nix::cmsg_space!(i32, i32))),
        }
    }

    /// Receives what is queued on `sock` without blocking; fills `meta`. Returns the count.
    pub(crate) fn recv(&mut self, sock: &Sock) -> usize {
        self.meta.clear();
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> =
            self.bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
        let Ok(res) = recvmmsg(
            sock.udp.as_fd().as_raw_fd(),
            &mut self.headers,
            iovs.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None::<TimeSpec>,
        ) else {
            return 0;
        };
        for m in res {
            let Some(src) = m.address.as_ref().and_then(to_std) else {
                continue;
            };
            let mut tos = 0u8;
            if let Ok(cmsgs) = m.cmsgs() {
                for c in cmsgs {
                    match c {
                        ControlMessageOwned::Ipv4Tos(t) => tos = t,
                        ControlMessageOwned::Ipv6TClass(t) => tos = t as u8,
                        _ => {}
                    }
                }
            }
            self.meta.push(RxMeta {
                len: m.bytes.min(MAX_DATAGRAM + 1),
                src,
                tos,
                truncated: m.bytes > MAX_DATAGRAM || m.flags.contains(MsgFlags::MSG_TRUNC),
            });
        }
        self.meta.len()
    }
}

/// Packets waiting for one sendmmsg call per socket.
pub(crate) struct TxBatch {
    pub(crate) bufs: Vec<Vec<u8>>,
    /// (socket, destination, start, length) per filled buffer.
    pub(crate) items: Vec<(usize, SocketAddr, usize, usize)>,
    headers: MultiHeaders<SockaddrStorage>,
}

/// Room in front of each packet for the IP and UDP headers the ICRC needs.
pub(crate) const TX_HEADROOM: usize = 48;

impl TxBatch {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            bufs: (0..n)
                .map(|_| vec![0u8; TX_HEADROOM + MAX_DATAGRAM])
                .collect(),
            items: Vec::with_capacity(n),
            headers: MultiHeaders::preallocate(n, None),
        }
    }
    pub(crate) fn is_full(&self) -> bool {
        self.items.len() == self.bufs.len()
    }
    /// The next free buffer.
    pub(crate) fn next_buf(&mut self) -> &mut [u8] {
        let i = self.items.len();
        &mut self.bufs[i]
    }

    /// Sends everything queued; returns (sent, failed).
    pub(crate) fn flush(&mut self, socks: &Sockets) -> (u64, u64, u64) {
        let (mut sent, mut failed, mut calls) = (0, 0, 0);
        for (si, sock) in socks.socks.iter().enumerate() {
            let mine: Vec<usize> = (0..self.items.len())
                .filter(|&i| self.items[i].0 == si)
                .collect();
            let mut done = 0;
            let mut stalls = 0;
            while done < mine.len() {
                let part = &mine[done..];
                let slices: Vec<[IoSlice<'_>; 1]> = part
                    .iter()
                    .map(|&i| {
                        let (_, _, start, len) = self.items[i];
                        [IoSlice::new(&self.bufs[i][start..start + len])]
                    })
                    .collect();
                let addrs: Vec<Option<SockaddrStorage>> = part
                    .iter()
                    .map(|&i| Some(SockaddrStorage::from(self.items[i].1)))
                    .collect();
                calls += 1;
                match sendmmsg(
                    sock.udp.as_raw_fd(),
                    &mut self.headers,
                    &slices,
                    &addrs,
                    [],
                    MsgFlags::MSG_DONTWAIT,
                ) {
                    Ok(r) => {
                        let n = r.count();
                        done += n.max(usize::from(n == 0));
                        sent += n as u64;
                        failed += u64::from(n == 0);
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
                    Err(_) => {
                        // Unreachable peer, EMSGSIZE...: the packet is lost; RC retransmits.
                        done += 1;
                        failed += 1;
                    }
                }
            }
        }
        self.items.clear();
        (sent, failed, calls)
    }
}
