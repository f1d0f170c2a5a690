//! perftest's out-of-band exchange over TCP ("Data ex. method : Ethernet"), as perftest 4.5
//! (version string 6.06, Debian 12's) speaks it, so `ib_write_bw` and its siblings run
//! against Monel: versions, page and cache-line sizes, the MTU, then each QP's keys as a
//! 108-byte text line, handshakes that repeat the keys as barriers, bandwidth reports, and
//! `done`. In every exchange the client writes first and the server reads first; each
//! message is one write, as perftest reads each with one `read`. Every field from the peer
//! is checked before use.

use std::io::{Read, Write};
use std::net::TcpStream;

use monel_verbs::Gid;

/// The version Monel says it speaks (perftest refuses peers older than 5.70).
pub(crate) const VERSION: &str = "6.06";
/// Length of a keys message with a GID, NUL included.
pub(crate) const KEYS_LEN: usize = 108;

/// One QP's keys (`struct pingpong_dest`, as perftest prints it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keys {
    pub(crate) lid: u16,
    pub(crate) out_reads: u16,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) rkey: u32,
    pub(crate) vaddr: u64,
    pub(crate) gid: Gid,
    pub(crate) srqn: u32,
}

impl Keys {
    /// `%04x:%04x:%06x:%06x:%08x:%016llx:` then the GID as 16 `%02x:`, then `%08x:` and NUL.
    pub(crate) fn encode(&self) -> [u8; KEYS_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid.0 {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEYS_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses a peer's keys; every field must be hex of its width.
    pub(crate) fn decode(b: &[u8; KEYS_LEN]) -> Result<Self, String> {
        let end = b.iter().position(|&c| c == 0).unwrap_or(KEYS_LEN);
        let text = std::str::from_utf8(&b[..end]).map_err(|_| "keys message is not text")?;
        let f: Vec<&str> = text.split(':').collect();
        // 6 fields, 16 GID bytes, the SRQ number, and the empty tail after the last colon.
        if f.len() != 24 || !f[23].is_empty() {
            return Err(format!("keys message has {} fields: {text:?}", f.len()));
        }
        let hex = |s: &str, width: usize| -> Result<u64, String> {
            if s.is_empty() || s.len() > width || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!("keys field {s:?} is not {width} hex digits"));
            }
            u64::from_str_radix(s, 16).map_err(|e| e.to_string())
        };
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(f[6 + i], 2)? as u8;
        }
        Ok(Self {
            lid: hex(f[0], 4)? as u16,
            out_reads: hex(f[1], 4)? as u16,
            qpn: hex(f[2], 6)? as u32,
            psn: hex(f[3], 6)? as u32,
            rkey: hex(f[4], 8)? as u32,
            vaddr: hex(f[5], 16)?,
            gid: Gid(gid),
            srqn: hex(f[22], 8)? as u32,
        })
    }
}

/// A bandwidth report as perftest exchanges it (each number big-endian, one message each).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct BwNumbers {
    pub(crate) size: u64,
    pub(crate) iters: u64,
    pub(crate) bw_peak: f64,
    pub(crate) bw_avg: f64,
    pub(crate) msg_rate: f64,
}

/// The exchange on one TCP connection.
#[derive(Debug)]
pub(crate) struct Oob {
    s: TcpStream,
    client: bool,
}

/// What both sides agreed before the QPs are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Agreed {
    /// The larger page size (perftest's cycle buffer).
    pub(crate) cycle_buffer: u32,
    /// The larger cache-line size.
    pub(crate) cache_line: u32,
    /// The smaller MTU (`IBV_MTU_*` code).
    pub(crate) mtu_code: u8,
}

fn io_err(what: &str, e: std::io::Error) -> String {
    format!("perftest exchange, {what}: {e}")
}

