//! Links: a reliable, ordered byte stream to one peer, driven without blocking, and the
//! frames the executor sends over it. TCP is the first transport (any two hosts); shared
//! memory and the soft RNIC plug in behind the same trait.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

use nix::poll::PollFlags;

/// One peer's connection.
pub trait Link: Send {
    /// Transport name for logs (`TCP`, `SHM`, `RoCE`).
    fn kind(&self) -> &'static str;
    /// Writes what it can without blocking (`Ok(0)` when full).
    fn write_some(&mut self, data: &[u8]) -> io::Result<usize>;
    /// Writes `a` then `b` as one stream, as much as fits without blocking (a frame header
    /// and its payload in one system call or one ring update).
    fn write_two(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        let n = self.write_some(a)?;
        if n < a.len() {
            return Ok(n);
        }
        Ok(n + self.write_some(b)?)
    }
    /// Reads what is there without blocking; `Err(UnexpectedEof)` once the peer closed.
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Looks at what is there without consuming it (`Err(UnexpectedEof)` once closed).
    fn peek(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// The descriptor to sleep on.
    fn fd(&self) -> RawFd;
    /// Prepares to sleep on [`Self::fd`] until the link can be read (`read`) or written
    /// (`write`): returns the poll events to wait for, or `None` when there is already
    /// something to do (do not sleep).
    fn arm(&mut self, read: bool, write: bool) -> Option<PollFlags> {
        let mut f = PollFlags::empty();
        if read {
            f |= PollFlags::POLLIN;
        }
        if write {
            f |= PollFlags::POLLOUT;
        }
        Some(f)
    }
    /// Writes all of `a` then `b` as one stream, or nothing (`Ok(false)`: no room now, or
    /// the transport cannot promise it; then nothing was written).
    fn write_whole(&mut self, a: &[u8], b: &[u8]) -> io::Result<bool> {
        let _ = (a, b);
        Ok(false)
    }
    /// After a sleep: withdraws the wake-up requests [`Self::arm`] made.
    fn disarm(&mut self) {}
    /// The transport's counters for the logs (retransmissions and the like), if it has any.
    fn counters(&self) -> Option<String> {
        None
    }
    /// Hands up to `max` received bytes, contiguous, to `f` where they lie (a ring), without
    /// copying them out; `f` returns how many it used, and those are consumed. `None` when
    /// the transport has no such buffer (read with [`Self::read_some`]); `Ok(0)` when nothing
    /// is there yet.
    fn read_in_place(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Option<io::Result<usize>> {
        let _ = (max, f);
        None
    }
}

/// A TCP connection (non-blocking, Nagle off).
pub struct TcpLink {
    stream: TcpStream,
}

impl TcpLink {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Self { stream })
    }

    /// Asks the kernel for the first congestion control in `wanted` it accepts for this
    /// connection (none: keep the system's) and says which one is in force, and why.
    pub fn choose_congestion(&self, wanted: &[String]) -> String {
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
    fn kind(&self) -> &'static str {
        "TCP"
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

/// Frame kinds.
pub(crate) const FRAME_DATA: u8 = 0;
/// The sender aborted the collective; the payload is its reason.
pub(crate) const FRAME_ABORT: u8 = 1;
/// The sender destroyed its communicator.
pub(crate) const FRAME_CLOSE: u8 = 2;

/// Frame header length.
pub(crate) const HEADER_LEN: usize = 32;
const MAGIC: u32 = 0x4d4e_4c31; // "MNL1"

/// What every message of a collective carries, so ranks that disagree find out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Signature {
    /// The collective's sequence number on the communicator.
    pub(crate) seq: u64,
    pub(crate) coll: u8,
    pub(crate) dtype: u8,
    pub(crate) op: u8,
    /// Below 2^24 (the header keeps 24 bits).
    pub(crate) root: u32,
    pub(crate) count: u64,
    /// The algorithm the sender runs ([`monel_sched::plan::Algorithm::code`]; 0: none, as for
    /// point-to-point messages and control frames): ranks that chose differently find out
    /// at the first message, even where the schedules would exchange the same sizes.
    pub(crate) algo: u8,
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: u8,
    pub(crate) sig: Signature,
    pub(crate) len: u32,
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[5] = self.sig.coll;
        b[6] = self.sig.dtype;
        b[7] = self.sig.op;
        b[8..16].copy_from_slice(&self.sig.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.sig.count.to_le_bytes());
        b[24..27].copy_from_slice(&self.sig.root.to_le_bytes()[..3]);
        b[27] = self.sig.algo;
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    /// None if the magic is wrong (garbage on the link).
    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> Option<Self> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        (u32_at(0) == MAGIC).then(|| Self {
            kind: b[4],
            sig: Signature {
                coll: b[5],
                dtype: b[6],
                op: b[7],
                seq: u64_at(8),
                count: u64_at(16),
                root: u32_at(24) & 0x00ff_ffff,
                algo: b[27],
            },
            len: u32_at(28),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_bad_magic() {
        let h = Header {
            kind: FRAME_DATA,
            sig: Signature {
                seq: 7,
                coll: 1,
                dtype: 7,
                op: 0,
                root: 3,
                count: 1 << 40,
                algo: 5,
            },
            len: 4096,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        let mut b = h.encode();
        b[0] ^= 1;
        assert_eq!(Header::decode(&b), None);
    }
}
