//! The TCP transport's protocol, sans IO: how a connection opens (which transport it is for,
//! and the proof of the job secret), and the frames that carry the agents' messages and the
//! one-sided operations over a byte stream. The target resolves every operation against its
//! own registrations (key, address, length), as an RNIC does: nothing the peer says is an
//! address on the target until it was found inside a registration the target published.
//!
//! ```text
//! opening    client: "MXFRRDMA" (then the connection manager's exchange), "MXFRRDML"
//!            token[16] (a further queue pair of the peer that sent that token: the same
//!            exchange), "MXFRTCP1", or "MXFRSHM1" (TCP's hello, then the shared-memory
//!            set-up: agent::cma)
//! tcp hello  server: flags:u8 nonce_s[16]          client: nonce_c[16] mac_c[32]
//!            server: status:u8 mac_s[32]
//! frame      len:u32 kind:u8 body               (len counts kind and body)
//! msg    (1) an agents' message (wire::Msg)
//! put    (2) tag:u64 key:u32 addr:u64 data       write data at addr
//! ack    (3) tag:u64 status:u8                   a put's outcome
//! get    (4) tag:u64 key:u32 addr:u64 len:u32    read len bytes at addr
//! data   (5) tag:u64 status:u8 data              a get's outcome and bytes
//! ```
//! mac_c = HMAC(K, "xfer tcp client" | nonce_s | nonce_c), mac_s = HMAC(K, "xfer tcp server"
//! | nonce_s | nonce_c), with K the key the job secret stands for; zeros without a secret.
//! Big-endian throughout.

use monel_peer::auth::Key;

use crate::error::{Result, XferError};
use crate::wire::MAX_MESSAGE;

/// What a client sends first: the connection is for the connection manager (RDMA).
pub const OPEN_RDMA: &[u8; 8] = b"MXFRRDMA";
/// What a client sends first: the connection is the TCP transport.
pub const OPEN_TCP: &[u8; 8] = b"MXFRTCP1";
/// What a client sends first: the connection manager's exchange for a further queue pair
/// (lane) of an RDMA peer, named by the token that peer sent on its first.
pub const OPEN_RDMA_LANE: &[u8; 8] = b"MXFRRDML";
/// What a client sends first: the connection carries a shared-memory link's messages.
pub const OPEN_SHM: &[u8; 8] = b"MXFRSHM1";
/// Largest slice one put or get carries.
pub const MAX_DATA: usize = 4 << 20;
/// Largest frame: a message, or a put's header and data.
pub const MAX_FRAME: usize = 1
    + 8
    + 4
    + 8
    + if MAX_DATA > MAX_MESSAGE {
        MAX_DATA
    } else {
        MAX_MESSAGE
    };
/// Frame header: length and kind.
pub const HEADER: usize = 5;

/// A status in an ack or a data frame.
pub const OK: u8 = 0;
/// No registration holds the range, or it does not allow the operation.
pub const ACCESS_ERROR: u8 = 1;

/// One frame, by reference to its data (for encoding without a copy of the data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// An agents' message, encoded ([`crate::wire::Msg::encode`]).
    Msg(Vec<u8>),
    /// Write `data` at `addr` of the registration `key`.
    Put {
        /// Names the operation in its ack.
        tag: u64,
        /// The target's registration (the remote key it published).
        key: u32,
        /// Where, in the target's memory.
        addr: u64,
        /// What.
        data: Vec<u8>,
    },
    /// A put's outcome.
    Ack {
        /// The put's tag.
        tag: u64,
        /// [`OK`] or [`ACCESS_ERROR`].
        status: u8,
    },
    /// Read `len` bytes at `addr` of the registration `key`.
    Get {
        /// Names the operation in its data frame.
        tag: u64,
        /// The target's registration.
        key: u32,
        /// Where.
        addr: u64,
        /// How much (at most [`MAX_DATA`]).
        len: u32,
    },
    /// A get's outcome, with the bytes when it is [`OK`].
    Data {
        /// The get's tag.
        tag: u64,
        /// [`OK`] or [`ACCESS_ERROR`].
        status: u8,
        /// The bytes read.
        data: Vec<u8>,
    },
}

