//! Segments: named memory an agent registers and publishes (Mooncake's segments, NIXL's
//! registered memory sections). A segment is one or more registered buffers; its offsets run
//! through them in order, buffer k starting where buffer k-1 ends, and a transfer's range
//! lies inside one buffer (each is a registration of its own). A table holds an agent's own
//! segments (keys are local keys) or what a peer published (keys are remote keys).

use std::collections::BTreeMap;

use crate::error::{Result, XferError};

/// Longest segment name, in bytes (UTF-8).
pub const MAX_NAME: usize = 255;
/// Most buffers in one segment.
pub const MAX_BUFFERS: usize = 1024;
/// Most segments one agent publishes.
pub const MAX_SEGMENTS: usize = 4096;

/// One registered buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Its address in its owner's memory.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The key that reaches it: the local key in an agent's own table, the remote key in a
    /// peer's.
    pub key: u32,
}

/// A named segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Its name, unique among its agent's segments.
    pub name: String,
    /// Its buffers, in offset order.
    pub buffers: Vec<Buffer>,
}

/// Where a range of a segment lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The buffer (index into the segment's).
    pub buffer: usize,
    /// The range's first byte, as an address in the owner's memory.
    pub addr: u64,
    /// The buffer's key.
    pub key: u32,
}

impl Segment {
    /// A segment after checking its name, buffer count, and that neither its length nor any
    /// buffer's end overflows.
    pub fn new(name: impl Into<String>, buffers: Vec<Buffer>) -> Result<Self> {
        let name = name.into();
        check_name(&name)?;
        if buffers.is_empty() || buffers.len() > MAX_BUFFERS {
            return Err(XferError::TooLarge(format!(
                "segment {name:?} has {} buffers (1 to {MAX_BUFFERS})",
                buffers.len()
            )));
        }
        let mut total = 0u64;
        for b in &buffers {
            if b.addr.checked_add(b.len).is_none() {
                return Err(XferError::TooLarge(format!(
                    "segment {name:?}: a buffer of {} bytes at {:#x} runs past the address space",
                    b.len, b.addr
                )));
            }
            total = total.checked_add(b.len).ok_or_else(|| {
                XferError::TooLarge(format!("segment {name:?}: its length overflows"))
            })?;
        }
        Ok(Self { name, buffers })
    }

    /// Its length: the sum of its buffers'.
    pub fn len(&self) -> u64 {
        self.buffers.iter().map(|b| b.len).sum()
    }

    /// True if it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where `len` bytes at `offset` lie; an error unless they are inside one buffer.
    pub fn locate(&self, offset: u64, len: u64) -> Result<Location> {
        let out = || XferError::OutOfRange {
            segment: self.name.clone(),
            offset,
            len,
            size: self.len(),
        };
        let end = offset.checked_add(len).ok_or_else(out)?;
        let mut start = 0u64;
        for (i, b) in self.buffers.iter().enumerate() {
            let stop = start + b.len;
            if offset < stop || (len == 0 && offset == stop) {
                if end > stop {
                    return Err(out());
                }
                return Ok(Location {
                    buffer: i,
                    addr: b.addr + (offset - start),
                    key: b.key,
                });
            }
            start = stop;
        }
        Err(out())
    }
}

/// Checks a name (of a segment or an agent): 1 to 255 bytes, no control characters.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(XferError::TooLarge(format!(
            "a name of {} bytes (1 to {MAX_NAME})",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(XferError::BadMessage(format!(
            "name {name:?} holds control characters"
        )));
    }
    Ok(())
}

/// Segments by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentTable {
    segments: BTreeMap<String, Segment>,
}

impl SegmentTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table of `segments` (a peer's publication): names unique, at most
    /// [`MAX_SEGMENTS`].
    pub fn from_segments(segments: Vec<Segment>) -> Result<Self> {
        let mut t = Self::new();
        for s in segments {
            t.insert(s)?;
        }
        Ok(t)
    }

    /// Adds a segment; its name must be new.
    pub fn insert(&mut self, s: Segment) -> Result<()> {
        if self.segments.contains_key(&s.name) {
            return Err(XferError::Duplicate(s.name));
        }
        if self.segments.len() >= MAX_SEGMENTS {
            return Err(XferError::TooLarge(format!(
                "more than {MAX_SEGMENTS} segments"
            )));
        }
        self.segments.insert(s.name.clone(), s);
        Ok(())
    }

    /// Removes a segment (a peer can no longer reach it once the table goes out again).
    pub fn remove(&mut self, name: &str) -> Result<Segment> {
        self.segments
            .remove(name)
            .ok_or_else(|| XferError::UnknownSegment(name.to_string()))
    }

    /// The segment of this name.
    pub fn get(&self, name: &str) -> Result<&Segment> {
        self.segments
            .get(name)
            .ok_or_else(|| XferError::UnknownSegment(name.to_string()))
    }

    /// Where `len` bytes at `offset` of segment `name` lie.
    pub fn locate(&self, name: &str, offset: u64, len: u64) -> Result<Location> {
        self.get(name)?.locate(offset, len)
    }

    /// The segments, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }

    /// How many segments.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg() -> Segment {
        Segment::new(
            "kv",
            vec![
                Buffer {
                    addr: 0x1000,
                    len: 100,
                    key: 7,
                },
                Buffer {
                    addr: 0x9000,
                    len: 50,
                    key: 8,
                },
            ],
        )
        .unwrap()
    }

    #[test]
    fn offsets_run_through_the_buffers_and_a_range_stays_in_one() {
        let s = seg();
        assert_eq!(s.len(), 150);
        assert_eq!(
            s.locate(10, 90).unwrap(),
            Location {
                buffer: 0,
                addr: 0x100a,
                key: 7
            }
        );
        assert_eq!(
            s.locate(100, 50).unwrap(),
            Location {
                buffer: 1,
                addr: 0x9000,
                key: 8
            }
        );
        // Across the two buffers, past the end, and an overflowing end: refused.
        for (off, len) in [(90, 20), (140, 11), (150, 1), (u64::MAX, 2), (1, u64::MAX)] {
            assert!(
                matches!(s.locate(off, len), Err(XferError::OutOfRange { .. })),
                "{off} {len}"
            );
        }
        // An empty range at the very end is in range.
        assert_eq!(s.locate(150, 0).unwrap().addr, 0x9000 + 50);
    }

    #[test]
    fn bad_segments_and_tables_are_refused() {
        let b = Buffer {
            addr: u64::MAX - 3,
            len: 8,
            key: 1,
        };
        assert!(matches!(
            Segment::new("x", vec![b]),
            Err(XferError::TooLarge(_))
        ));
        assert!(Segment::new("", vec![b]).is_err());
        assert!(Segment::new("a\nb", vec![seg().buffers[0]]).is_err());
        assert!(Segment::new("x".repeat(MAX_NAME + 1), vec![seg().buffers[0]]).is_err());
        assert!(Segment::new("x", vec![]).is_err());
        let mut t = SegmentTable::new();
        t.insert(seg()).unwrap();
        assert_eq!(t.insert(seg()), Err(XferError::Duplicate("kv".into())));
        assert_eq!(
            t.locate("nope", 0, 1),
            Err(XferError::UnknownSegment("nope".into()))
        );
        assert_eq!(t.locate("kv", 100, 5).unwrap().key, 8);
        t.remove("kv").unwrap();
        assert!(t.is_empty());
    }
}
