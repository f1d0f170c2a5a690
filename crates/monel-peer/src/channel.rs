//! The messages transports exchange over a pair's TCP connection while they set it up: a
//! magic, a kind and up to eight length-prefixed fields, every read bounded in time. On a
//! [`Channel`] each message also carries a proof under the link's key, over the sender, the
//! receiver, the message's number in its direction, its kind and its fields: a message that
//! was forged, replayed, reordered or reflected fails.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::auth::Key;

const MAGIC: &[u8; 4] = b"MNLS";

/// Writes one message: its kind and fields (each at most 64 KiB - 2).
pub fn send_msg(s: &mut TcpStream, kind: u8, fields: &[&[u8]]) -> io::Result<()> {
    let mut m = MAGIC.to_vec();
    m.push(kind);
    for f in fields {
        m.extend((f.len() as u16).to_le_bytes());
        m.extend(*f);
    }
    m.extend(0xffffu16.to_le_bytes());
    s.write_all(&m)
}

/// A pair's set-up connection: the TCP stream to a peer that proved the job key, and the
/// key of the link (`monel-ccl`'s bootstrap makes both).
pub struct Channel {
    /// The TCP connection, for the transport that takes it over once set up.
    pub s: TcpStream,
    key: Key,
    me: u32,
    peer: u32,
    sent: u64,
    got: u64,
}

impl Channel {
    /// The channel over `s` from rank `me` to rank `peer`, under the link key `key`.
    pub fn new(s: TcpStream, key: Key, me: usize, peer: usize) -> Self {
        Self {
            s,
            key,
            me: me as u32,
            peer: peer as u32,
            sent: 0,
            got: 0,
        }
    }

    /// The link's key, for keys of narrower uses.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// What a message's proof covers, before its fields.
    fn head(from: u32, to: u32, n: u64, kind: u8) -> Vec<u8> {
        [
            b"setup".as_slice(),
            &from.to_le_bytes(),
            &to.to_le_bytes(),
            &n.to_le_bytes(),
            &[kind],
        ]
        .concat()
    }

    /// Sends one message with its proof.
    pub fn send(&mut self, kind: u8, fields: &[&[u8]]) -> io::Result<()> {
        let head = Self::head(self.me, self.peer, self.sent, kind);
        let mut parts: Vec<&[u8]> = vec![&head];
        parts.extend_from_slice(fields);
        let proof = self.key.prove(&parts);
        self.sent += 1;
        let mut all = fields.to_vec();
        all.push(&proof);
        send_msg(&mut self.s, kind, &all)
    }

    /// Receives one message and checks its proof.
    pub fn recv(&mut self) -> io::Result<(u8, Vec<Vec<u8>>)> {
        let (kind, mut fields) = recv_msg(&mut self.s)?;
        let proof = fields.pop().unwrap_or_default();
        let head = Self::head(self.peer, self.me, self.got, kind);
        let mut parts: Vec<&[u8]> = vec![&head];
        parts.extend(fields.iter().map(Vec::as_slice));
        if !self.key.verify(&parts, &proof) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "a set-up message from rank {} failed authentication",
                    self.peer
                ),
            ));
        }
        self.got += 1;
        Ok((kind, fields))
    }
}

/// Bounds every handshake read on `channels` by `deadline` (at least 100 ms).
pub fn bound_reads(channels: &mut [Option<Channel>], deadline: Instant) -> io::Result<()> {
    for s in channels.iter_mut().flatten().map(|c| &mut c.s) {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        s.set_read_timeout(Some(left))?;
    }
    Ok(())
}

/// A handshake message's first field as text (a peer's reason).
pub fn first_text(fields: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(fields.first().map_or(&[][..], |v| v)).into_owned()
}

/// Reads one message: its kind and fields.
pub fn recv_msg(s: &mut impl Read) -> io::Result<(u8, Vec<Vec<u8>>)> {
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

/// Both ends of a set-up channel over loopback, between ranks 1 (first) and 0 (second), under
/// `key` as the link's key: for tests of what runs over a channel.
pub fn loopback_pair(key: &Key) -> io::Result<(Channel, Channel)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    Ok((
        Channel::new(a, key.clone(), 1, 0),
        Channel::new(b, key.clone(), 0, 1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel_pair() -> (Channel, Channel) {
        loopback_pair(&Key::from_secret(b"link")).unwrap()
    }

    #[test]
    fn forged_replayed_and_reflected_set_up_messages_fail() {
        let (mut a, mut b) = channel_pair();
        a.send(7, &[b"first"]).unwrap();
        assert_eq!(b.recv().unwrap(), (7, vec![b"first".to_vec()]));
        // Replayed: the bytes of message 0 again, where message 1 is due.
        let mut raw = Vec::new();
        let proof = a.key.prove(&[&Channel::head(1, 0, 0, 7), b"first"]);
        for f in [&b"first"[..], &proof] {
            raw.push(f.to_vec());
        }
        let fields: Vec<&[u8]> = raw.iter().map(Vec::as_slice).collect();
        send_msg(&mut a.s, 7, &fields).unwrap();
        let e = b.recv().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        // Forged: no proof under the key.
        let (mut a, mut b) = channel_pair();
        send_msg(&mut a.s, 7, &[b"first", &[0u8; 32]]).unwrap();
        assert!(b.recv().is_err());
        // Reflected: what rank 0 would send, arriving at rank 0.
        let (mut a, mut b) = channel_pair();
        let reflected = b.key.prove(&[&Channel::head(0, 1, 0, 7), b"x"]);
        send_msg(&mut a.s, 7, &[b"x", &reflected]).unwrap();
        assert!(b.recv().is_err());
    }
}