impl Frame {
    /// The header of a frame whose kind and body are `body_len` bytes.
    fn header(out: &mut Vec<u8>, kind: u8, body_len: usize) {
        out.extend_from_slice(&((1 + body_len) as u32).to_be_bytes());
        out.push(kind);
    }

    /// The header and fixed fields of a put of `len` bytes: what goes before its bytes.
    pub fn put_head(tag: u64, key: u32, addr: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 20);
        Self::header(&mut out, 2, 20 + len);
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&key.to_be_bytes());
        out.extend_from_slice(&addr.to_be_bytes());
        out
    }

    /// The header and fixed fields of a data frame of `len` bytes: what goes before them.
    pub fn data_head(tag: u64, status: u8, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 9);
        Self::header(&mut out, 5, 9 + len);
        out.extend_from_slice(&tag.to_be_bytes());
        out.push(status);
        out
    }

    /// The frame's header and fixed fields: all of it but the bytes it carries.
    fn head(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 24);
        let body = self.wire_len() - HEADER;
        match self {
            Self::Msg(_) => Self::header(&mut out, 1, body),
            Self::Put {
                tag,
                key,
                addr,
                data,
            } => return Self::put_head(*tag, *key, *addr, data.len()),
            Self::Ack { tag, status } => {
                Self::header(&mut out, 3, body);
                out.extend_from_slice(&tag.to_be_bytes());
                out.push(*status);
            }
            Self::Get {
                tag,
                key,
                addr,
                len,
            } => {
                Self::header(&mut out, 4, body);
                out.extend_from_slice(&tag.to_be_bytes());
                out.extend_from_slice(&key.to_be_bytes());
                out.extend_from_slice(&addr.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
            Self::Data { tag, status, data } => return Self::data_head(*tag, *status, data.len()),
        }
        out
    }

    /// The bytes the frame carries after its fixed fields.
    fn payload(&self) -> &[u8] {
        match self {
            Self::Msg(m) => m,
            Self::Put { data, .. } | Self::Data { data, .. } => data,
            Self::Ack { .. } | Self::Get { .. } => &[],
        }
    }

    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.head();
        out.extend_from_slice(self.payload());
        out
    }

    /// Writes the frame to `w`, its data straight from where it lies.
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        w.write_all(&self.head())?;
        w.write_all(self.payload())
    }

    /// Bytes the frame takes on the wire.
    pub fn wire_len(&self) -> usize {
        HEADER
            + match self {
                Self::Msg(m) => m.len(),
                Self::Put { data, .. } => 20 + data.len(),
                Self::Ack { .. } => 9,
                Self::Get { .. } => 24,
                Self::Data { data, .. } => 9 + data.len(),
            }
    }

    /// The length of the frame whose header is `h` (kind and body), checked against
    /// [`MAX_FRAME`] before anything is read or allocated for it.
    pub fn body_len(h: &[u8; HEADER]) -> Result<usize> {
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(XferError::BadMessage(format!(
                "a frame of {len} bytes (1 to {MAX_FRAME})"
            )));
        }
        Ok(len - 1)
    }

    /// The frame of kind `kind` with body `b` (whose length [`Self::body_len`] gave).
    pub fn decode(kind: u8, b: Vec<u8>) -> Result<Self> {
        let short = || XferError::BadMessage(format!("a frame of kind {kind} is too short"));
        let u64_at = |o: usize| -> Result<u64> {
            Ok(u64::from_be_bytes(
                b.get(o..o + 8).ok_or_else(short)?.try_into().expect("8"),
            ))
        };
        let u32_at = |o: usize| -> Result<u32> {
            Ok(u32::from_be_bytes(
                b.get(o..o + 4).ok_or_else(short)?.try_into().expect("4"),
            ))
        };
        Ok(match kind {
            1 => Self::Msg(b),
            2 => {
                let (tag, key, addr) = (u64_at(0)?, u32_at(8)?, u64_at(12)?);
                if b.len() - 20 > MAX_DATA {
                    return Err(XferError::BadMessage(format!(
                        "a put of {} bytes (at most {MAX_DATA})",
                        b.len() - 20
                    )));
                }
                let mut data = b;
                data.drain(..20);
                Self::Put {
                    tag,
                    key,
                    addr,
                    data,
                }
            }
            3 => {
                if b.len() != 9 {
                    return Err(XferError::BadMessage("an ack of the wrong length".into()));
                }
                Self::Ack {
                    tag: u64_at(0)?,
                    status: b[8],
                }
            }
            4 => {
                if b.len() != 24 {
                    return Err(XferError::BadMessage("a get of the wrong length".into()));
                }
                let len = u32_at(20)?;
                if len as usize > MAX_DATA {
                    return Err(XferError::BadMessage(format!(
                        "a get of {len} bytes (at most {MAX_DATA})"
                    )));
                }
                Self::Get {
                    tag: u64_at(0)?,
                    key: u32_at(8)?,
                    addr: u64_at(12)?,
                    len,
                }
            }
            5 => {
                let tag = u64_at(0)?;
                let status = *b.get(8).ok_or_else(short)?;
                let mut data = b;
                data.drain(..9);
                Self::Data { tag, status, data }
            }
            k => return Err(XferError::BadMessage(format!("a frame of kind {k}"))),
        })
    }
}

