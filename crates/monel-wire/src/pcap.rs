//! Reading and writing pcap files (the classic libpcap format), so tests and tools can dump or
//! replay traffic for Wireshark. Reading works on a byte slice without allocating; writing
//! needs `std` ([`PcapWriter`]) or uses [`file_header`] / [`record_header`] directly.

use crate::frame::EthernetFrame;
use crate::{Result, WireError};

/// Link type: Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type: raw IP (IPv4 or IPv6 by the version nibble).
pub const LINKTYPE_RAW: u32 = 101;
/// Link type: raw IPv4.
pub const LINKTYPE_IPV4: u32 = 228;
/// Link type: raw IPv6.
pub const LINKTYPE_IPV6: u32 = 229;

const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
const MAGIC_NANOS: u32 = 0xa1b2_3c4d;

/// The 24-byte file header of a little-endian, nanosecond-resolution capture.
pub fn file_header(linktype: u32, snaplen: u32) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&MAGIC_NANOS.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    h[16..20].copy_from_slice(&snaplen.to_le_bytes());
    h[20..24].copy_from_slice(&linktype.to_le_bytes());
    h
}

/// The 16-byte record header for a packet captured at `timestamp_ns` (nanosecond file).
pub fn record_header(timestamp_ns: u64, caplen: u32, origlen: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    let secs = (timestamp_ns / 1_000_000_000) as u32;
    let frac = (timestamp_ns % 1_000_000_000) as u32;
    h[0..4].copy_from_slice(&secs.to_le_bytes());
    h[4..8].copy_from_slice(&frac.to_le_bytes());
    h[8..12].copy_from_slice(&caplen.to_le_bytes());
    h[12..16].copy_from_slice(&origlen.to_le_bytes());
    h
}

/// One captured packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcapRecord<'a> {
    /// Capture time in nanoseconds since the epoch (or since the simulation start).
    pub timestamp_ns: u64,
    /// Length of the packet on the wire (may exceed `data.len()` if truncated by snaplen).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

/// Iterates over the records of a pcap file held in memory. After the first error it yields
/// that error once and then ends.
#[derive(Debug, Clone)]
pub struct PcapReader<'a> {
    data: &'a [u8],
    pos: usize,
    big_endian: bool,
    nanos: bool,
    linktype: u32,
    failed: bool,
}

impl<'a> PcapReader<'a> {
    /// Reads the file header.
    pub fn new(data: &'a [u8]) -> Result<Self> {
        if data.len() < 24 {
            return Err(WireError::BadPcap);
        }
        let magic = [data[0], data[1], data[2], data[3]];
        let (big_endian, nanos) = if magic == MAGIC_MICROS.to_le_bytes() {
            (false, false)
        } else if magic == MAGIC_NANOS.to_le_bytes() {
            (false, true)
        } else if magic == MAGIC_MICROS.to_be_bytes() {
            (true, false)
        } else if magic == MAGIC_NANOS.to_be_bytes() {
            (true, true)
        } else {
            return Err(WireError::BadPcap);
        };
        let mut r = Self {
            data,
            pos: 24,
            big_endian,
            nanos,
            linktype: 0,
            failed: false,
        };
        r.linktype = r.u32_at(20) & 0x0fff_ffff;
        Ok(r)
    }

    /// The link type of every record.
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b = [
            self.data[at],
            self.data[at + 1],
            self.data[at + 2],
            self.data[at + 3],
        ];
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    /// The IP datagram of a record of this file's link type.
    pub fn ip_payload<'b>(&self, record: &PcapRecord<'b>) -> Result<&'b [u8]> {
        match self.linktype {
            LINKTYPE_ETHERNET => EthernetFrame::new_checked(record.data)?.ip_payload(),
            LINKTYPE_RAW | LINKTYPE_IPV4 | LINKTYPE_IPV6 => Ok(record.data),
            _ => Err(WireError::BadPcap),
        }
    }
}

impl<'a> Iterator for PcapReader<'a> {
    type Item = Result<PcapRecord<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos == self.data.len() {
            return None;
        }
        if self.data.len() - self.pos < 16 {
            self.failed = true;
            return Some(Err(WireError::BadPcap));
        }
        let secs = u64::from(self.u32_at(self.pos));
        let frac = u64::from(self.u32_at(self.pos + 4));
        let caplen = self.u32_at(self.pos + 8) as usize;
        let orig_len = self.u32_at(self.pos + 12);
        let start = self.pos + 16;
        if caplen > self.data.len() - start || (self.nanos && frac >= 1_000_000_000) {
            self.failed = true;
            return Some(Err(WireError::BadPcap));
        }
        self.pos = start + caplen;
        let frac_ns = if self.nanos {
            frac
        } else {
            frac.saturating_mul(1000)
        };
        Some(Ok(PcapRecord {
            timestamp_ns: secs.saturating_mul(1_000_000_000).saturating_add(frac_ns),
            orig_len,
            data: &self.data[start..start + caplen],
        }))
    }
}

/// Writes a nanosecond pcap file to any `std::io::Write`.
#[cfg(feature = "std")]
#[derive(Debug)]
pub struct PcapWriter<W: std::io::Write> {
    out: W,
}

#[cfg(feature = "std")]
impl<W: std::io::Write> PcapWriter<W> {
    /// Writes the file header.
    pub fn new(mut out: W, linktype: u32) -> std::io::Result<Self> {
        out.write_all(&file_header(linktype, 65_535))?;
        Ok(Self { out })
    }
    /// Appends one packet.
    pub fn write_packet(&mut self, timestamp_ns: u64, data: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(data.len()).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "packet too long")
        })?;
        self.out.write_all(&record_header(timestamp_ns, len, len))?;
        self.out.write_all(data)
    }
    /// Flushes and returns the writer.
    pub fn into_inner(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut w = PcapWriter::new(Vec::new(), LINKTYPE_RAW).unwrap();
        w.write_packet(1_500_000_123, &[0x45, 1, 2]).unwrap();
        w.write_packet(2_000_000_000, &[]).unwrap();
        let bytes = w.into_inner().unwrap();
        let r = PcapReader::new(&bytes).unwrap();
        assert_eq!(r.linktype(), LINKTYPE_RAW);
        let recs: Vec<_> = r.map(|x| x.unwrap()).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].timestamp_ns, 1_500_000_123);
        assert_eq!(recs[0].data, &[0x45, 1, 2]);
        assert_eq!(recs[1].data.len(), 0);
    }

    #[test]
    fn truncated_files_error_once() {
        let mut w = PcapWriter::new(Vec::new(), LINKTYPE_RAW).unwrap();
        w.write_packet(1, &[1, 2, 3, 4]).unwrap();
        let bytes = w.into_inner().unwrap();
        assert!(PcapReader::new(&bytes[..10]).is_err());
        let mut r = PcapReader::new(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(r.next(), Some(Err(WireError::BadPcap)));
        assert_eq!(r.next(), None);
    }
}
