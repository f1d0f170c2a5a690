//! A verified bulk RDMA WRITE: the client fills a region with a seeded pattern and WRITEs it
//! into the server's region in chunks; then both sides compare CRC-32s over the setup stream,
//! and the server names the first wrong byte if they differ. It measures goodput under
//! whatever the network does (loss, reordering, ECN), and proves no byte was lost or misplaced.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use monel_verbs::cm::{BufferInfo, Connection};
use monel_verbs::{
    CompletionQueue, MemoryRegion, QueuePair, RemoteAddr, SendFlags, SendOp, SendWr,
};
use monel_verbs::{ErrorKind, VerbsError};
use monel_verbs::{Result, WcStatus};

const V: &str = "transfer";

/// Fills `buf` with the pattern of `seed` (splitmix64 words, little-endian).
pub(crate) fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed;
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&splitmix(&mut x).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = splitmix(&mut x).to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}

/// The first offset where `buf` differs from the pattern of `seed`.
pub(crate) fn first_mismatch(buf: &[u8], seed: u64) -> Option<usize> {
    let mut x = seed;
    for (i, c) in buf.chunks(8).enumerate() {
        let w = splitmix(&mut x).to_le_bytes();
        if let Some(j) = c.iter().zip(w).position(|(a, b)| *a != b) {
            return Some(i * 8 + j);
        }
    }
    None
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// CRC-32 (IEEE) of `buf`.
pub(crate) fn checksum(buf: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(buf);
    h.finalize()
}

/// What a transfer did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TransferReport {
    /// Bytes written.
    pub(crate) bytes: u64,
    /// WRITE messages posted.
    pub(crate) messages: u64,
    /// From the first post to the last completion.
    pub(crate) seconds: f64,
    /// CRC-32 of the data (both sides agreed on it).
    pub(crate) crc: u32,
    /// Lowest DCQCN rate seen while sending, in b/s (`None` without a rate controller).
    pub(crate) min_rate_bps: Option<f64>,
}

impl TransferReport {
    /// Goodput in Gb/s (verified payload bytes over time).
    pub(crate) fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.seconds / 1e9
    }
}

/// How to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TransferOptions {
    /// Bytes per WRITE.
    pub(crate) chunk: usize,
    /// WRITEs in flight.
    pub(crate) depth: u32,
    /// Seed of the pattern (the server is told it, to name a wrong byte).
    pub(crate) seed: u64,
    /// Longest wait for any one completion.
    pub(crate) timeout: Duration,
}

impl Default for TransferOptions {
    fn default() -> Self {
        Self {
            chunk: 1 << 20,
            depth: 16,
            seed: 1,
            timeout: Duration::from_secs(20),
        }
    }
}

fn err(why: String) -> VerbsError {
    VerbsError::new(V, ErrorKind::Peer(why))
}

fn io(e: std::io::Error) -> VerbsError {
    VerbsError::io(V, e)
}

