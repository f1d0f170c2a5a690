//! The invariant CRC, exactly as Linux rxe (`rxe_icrc.c`) and RoCE NICs compute it.
//!
//! ICRC = CRC-32 (IEEE 802.3, as zlib) over `ff ff ff ff ff ff ff ff` ‖ IP header ‖ UDP header ‖
//! BTH ‖ extension headers ‖ payload ‖ pad, where the fields routers may change are masked to
//! ones: IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and hop limit; the
//! UDP checksum; BTH byte 4 (FECN, BECN, reserved). The eight `0xff` bytes stand for the masked
//! LRH of native InfiniBand. The value goes on the wire in little-endian byte order.

use crate::{Result, WireError};

const PREFIX: usize = 8;

/// Computes the ICRC of a RoCEv2 packet from its IP header (20 bytes for IPv4 without options,
/// 40 for IPv6), its UDP header (8 bytes) and the RoCE packet without its trailing ICRC.
pub fn compute(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    if roce.len() < 12 {
        return Err(WireError::Truncated);
    }
    let mut s = IcrcStream::new(ip_header, udp_header, &roce[..12])?;
    s.update(&roce[12..]);
    Ok(s.finish())
}

/// The ICRC of a packet whose bytes are not contiguous (its headers in one buffer, its
/// payload gathered from elsewhere): started from the IP and UDP headers and the BTH, then
/// fed the rest of the packet in order, without the ICRC itself.
#[derive(Clone)]
pub struct IcrcStream {
    h: crc32fast::Hasher,
}

impl IcrcStream {
    /// Starts from the IP header (20 or 40 bytes), the UDP header (8) and the BTH (12).
    pub fn new(ip_header: &[u8], udp_header: &[u8], bth: &[u8]) -> Result<Self> {
        let ip_len = ip_header.len();
        if !(ip_len == 20 || ip_len == 40) || udp_header.len() != 8 {
            return Err(WireError::BadLength);
        }
        if bth.len() != 12 {
            return Err(WireError::Truncated);
        }
        let mut pre = [0u8; PREFIX + 40 + 8 + 12];
        pre[..PREFIX].fill(0xff);
        let ip = PREFIX..PREFIX + ip_len;
        pre[ip.clone()].copy_from_slice(ip_header);
        let ipb = &mut pre[ip];
        if ip_len == 20 {
            ipb[1] = 0xff; // TOS
            ipb[8] = 0xff; // TTL
            ipb[10] = 0xff; // header checksum
            ipb[11] = 0xff;
        } else {
            ipb[0] |= 0x0f; // traffic class, high nibble
            ipb[1] = 0xff; // traffic class low nibble + flow label
            ipb[2] = 0xff;
            ipb[3] = 0xff;
            ipb[7] = 0xff; // hop limit
        }
        let udp = PREFIX + ip_len;
        pre[udp..udp + 8].copy_from_slice(udp_header);
        pre[udp + 6] = 0xff; // UDP checksum
        pre[udp + 7] = 0xff;
        let bth_at = udp + 8;
        pre[bth_at..bth_at + 12].copy_from_slice(bth);
        pre[bth_at + 4] = 0xff; // FECN, BECN, resv6a
        let mut h = crc32fast::Hasher::new();
        h.update(&pre[..bth_at + 12]);
        Ok(Self { h })
    }

    /// Feeds the next bytes of the packet.
    pub fn update(&mut self, bytes: &[u8]) {
        self.h.update(bytes);
    }

    /// The ICRC (as a number; it goes on the wire little-endian).
    pub fn finish(self) -> u32 {
        self.h.finalize()
    }
}

