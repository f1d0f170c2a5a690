//! The messages agents exchange over a peer's authenticated channel: the segments an agent
//! publishes (addresses, lengths, remote keys), a notification, a segment withdrawn. Every
//! count and length from the peer is checked before anything is allocated for it.
//!
//! ```text
//! message      "MXF1" kind:u8 body
//! segments (1) count:u32 { name_len:u8 name nbuf:u32 { addr:u64 len:u64 rkey:u32 }* }*
//! notify   (2) seq:u64 len:u32 payload
//! revoke   (3) name_len:u8 name
//! hello    (4) name_len:u8 name
//! ```
//! Big-endian throughout.

use crate::batch::MAX_NOTIFICATION;
use crate::error::{Result, XferError};
use crate::segment::{Buffer, MAX_BUFFERS, MAX_SEGMENTS, Segment};

const MAGIC: &[u8; 4] = b"MXF1";
/// Largest message: a table of this many buffers in all, with room for their names.
pub const MAX_TABLE_BUFFERS: usize = 1 << 16;
/// Largest message, in bytes.
pub const MAX_MESSAGE: usize = 4 + 1 + 4 + MAX_TABLE_BUFFERS * 20 + MAX_SEGMENTS * (1 + 255 + 4);

/// A message between agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Every segment the sender publishes now (replacing what it published before).
    Segments(Vec<Segment>),
    /// A notification: the sender's `seq`-th, carrying `payload`.
    Notify {
        /// Its number; each sender's count up from 1.
        seq: u64,
        /// What the consumer is told.
        payload: Vec<u8>,
    },
    /// The sender withdrew a segment.
    Revoke(String),
    /// The sender's agent name (its first message on a connection).
    Hello(String),
    /// The sender stopped using a segment the receiver revoked: none of its operations on
    /// it is in flight any more (over shared memory, where the sender itself writes into
    /// the receiver's memory, the receiver keeps the memory until this comes).
    Revoked(String),
    /// The token the sender's further RDMA connections to the receiver present, so that
    /// their queue pairs join this peer's (lanes). It travels only on the authenticated,
    /// protected queue pair.
    Lanes([u8; 16]),
}