/// Client: WRITEs all of `mr` (already filled by [`fill_pattern`] with `o.seed`) to `remote`,
/// then has the server check it. Errors name a failed completion or the first wrong byte.
pub(crate) fn write_client(
    qp: &QueuePair,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    remote: BufferInfo,
    conn: &mut Connection,
    o: &TransferOptions,
) -> Result<TransferReport> {
    let len = mr.len();
    if remote.len < len as u64 {
        return Err(err(format!(
            "server region {} B is smaller than {len} B",
            remote.len
        )));
    }
    let crc = mr.with(|b| checksum(b));
    let chunk = o.chunk.clamp(1, 1 << 30);
    let n = len.div_ceil(chunk) as u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let mut min_rate: Option<f64> = None;
    let mut wcs = Vec::new();
    let start = Instant::now();
    let mut last_progress = Instant::now();
    while done < n {
        while posted < n && posted - done < u64::from(o.depth.max(1)) {
            let off = posted as usize * chunk;
            let l = chunk.min(len - off);
            qp.post_send(SendWr {
                wr_id: posted,
                op: SendOp::Write(RemoteAddr {
                    addr: remote.addr + off as u64,
                    rkey: remote.rkey,
                }),
                sg_list: vec![mr.sge(off, l)],
                flags: SendFlags {
                    signaled: true,
                    ..SendFlags::default()
                },
            })?;
            posted += 1;
        }
        wcs.clear();
        if cq.poll_into(64, &mut wcs) == 0 {
            cq.wait(Duration::from_millis(20));
        }
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(err(format!(
                    "WRITE {} of {n} completed with {:?}",
                    wc.wr_id, wc.status
                )));
            }
            done += 1;
            last_progress = Instant::now();
        }
        // Devices whose NIC runs congestion control keep no rate here.
        if let Some(r) = qp.congestion().ok().and_then(|m| m.rate_bps) {
            min_rate = Some(min_rate.map_or(r, |m: f64| m.min(r)));
        }
        if last_progress.elapsed() > o.timeout {
            return Err(VerbsError::new(
                V,
                ErrorKind::Timeout(format!(
                    "no completion for {:?} ({done} of {n} WRITEs done; QP {:?}, {:?})",
                    o.timeout,
                    qp.query().map(|a| a.0),
                    qp.stats()
                )),
            ));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // Every WRITE completed, so every byte is placed at the server. Ask it to check.
    let mut m = [0u8; 20];
    m[..8].copy_from_slice(&(len as u64).to_be_bytes());
    m[8..12].copy_from_slice(&crc.to_be_bytes());
    m[12..].copy_from_slice(&o.seed.to_be_bytes());
    conn.stream.write_all(&m).map_err(io)?;
    let mut r = [0u8; 12];
    conn.stream.read_exact(&mut r).map_err(io)?;
    let theirs = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
    let bad = u64::from_be_bytes(r[4..12].try_into().unwrap_or_default());
    if theirs != crc {
        return Err(err(format!(
            "data differs: server CRC {theirs:08x}, client {crc:08x}, first wrong byte at offset {bad}"
        )));
    }
    Ok(TransferReport {
        bytes: len as u64,
        messages: n,
        seconds,
        crc,
        min_rate_bps: min_rate,
    })
}

/// Server: waits for the client's CRC, checks its region `mr` (the one it offered) against
/// it, and answers. Returns the CRC it computed; a mismatch is an error naming the first
/// wrong byte.
pub(crate) fn write_server(mr: &MemoryRegion, conn: &mut Connection) -> Result<u32> {
    let mut m = [0u8; 20];
    conn.stream.read_exact(&mut m).map_err(io)?;
    let len = u64::from_be_bytes(m[..8].try_into().unwrap_or_default()) as usize;
    let want = u32::from_be_bytes(m[8..12].try_into().unwrap_or_default());
    let seed = u64::from_be_bytes(m[12..].try_into().unwrap_or_default());
    if len > mr.len() {
        return Err(err(format!(
            "client claims {len} B, region holds {}",
            mr.len()
        )));
    }
    let (crc, bad) = mr.with(|b| {
        let crc = checksum(&b[..len]);
        let bad = if crc == want {
            None
        } else {
            first_mismatch(&b[..len], seed)
        };
        (crc, bad)
    });
    let mut r = [0u8; 12];
    r[..4].copy_from_slice(&crc.to_be_bytes());
    r[4..].copy_from_slice(&(bad.unwrap_or(u64::MAX as usize) as u64).to_be_bytes());
    conn.stream.write_all(&r).map_err(io)?;
    if crc != want {
        return Err(err(format!(
            "data differs: CRC {crc:08x}, client sent {want:08x}; first wrong byte at offset {}",
            bad.map_or("?".into(), |b| b.to_string())
        )));
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_seeded_and_mismatch_is_found() {
        let mut a = vec![0u8; 1003];
        fill_pattern(&mut a, 7);
        assert_eq!(first_mismatch(&a, 7), None);
        assert_eq!(first_mismatch(&a, 8), Some(0));
        a[517] ^= 0x10;
        assert_eq!(first_mismatch(&a, 7), Some(517));
        let mut b = vec![0u8; 1003];
        fill_pattern(&mut b, 7);
        assert_ne!(checksum(&a), checksum(&b));
        b[517] ^= 0x10;
        assert_eq!(checksum(&a), checksum(&b));
    }
}