/// The fixed fields of a frame that carries bytes, read before its bytes (so that a reader
/// can take the bytes straight into a buffer of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// A put's: its tag, key and address.
    Put {
        /// Names the operation in its ack.
        tag: u64,
        /// The target's registration.
        key: u32,
        /// Where.
        addr: u64,
    },
    /// A data frame's: its tag and status.
    Data {
        /// The get's tag.
        tag: u64,
        /// [`OK`] or [`ACCESS_ERROR`].
        status: u8,
    },
}

impl Head {
    /// How many bytes of fixed fields a frame of kind `kind` has before its data, if it
    /// carries data.
    pub fn len(kind: u8) -> Option<usize> {
        match kind {
            2 => Some(20),
            5 => Some(9),
            _ => None,
        }
    }

    /// The fixed fields of a frame of kind `kind` (whose [`Self::len`] is `b.len()`).
    pub fn parse(kind: u8, b: &[u8]) -> Result<Self> {
        let short = || XferError::BadMessage(format!("a frame of kind {kind} is too short"));
        let u64_at = |o: usize| -> Result<u64> {
            Ok(u64::from_be_bytes(
                b.get(o..o + 8).ok_or_else(short)?.try_into().expect("8"),
            ))
        };
        match kind {
            2 => Ok(Self::Put {
                tag: u64_at(0)?,
                key: u32::from_be_bytes(b.get(8..12).ok_or_else(short)?.try_into().expect("4")),
                addr: u64_at(12)?,
            }),
            5 => Ok(Self::Data {
                tag: u64_at(0)?,
                status: *b.get(8).ok_or_else(short)?,
            }),
            k => Err(XferError::BadMessage(format!(
                "a frame of kind {k} carries no data"
            ))),
        }
    }
}

/// The proof a side of a TCP connection gives: over both nonces, named by its role
/// ("client" or "server"); zeros without a secret.
pub fn proof(secret: Option<&[u8]>, role: &str, ns: &[u8], nc: &[u8]) -> [u8; 32] {
    match secret {
        Some(s) => Key::from_secret(s).prove(&[b"xfer tcp ", role.as_bytes(), ns, nc]),
        None => [0; 32],
    }
}