/// What a receiver behind a UDP socket needs to check IPv4 ICRCs: the socket shows the
/// addresses, ports, lengths and TOS, but not the IP identification field, which the ICRC
/// covers. CRC-32 is affine, so the 16 unknown ID bits change the CRC by a linear map `L`; for
/// one datagram length this basis holds `L(1 << i)` for each bit. Given the CRC computed with
/// ID 0, [`Ipv4IdBasis::solve`] finds the one ID (if any) that makes the carried ICRC right.
/// A corrupted packet passes only if its error happens to equal some `L(id)`: a chance of
/// 2^-16 instead of 2^-32, and the recovered ID can be checked for plausibility on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdBasis {
    /// Reduced rows: (32-bit CRC difference, 16-bit ID combination), highest pivot first.
    rows: [(u32, u16); 16],
    n: usize,
}

impl Ipv4IdBasis {
    /// The basis for IPv4 RoCE packets whose RoCE part (BTH through ICRC) is `roce_len` bytes.
    pub fn new(roce_len: usize) -> Self {
        // Covered bytes: 8 prefix + 20 IP + 8 UDP + roce_len - 4 (ICRC). The ID is at
        // offset 8 + 4 of the covered stream.
        let covered = PREFIX + 20 + 8 + roce_len.saturating_sub(4);
        let zero = crc_with_bit(covered, None);
        let mut rows = [(0u32, 0u16); 16];
        let mut n = 0;
        for bit in 0..16u16 {
            let mut v = crc_with_bit(covered, Some(bit)) ^ zero;
            let mut combo = 1u16 << bit;
            // Reduce against existing rows (kept in echelon form by pivot bit).
            for &(rv, rc) in &rows[..n] {
                if v & (1 << (31 - rv.leading_zeros())) != 0 {
                    v ^= rv;
                    combo ^= rc;
                }
            }
            if v != 0 {
                // Eliminate the new pivot from the earlier rows to keep the basis reduced.
                let pivot = 1u32 << (31 - v.leading_zeros());
                for row in &mut rows[..n] {
                    if row.0 & pivot != 0 {
                        row.0 ^= v;
                        row.1 ^= combo;
                    }
                }
                rows[n] = (v, combo);
                n += 1;
            }
        }
        Self { rows, n }
    }

    /// The IP identification that turns `computed_with_id0` into `carried`, if one exists.
    pub fn solve(&self, computed_with_id0: u32, carried: u32) -> Option<u16> {
        let mut d = computed_with_id0 ^ carried;
        let mut id = 0u16;
        for &(rv, rc) in &self.rows[..self.n] {
            if d & (1 << (31 - rv.leading_zeros())) != 0 {
                d ^= rv;
                id ^= rc;
            }
        }
        (d == 0).then_some(id)
    }
}