impl Oob {
    /// Wraps a connected stream; `client`: this side connected (it writes first).
    pub(crate) fn new(s: TcpStream, client: bool) -> std::io::Result<Self> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(120)))?;
        Ok(Self { s, client })
    }

    /// One exchange of `mine` for as many bytes of theirs.
    fn xchg(&mut self, what: &str, mine: &[u8], theirs: &mut [u8]) -> Result<(), String> {
        if self.client {
            self.s.write_all(mine).map_err(|e| io_err(what, e))?;
            self.s.read_exact(theirs).map_err(|e| io_err(what, e))
        } else {
            self.s.read_exact(theirs).map_err(|e| io_err(what, e))?;
            self.s.write_all(mine).map_err(|e| io_err(what, e))
        }
    }

    /// Versions, page and cache-line sizes, MTU; returns what both agreed.
    pub(crate) fn open(
        &mut self,
        page: u32,
        cache_line: u32,
        mtu_code: u8,
    ) -> Result<Agreed, String> {
        let mut v = [0u8; 16];
        v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; 16];
        self.xchg("versions", &v, &mut theirs)?;
        let end = theirs.iter().position(|&c| c == 0).unwrap_or(16);
        let rv = std::str::from_utf8(&theirs[..end])
            .ok()
            .and_then(|t| t.trim().parse::<f64>().ok())
            .ok_or_else(|| format!("perftest peer sent version {:?}", &theirs[..end]))?;
        if rv < 5.70 {
            return Err(format!(
                "perftest peer speaks version {rv}; Monel speaks the exchange of 5.70 and later"
            ));
        }
        let mut r4 = [0u8; 4];
        self.xchg("page size", &page.to_be_bytes(), &mut r4)?;
        let their_page = u32::from_be_bytes(r4);
        self.xchg("cache line", &cache_line.to_be_bytes(), &mut r4)?;
        let their_line = u32::from_be_bytes(r4);
        // perftest sizes buffers by these: refuse absurd ones before allocating.
        if !(1..=1 << 24).contains(&their_page) || !(1..=4096).contains(&their_line) {
            return Err(format!(
                "perftest peer sent page size {their_page} and cache line {their_line}"
            ));
        }
        let mine = [b'0' + mtu_code, 0];
        let mut rm = [0u8; 2];
        self.xchg("MTU", &mine, &mut rm)?;
        let their_mtu = match rm {
            [c @ b'1'..=b'5', 0] => c - b'0',
            _ => return Err(format!("perftest peer sent MTU {rm:?}")),
        };
        Ok(Agreed {
            cycle_buffer: page.max(their_page),
            cache_line: cache_line.max(their_line),
            mtu_code: mtu_code.min(their_mtu),
        })
    }

    /// `ctx_hand_shake`: our keys for theirs.
    pub(crate) fn hand_shake(&mut self, mine: &Keys) -> Result<Keys, String> {
        let mut b = [0u8; KEYS_LEN];
        self.xchg("keys", &mine.encode(), &mut b)?;
        Keys::decode(&b)
    }

    /// `xchg_bw_reports`: size, iterations, peak, average, message rate.
    pub(crate) fn bw_reports(&mut self, mine: &BwNumbers) -> Result<BwNumbers, String> {
        let mut b = [0u8; 8];
        let mut u = |me: &mut Self, what: &str, v: u64| -> Result<u64, String> {
            me.xchg(what, &v.to_be_bytes(), &mut b)?;
            Ok(u64::from_be_bytes(b))
        };
        let size = u(self, "report size", mine.size)?;
        let iters = u(self, "report iterations", mine.iters)?;
        let bw_peak = f64::from_bits(u(self, "report peak", mine.bw_peak.to_bits())?);
        let bw_avg = f64::from_bits(u(self, "report average", mine.bw_avg.to_bits())?);
        let msg_rate = f64::from_bits(u(self, "report rate", mine.msg_rate.to_bits())?);
        Ok(BwNumbers {
            size,
            iters,
            bw_peak,
            bw_avg,
            msg_rate,
        })
    }

    /// `ctx_close_connection`: a last handshake, then `done` (and the peer's, if it comes).
    pub(crate) fn close(mut self, mine: &Keys) -> Result<(), String> {
        self.hand_shake(mine)?;
        self.s.write_all(b"done\0").map_err(|e| io_err("done", e))?;
        let mut d = [0u8; 5];
        let _ = self.s.read_exact(&mut d);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_in_perftests_layout() {
        let k = Keys {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x5566_7788_99aa,
            gid: Gid::from_ip("10.77.0.2".parse().unwrap()),
            srqn: 0,
        };
        let b = k.encode();
        let text = std::str::from_utf8(&b[..KEYS_LEN - 1]).unwrap();
        assert_eq!(
            text,
            "0000:0010:000011:abcdef:00001234:00005566778899aa:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:"
        );
        assert_eq!(b[KEYS_LEN - 1], 0);
        assert_eq!(Keys::decode(&b), Ok(k));
    }

    #[test]
    fn hostile_keys_are_refused() {
        let good = Keys {
            lid: 0,
            out_reads: 1,
            qpn: 1,
            psn: 1,
            rkey: 1,
            vaddr: 1,
            gid: Gid::default(),
            srqn: 0,
        }
        .encode();
        let mut b = good;
        b[0] = b'g';
        assert!(Keys::decode(&b).is_err());
        let mut b = good;
        b[4] = b'0'; // the first colon gone: a field too wide
        assert!(Keys::decode(&b).is_err());
        let mut b = [b':'; KEYS_LEN];
        b[KEYS_LEN - 1] = 0;
        assert!(Keys::decode(&b).is_err());
        assert!(Keys::decode(&[0u8; KEYS_LEN]).is_err());
        assert!(Keys::decode(&[0xffu8; KEYS_LEN]).is_err());
    }

    /// Both roles over a real socket pair: versions, sizes, MTU, keys, reports, done.
    #[test]
    fn both_roles_agree_over_tcp() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let keys = |qpn| Keys {
            lid: 0,
            out_reads: 16,
            qpn,
            psn: 7,
            rkey: 9,
            vaddr: 0x1000,
            gid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            srqn: 0,
        };
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut o = Oob::new(s, false).unwrap();
            let a = o.open(4096, 64, 5).unwrap();
            let theirs = o.hand_shake(&keys(2)).unwrap();
            let r = o.bw_reports(&BwNumbers::default()).unwrap();
            o.close(&keys(2)).unwrap();
            (a, theirs, r)
        });
        let mut o = Oob::new(TcpStream::connect(at).unwrap(), true).unwrap();
        let a = o.open(8192, 64, 3).unwrap();
        let theirs = o.hand_shake(&keys(1)).unwrap();
        let mine = BwNumbers {
            size: 65536,
            iters: 1000,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.001,
        };
        o.bw_reports(&mine).unwrap();
        o.close(&keys(1)).unwrap();
        let (sa, stheirs, sr) = server.join().unwrap();
        assert_eq!(a, sa);
        assert_eq!(a.cycle_buffer, 8192);
        assert_eq!(a.mtu_code, 3);
        assert_eq!((theirs.qpn, stheirs.qpn), (2, 1));
        assert_eq!(sr, mine);
    }
}