/// Whether `got` is the proof of `role` (always true without a secret).
pub fn verify(secret: Option<&[u8]>, role: &str, ns: &[u8], nc: &[u8], got: &[u8]) -> bool {
    match secret {
        Some(s) => Key::from_secret(s).verify(&[b"xfer tcp ", role.as_bytes(), ns, nc], got),
        None => true,
    }
}

/// For the fuzzer: a frame read from arbitrary bytes as a connection reads it (header,
/// then body) gives a typed error or a frame that encodes back to the same bytes.
#[doc(hidden)]
pub fn fuzz_decode(bytes: &[u8]) {
    let Some(h) = bytes.get(..HEADER) else { return };
    let h: [u8; HEADER] = h.try_into().expect("HEADER bytes");
    let Ok(n) = Frame::body_len(&h) else { return };
    let Some(body) = bytes.get(HEADER..HEADER + n) else {
        return;
    };
    if let Ok(f) = Frame::decode(h[4], body.to_vec()) {
        assert_eq!(
            f.encode(),
            bytes[..HEADER + n],
            "a frame that does not round-trip"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(f: &Frame) -> Frame {
        let bytes = f.encode();
        let h: [u8; HEADER] = bytes[..HEADER].try_into().unwrap();
        let n = Frame::body_len(&h).unwrap();
        assert_eq!(n, bytes.len() - HEADER);
        Frame::decode(h[4], bytes[HEADER..].to_vec()).unwrap()
    }

    #[test]
    fn every_frame_roundtrips() {
        for f in [
            Frame::Msg(b"MXF1 hello".to_vec()),
            Frame::Put {
                tag: 7,
                key: 9,
                addr: 0x1000,
                data: vec![1, 2, 3],
            },
            Frame::Ack {
                tag: u64::MAX,
                status: ACCESS_ERROR,
            },
            Frame::Get {
                tag: 1,
                key: 2,
                addr: 3,
                len: 4,
            },
            Frame::Data {
                tag: 5,
                status: OK,
                data: vec![9; 100],
            },
        ] {
            assert_eq!(roundtrip(&f), f);
            let mut w = Vec::new();
            f.write_to(&mut w).unwrap();
            assert_eq!(w, f.encode());
            assert_eq!(f.wire_len(), w.len());
        }
    }

    #[test]
    fn lengths_are_bounded_before_anything_is_allocated() {
        assert!(Frame::body_len(&[0xff, 0xff, 0xff, 0xff, 2]).is_err());
        assert!(Frame::body_len(&[0, 0, 0, 0, 2]).is_err());
        let big = (MAX_DATA as u32 + 1).to_be_bytes();
        let mut get = vec![0u8; 20];
        get.extend_from_slice(&big);
        assert!(Frame::decode(4, get).is_err());
        assert!(Frame::decode(2, vec![0; 19]).is_err());
        assert!(Frame::decode(3, vec![0; 10]).is_err());
        assert!(Frame::decode(9, vec![]).is_err());
    }

    #[test]
    fn the_fuzz_entry_takes_every_prefix_and_every_flipped_byte() {
        let f = Frame::Put {
            tag: 3,
            key: 4,
            addr: 5,
            data: vec![6; 40],
        }
        .encode();
        for n in 0..=f.len() {
            fuzz_decode(&f[..n]);
        }
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0xff;
            fuzz_decode(&g);
        }
    }

    #[test]
    fn proofs_need_the_secret_and_the_role() {
        let (ns, nc) = ([1u8; 16], [2u8; 16]);
        let p = proof(Some(b"s"), "client", &ns, &nc);
        assert!(verify(Some(b"s"), "client", &ns, &nc, &p));
        assert!(!verify(Some(b"s"), "server", &ns, &nc, &p));
        assert!(!verify(Some(b"t"), "client", &ns, &nc, &p));
        assert!(!verify(Some(b"s"), "client", &nc, &ns, &p));
    }
}
