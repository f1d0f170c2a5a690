//! The messages transports exchange over a pair's TCP connection while they set it up: a
//! magic, a kind and up to eight length-prefixed fields, every read bounded in time.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"MNLS";

/// Writes one message: its kind and fields (each at most 64 KiB - 2).
pub(crate) fn send_msg(s: &mut TcpStream, kind: u8, fields: &[&[u8]]) -> io::Result<()> {
    let mut m = MAGIC.to_vec();
    m.push(kind);
    for f in fields {
        m.extend((f.len() as u16).to_le_bytes());
        m.extend(*f);
    }
    m.extend(0xffffu16.to_le_bytes());
    s.write_all(&m)
}

/// Bounds every handshake read on `streams` by `deadline` (at least 100 ms).
pub(crate) fn bound_reads(streams: &mut [Option<TcpStream>], deadline: Instant) -> io::Result<()> {
    for s in streams.iter_mut().flatten() {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        s.set_read_timeout(Some(left))?;
    }
    Ok(())
}

/// A handshake message's first field as text (a peer's reason).
pub(crate) fn first_text(fields: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(fields.first().map_or(&[][..], |v| v)).into_owned()
}

/// Reads one message: its kind and fields.
pub(crate) fn recv_msg(s: &mut impl Read) -> io::Result<(u8, Vec<Vec<u8>>)> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h)?;
    if &h[..4] != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "garbled transport handshake",
        ));
    }
    let mut fields = Vec::new();
    loop {
        let mut l = [0u8; 2];
        s.read_exact(&mut l)?;
        let l = u16::from_le_bytes(l);
        if l == 0xffff || fields.len() > 8 {
            break;
        }
        let mut f = vec![0u8; usize::from(l)];
        s.read_exact(&mut f)?;
        fields.push(f);
    }
    Ok((h[4], fields))
}
