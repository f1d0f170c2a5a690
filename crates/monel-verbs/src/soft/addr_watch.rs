//! The kernel's word that addresses changed: a netlink route socket subscribed to the IPv4
//! and IPv6 address groups, as rxe's GID table listens to netdev events. The progress
//! thread sleeps on it with its sockets; what changed is read back from the interface
//! itself (`getifaddrs`), so nothing in the messages is parsed or trusted.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};

/// `RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR`.
const ADDRESS_GROUPS: u32 = 0x10 | 0x100;

/// A subscription to address changes.
#[derive(Debug)]
pub(crate) struct AddrWatch {
    fd: OwnedFd,
}

impl AddrWatch {
    /// Subscribes; an error (a kernel or sandbox without netlink) leaves the table as opened.
    pub(crate) fn open() -> nix::Result<Self> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            SockProtocol::NetlinkRoute,
        )?;
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &NetlinkAddr::new(0, ADDRESS_GROUPS),
        )?;
        Ok(Self { fd })
    }

    /// Reads every queued message; true if there was any (or the queue overflowed, which
    /// also means something changed).
    pub(crate) fn drain(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            match recv(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                &mut buf,
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) => return any,
                Ok(_) | Err(nix::errno::Errno::ENOBUFS) => any = true,
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return any,
            }
        }
    }
}

impl AsFd for AddrWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