impl Msg {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        match self {
            Self::Segments(segs) => {
                out.push(1);
                out.extend_from_slice(&(segs.len() as u32).to_be_bytes());
                for s in segs {
                    put_name(&mut out, &s.name);
                    out.extend_from_slice(&(s.buffers.len() as u32).to_be_bytes());
                    for b in &s.buffers {
                        out.extend_from_slice(&b.addr.to_be_bytes());
                        out.extend_from_slice(&b.len.to_be_bytes());
                        out.extend_from_slice(&b.key.to_be_bytes());
                    }
                }
            }
            Self::Notify { seq, payload } => {
                out.push(2);
                out.extend_from_slice(&seq.to_be_bytes());
                out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                out.extend_from_slice(payload);
            }
            Self::Revoke(name) => {
                out.push(3);
                put_name(&mut out, name);
            }
            Self::Hello(name) => {
                out.push(4);
                put_name(&mut out, name);
            }
            Self::Revoked(name) => {
                out.push(5);
                put_name(&mut out, name);
            }
            Self::Lanes(token) => {
                out.push(6);
                out.extend_from_slice(token);
            }
        }
        out
    }

    /// Parses a peer's message; anything malformed, over a bound, or with bytes left over
    /// is a [`XferError::BadMessage`] (or [`XferError::TooLarge`]).
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_MESSAGE {
            return Err(XferError::TooLarge(format!(
                "a message of {} bytes (at most {MAX_MESSAGE})",
                bytes.len()
            )));
        }
        let mut r = Reader { b: bytes };
        if r.take(4)? != MAGIC {
            return Err(bad("not a transfer-engine message"));
        }
        let msg = match r.u8()? {
            1 => {
                let n = r.u32()? as usize;
                if n > MAX_SEGMENTS {
                    return Err(XferError::TooLarge(format!(
                        "{n} segments (at most {MAX_SEGMENTS})"
                    )));
                }
                let mut segs = Vec::with_capacity(n.min(64));
                let mut total = 0usize;
                for _ in 0..n {
                    let name = r.name()?;
                    let k = r.u32()? as usize;
                    total = total.saturating_add(k);
                    if k > MAX_BUFFERS || total > MAX_TABLE_BUFFERS {
                        return Err(XferError::TooLarge(format!(
                            "segment {name:?}: {k} buffers ({MAX_BUFFERS} per segment, \
                             {MAX_TABLE_BUFFERS} in all)"
                        )));
                    }
                    // Each buffer is 20 bytes: the count cannot promise more than is there.
                    if r.b.len() < k * 20 {
                        return Err(bad("segment table cut short"));
                    }
                    let buffers = (0..k)
                        .map(|_| {
                            Ok(Buffer {
                                addr: r.u64()?,
                                len: r.u64()?,
                                key: r.u32()?,
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    segs.push(Segment::new(name, buffers)?);
                }
                Self::Segments(segs)
            }
            2 => {
                let seq = r.u64()?;
                let len = r.u32()? as usize;
                if len > MAX_NOTIFICATION {
                    return Err(XferError::TooLarge(format!(
                        "a notification of {len} bytes (at most {MAX_NOTIFICATION})"
                    )));
                }
                if seq == 0 {
                    return Err(bad("notification number 0"));
                }
                Self::Notify {
                    seq,
                    payload: r.take(len)?.to_vec(),
                }
            }
            3 => Self::Revoke(r.name()?),
            4 => {
                let name = r.name()?;
                crate::segment::check_name(&name)?;
                Self::Hello(name)
            }
            5 => Self::Revoked(r.name()?),
            6 => Self::Lanes(r.take(16)?.try_into().expect("16 bytes")),
            k => return Err(bad(&format!("unknown message kind {k}"))),
        };
        if !r.b.is_empty() {
            return Err(bad(&format!("{} bytes after the message", r.b.len())));
        }
        Ok(msg)
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    // Names are checked when segments are made (at most 255 bytes).
    let n = &name.as_bytes()[..name.len().min(255)];
    out.push(n.len() as u8);
    out.extend_from_slice(n);
}

fn bad(why: &str) -> XferError {
    XferError::BadMessage(why.to_string())
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(bad("message cut short"));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn name(&mut self) -> Result<String> {
        let n = usize::from(self.u8()?);
        let s = std::str::from_utf8(self.take(n)?).map_err(|_| bad("a name that is not UTF-8"))?;
        Ok(s.to_string())
    }
}

/// Runs the decoder on arbitrary bytes (for the fuzzer): it must return, never panic, and
/// what it accepts must encode back to the same bytes.
pub fn fuzz_decode(bytes: &[u8]) {
    if let Ok(m) = Msg::decode(bytes) {
        assert_eq!(m.encode(), bytes, "a message that does not round-trip");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Msg {
        Msg::Segments(vec![
            Segment::new(
                "kv-layer-0",
                vec![
                    Buffer {
                        addr: 0x7f00_0000_0000,
                        len: 1 << 20,
                        key: 0x1234,
                    },
                    Buffer {
                        addr: 0x7f00_1000_0000,
                        len: 4096,
                        key: 0x1235,
                    },
                ],
            )
            .unwrap(),
            Segment::new(
                "ключ",
                vec![Buffer {
                    addr: 1,
                    len: 2,
                    key: 3,
                }],
            )
            .unwrap(),
        ])
    }

    #[test]
    fn every_message_round_trips() {
        for m in [
            table(),
            Msg::Segments(vec![]),
            Msg::Notify {
                seq: 7,
                payload: b"req 42: blocks 0-15".to_vec(),
            },
            Msg::Revoke("kv-layer-0".into()),
            Msg::Hello("prefill-0".into()),
            Msg::Revoked("kv-layer-1".into()),
            Msg::Lanes([7; 16]),
        ] {
            let b = m.encode();
            assert_eq!(Msg::decode(&b).unwrap(), m);
            fuzz_decode(&b);
        }
    }

    #[test]
    fn hostile_messages_are_refused_before_allocating() {
        let good = table().encode();
        // Every cut is refused.
        for n in 0..good.len() {
            assert!(Msg::decode(&good[..n]).is_err(), "cut at {n}");
        }
        // Trailing bytes, a bad magic, an unknown kind.
        let mut more = good;
        more.push(0);
        assert!(Msg::decode(&more).is_err());
        assert!(Msg::decode(b"MXF0\x01\0\0\0\0").is_err());
        assert!(Msg::decode(b"MXF1\x09").is_err());
        // Counts that promise more than any bound or more than is there.
        let mut huge = b"MXF1\x01".to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(Msg::decode(&huge), Err(XferError::TooLarge(_))));
        let mut bufs = b"MXF1\x01\0\0\0\x01\x01a".to_vec();
        bufs.extend_from_slice(&(MAX_BUFFERS as u32).to_be_bytes());
        assert!(matches!(Msg::decode(&bufs), Err(XferError::BadMessage(_))));
        let mut notif = b"MXF1\x02".to_vec();
        notif.extend_from_slice(&1u64.to_be_bytes());
        notif.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(Msg::decode(&notif), Err(XferError::TooLarge(_))));
        // A buffer that runs past the address space, a name that is not UTF-8, number 0.
        let mut wrap = b"MXF1\x01\0\0\0\x01\x01a\0\0\0\x01".to_vec();
        wrap.extend_from_slice(&u64::MAX.to_be_bytes());
        wrap.extend_from_slice(&2u64.to_be_bytes());
        wrap.extend_from_slice(&0u32.to_be_bytes());
        assert!(Msg::decode(&wrap).is_err());
        assert!(Msg::decode(b"MXF1\x03\x01\xff").is_err());
        let mut zero = b"MXF1\x02".to_vec();
        zero.extend_from_slice(&[0; 12]);
        assert!(Msg::decode(&zero).is_err());
    }
}