/// CRC-32 of `len` zero bytes, with one bit of the IPv4 ID field (covered offset 12..14) set.
fn crc_with_bit(len: usize, bit: Option<u16>) -> u32 {
    const ZEROS: [u8; 256] = [0; 256];
    let mut h = crc32fast::Hasher::new();
    let mut head = [0u8; 14];
    if let Some(b) = bit {
        let v = (1u16 << b).to_be_bytes();
        head[12] = v[0];
        head[13] = v[1];
    }
    h.update(&head);
    let mut left = len - head.len();
    while left > 0 {
        let k = left.min(ZEROS.len());
        h.update(&ZEROS[..k]);
        left -= k;
    }
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn seed_is_rxe_constant() {
        // rxe seeds its raw CRC register with 0xdebb20e3, the CRC of eight 0xff bytes.
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        assert_eq!(!h.finalize(), 0xdebb_20e3);
    }

    #[test]
    fn vector_a_connectx4_cnp() {
        let ip = hex("45c2 003c 718c 4000 4011 9161 0a001101 0a001201");
        let udp = hex("0000 12b7 0028 0000");
        let roce = hex("8100ffff40000118 00000000 00000000000000000000000000000000");
        let icrc = compute(&ip, &udp, &roce).unwrap();
        assert_eq!(icrc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
    }

    /// Vector B: a UC SEND_ONLY as IPv4 header, UDP header, RoCE packet without its ICRC.
    fn vector_b() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        (
            hex("4501 0040 0478 4000 4011 b4d5 c0a80007 c0a80007"),
            hex("c000 12b7 002c aca2"),
            hex("2460ffff000000d300cf1710 4630818be28935d90e9a95505401be885e50 0000"),
        )
    }

    #[test]
    fn vector_b_uc_send_only() {
        let (ip, udp, roce) = vector_b();
        let icrc = compute(&ip, &udp, &roce).unwrap();
        assert_eq!(icrc, 0xf353_f378);
        assert_eq!(icrc.to_le_bytes(), [0x78, 0xf3, 0x53, 0xf3]);
    }

    #[test]
    fn a_stream_over_any_split_equals_the_whole() {
        let (ip, udp, roce) = vector_b();
        let whole = compute(&ip, &udp, &roce).unwrap();
        for cut in 12..roce.len() {
            for cut2 in cut..roce.len() {
                let mut s = IcrcStream::new(&ip, &udp, &roce[..12]).unwrap();
                s.update(&roce[12..cut]);
                s.update(&roce[cut..cut2]);
                s.update(&roce[cut2..]);
                assert_eq!(s.finish(), whole, "cuts at {cut} and {cut2}");
            }
        }
        assert_eq!(
            IcrcStream::new(&ip, &udp, &roce[..11]).err(),
            Some(WireError::Truncated)
        );
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let (mut ip, mut udp, mut roce) = vector_b();
        let base = compute(&ip, &udp, &roce).unwrap();
        ip[1] = 0x03; // ECN CE
        ip[8] = 1; // TTL
        ip[10] = 0;
        udp[6] = 0;
        udp[7] = 0;
        roce[4] = 0x40; // BECN
        assert_eq!(compute(&ip, &udp, &roce).unwrap(), base);
        roce[11] ^= 1; // PSN is covered
        assert_ne!(compute(&ip, &udp, &roce).unwrap(), base);
    }

    #[test]
    fn ipv6_masks_flow_and_hop_limit() {
        let mut ip6 = hex(
            "6000 0000 0024 1140 fe800000000000000000000000000001 fe800000000000000000000000000002",
        );
        let udp = hex("c000 12b7 0024 0000");
        let roce = hex("0400ffff00000011 80000001 00000000 01020304");
        let base = compute(&ip6, &udp, &roce).unwrap();
        ip6[0] = 0x6a;
        ip6[1] = 0xbc;
        ip6[3] = 0x77;
        ip6[7] = 1;
        assert_eq!(compute(&ip6, &udp, &roce).unwrap(), base);
        ip6[0] = 0x7f; // the version nibble is covered
        assert_ne!(compute(&ip6, &udp, &roce).unwrap(), base);
        assert_eq!(compute(&ip6[..39], &udp, &roce), Err(WireError::BadLength));
    }

    #[test]
    fn unknown_ipv4_id_is_recovered_and_corruption_caught() {
        let (mut ip, udp, roce) = vector_b();
        let carried = compute(&ip, &udp, &roce).unwrap();
        ip[4] = 0;
        ip[5] = 0;
        let with0 = compute(&ip, &udp, &roce).unwrap();
        let basis = Ipv4IdBasis::new(roce.len() + 4);
        assert_eq!(basis.solve(with0, carried), Some(0x0478));
        assert_eq!(basis.solve(with0, with0), Some(0));
        let mut bad = roce.clone();
        bad[20] ^= 0x10;
        let wrong = compute(&ip, &udp, &bad).unwrap();
        assert_eq!(basis.solve(wrong, carried), None);
        for id in [1u16, 0x8000, 0xffff, 0x1234] {
            ip[4..6].copy_from_slice(&id.to_be_bytes());
            let c = compute(&ip, &udp, &roce).unwrap();
            assert_eq!(basis.solve(with0, c), Some(id));
        }
    }
}
