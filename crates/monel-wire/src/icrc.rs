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
    let ip_len = ip_header.len();
    if !(ip_len == 20 || ip_len == 40) || udp_header.len() != 8 {
        return Err(WireError::BadLength);
    }
    if roce.len() < 12 {
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
    let bth = udp + 8;
    pre[bth..bth + 12].copy_from_slice(&roce[..12]);
    pre[bth + 4] = 0xff; // FECN, BECN, resv6a
    let mut h = crc32fast::Hasher::new();
    h.update(&pre[..bth + 12]);
    h.update(&roce[12..]);
    Ok(h.finalize())
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

    #[test]
    fn vector_b_uc_send_only() {
        let ip = hex("4501 0040 0478 4000 4011 b4d5 c0a80007 c0a80007");
        let udp = hex("c000 12b7 002c aca2");
        let roce = hex("2460ffff000000d300cf1710 4630818be28935d90e9a95505401be885e50 0000");
        let icrc = compute(&ip, &udp, &roce).unwrap();
        assert_eq!(icrc, 0xf353_f378);
        assert_eq!(icrc.to_le_bytes(), [0x78, 0xf3, 0x53, 0xf3]);
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let mut ip = hex("4501 0040 0478 4000 4011 b4d5 c0a80007 c0a80007");
        let mut udp = hex("c000 12b7 002c aca2");
        let mut roce = hex("2460ffff000000d300cf1710 4630818be28935d90e9a95505401be885e50 0000");
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
}
