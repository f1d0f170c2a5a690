//! One AF_PACKET socket per switch port: whole Ethernet frames in and out of a network
//! interface (a veth end), nonblocking.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, sockopt};

/// An AF_PACKET raw socket bound to one interface, blind to the frames it sends itself.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    /// The interface's name.
    pub ifname: String,
}

/// An io::Error that keeps the errno's kind and says what failed.
fn err(e: Errno, what: String) -> io::Error {
    io::Error::new(io::Error::from(e).kind(), format!("{what}: {e}"))
}

fn set_int(fd: BorrowedFd<'_>, level: i32, name: i32, val: i32) -> io::Result<()> {
    // SAFETY: `fd` is an open socket; the option value is a live i32 whose size is passed;
    // setsockopt does not keep the pointer.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw const val).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl PacketSocket {
    /// Opens a socket on interface `ifname` (which must exist and be up). Needs CAP_NET_RAW.
    pub fn open(ifname: &str) -> io::Result<Self> {
        let ifindex = nix::net::if_::if_nametoindex(ifname)
            .map_err(|e| err(e, format!("interface {ifname}")))?;
        // Protocol 0: receive nothing until bound, so no other interface's frames slip in.
        let fd = socket::socket(
            AddressFamily::Packet,
            SockType::Raw,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| err(e, "AF_PACKET socket (needs CAP_NET_RAW)".into()))?;
        let mut sll: libc::sockaddr_ll = libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as u16,
            sll_protocol: (libc::ETH_P_ALL as u16).to_be(),
            sll_ifindex: ifindex as i32,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 0,
            sll_addr: [0; 8],
        };
        // SAFETY: `sll` is a fully initialised sockaddr_ll that outlives the call, and the
        // length passed is its size; bind copies it and keeps no pointer.
        #[allow(unsafe_code)]
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw mut sll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // Our own transmissions must not come back as input.
        set_int(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            1,
        )?;
        let _ = socket::setsockopt(&fd, sockopt::RcvBuf, &(8 << 20));
        let _ = socket::setsockopt(&fd, sockopt::SndBuf, &(8 << 20));
        Ok(Self {
            fd,
            ifname: ifname.to_string(),
        })
    }

    /// Receives one frame into `buf`; `None` when none is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match socket::recv(self.fd.as_raw_fd(), buf, MsgFlags::MSG_TRUNC) {
            Ok(n) if n > buf.len() => Ok(Some(0)), // oversized: reported as an empty frame
            Ok(n) => Ok(Some(n)),
            Err(Errno::EAGAIN) => Ok(None),
            Err(Errno::EINTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Sends one frame. Returns false when the interface's queue is full (the frame is
    /// dropped, as a switch whose port is overrun would).
    pub fn send(&self, frame: &[u8]) -> io::Result<bool> {
        match socket::send(self.fd.as_raw_fd(), frame, MsgFlags::empty()) {
            Ok(_) => Ok(true),
            Err(Errno::EAGAIN | Errno::ENOBUFS) => Ok(false),
            Err(e) => Err(err(e, format!("send on {}", self.ifname))),
        }
    }
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
