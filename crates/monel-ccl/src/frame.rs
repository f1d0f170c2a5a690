//! The frame protocol on every link: a 32-byte header (magic, kind, the collective's
//! signature, payload length) before each message, so ranks that disagree about a call
//! find out at its first message. A point-to-point message's signature is its number
//! between the pair, its length and its tag ([`Signature::p2p`]).

/// Frame kinds.
pub(crate) const FRAME_DATA: u8 = 0;
/// The sender aborted the collective; the payload is its reason.
pub(crate) const FRAME_ABORT: u8 = 1;
/// The sender destroyed its communicator.
pub(crate) const FRAME_CLOSE: u8 = 2;

/// The `coll` code of point-to-point messages.
pub(crate) const P2P_CODE: u8 = 0x50;

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

impl Signature {
    /// A point-to-point message: the pair's message number `seq`, its `bytes`, and its
    /// `tag`, carried in the root and op fields, which point-to-point messages have no other
    /// use for (`coll` is [`P2P_CODE`]).
    pub(crate) fn p2p(seq: u64, bytes: u64, tag: u32) -> Self {
        Self {
            seq,
            coll: P2P_CODE,
            dtype: 0,
            op: (tag >> 24) as u8,
            root: tag & 0x00ff_ffff,
            count: bytes,
            algo: 0,
        }
    }

    /// A point-to-point message's tag.
    pub(crate) fn tag(&self) -> u32 {
        self.root | u32::from(self.op) << 24
    }
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

    #[test]
    fn a_point_to_point_tag_survives_the_header_whole() {
        for tag in [0, 1, 0x00ff_ffff, 0x0100_0000, 0xdead_beef, u32::MAX] {
            let h = Header {
                kind: FRAME_DATA,
                sig: Signature::p2p(9, 1 << 33, tag),
                len: 12,
            };
            let back = Header::decode(&h.encode()).unwrap();
            assert_eq!(back, h);
            assert_eq!(back.sig.tag(), tag);
        }
    }
}
