//! TCP links: any two hosts, non-blocking, Nagle off, with the congestion control the
//! configuration asks for.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

use monel_sched::tune::TransportKind;

use super::Link;

/// A TCP connection (non-blocking, Nagle off).
pub(crate) struct TcpLink {
    stream: TcpStream,
}

impl TcpLink {
    /// Wraps a connected stream.
    pub(crate) fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Self { stream })
    }

    /// Asks the kernel for the first congestion control in `wanted` it accepts for this
    /// connection (none: keep the system's) and says which one is in force, and why.
    pub(crate) fn choose_congestion(&self, wanted: &[String]) -> String {
        let mut refused = Vec::new();
        let mut taken = false;
        for name in wanted {
            match set_congestion(&self.stream, name) {
                Ok(()) => {
                    taken = true;
                    break;
                }
                Err(e) => refused.push(format!("{name} refused: {e}")),
            }
        }
        let mut said = congestion(&self.stream).unwrap_or_else(|e| format!("unknown ({e})"));
        if !taken {
            said.push_str(", the system's");
        }
        for r in refused {
            said.push_str("; ");
            said.push_str(&r);
        }
        said
    }
}

/// The congestion control a TCP connection runs.
fn congestion(s: &TcpStream) -> io::Result<String> {
    use nix::sys::socket::{getsockopt, sockopt::TcpCongestion};
    let name = getsockopt(s, TcpCongestion).map_err(io::Error::from)?;
    Ok(name.to_string_lossy().trim_end_matches('\0').to_string())
}

/// Sets a TCP connection's congestion control (`TCP_CONGESTION`): the kernel refuses names
/// it does not have, and names outside `tcp_allowed_congestion_control` to unprivileged
/// processes.
fn set_congestion(s: &TcpStream, name: &str) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt::TcpCongestion};
    setsockopt(s, TcpCongestion, &std::ffi::OsString::from(name)).map_err(io::Error::from)
}

fn nb(r: io::Result<usize>) -> io::Result<usize> {
    match r {
        Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

impl Link for TcpLink {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }
    fn write_some(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        match self.stream.write(data) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
    fn write_two(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        match self
            .stream
            .write_vectored(&[io::IoSlice::new(a), io::IoSlice::new(b)])
        {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        nb(self.stream.read(buf))
    }
    fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        nb(self.stream.peek(buf))
    }
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}
