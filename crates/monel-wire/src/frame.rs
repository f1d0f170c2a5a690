//! The framing the ICRC covers: Ethernet, IPv4 (no options) or IPv6 (no extension headers),
//! and UDP. Parse a received datagram with [`IpFrame::parse`]; build one with [`FrameRepr`].

use crate::field::{be16, be32, header_view, set16, set32};
use crate::{ICRC_LEN, Result, RocePacket, WireError, icrc};

/// An IP address of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpAddress {
    /// IPv4.
    V4([u8; 4]),
    /// IPv6.
    V6([u8; 16]),
}

impl From<core::net::IpAddr> for IpAddress {
    fn from(ip: core::net::IpAddr) -> Self {
        match ip {
            core::net::IpAddr::V4(a) => Self::V4(a.octets()),
            core::net::IpAddr::V6(a) => Self::V6(a.octets()),
        }
    }
}

impl From<IpAddress> for core::net::IpAddr {
    fn from(ip: IpAddress) -> Self {
        match ip {
            IpAddress::V4(a) => Self::from(a),
            IpAddress::V6(a) => Self::from(a),
        }
    }
}

impl IpAddress {
    /// The RoCEv2 GID of this address (IPv4-mapped `::ffff:a.b.c.d` for IPv4), as rxe does.
    pub const fn to_gid(self) -> [u8; 16] {
        match self {
            Self::V4(a) => [
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
            ],
            Self::V6(a) => a,
        }
    }
    /// The address a GID stands for (rxe's `rdma_gid2ip`).
    pub const fn from_gid(g: [u8; 16]) -> Self {
        let mapped = g[0] == 0
            && g[1] == 0
            && g[2] == 0
            && g[3] == 0
            && g[4] == 0
            && g[5] == 0
            && g[6] == 0
            && g[7] == 0
            && g[8] == 0
            && g[9] == 0
            && g[10] == 0xff
            && g[11] == 0xff;
        if mapped {
            Self::V4([g[12], g[13], g[14], g[15]])
        } else {
            Self::V6(g)
        }
    }
}

impl core::fmt::Display for IpAddress {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::V4(a) => write!(f, "{}.{}.{}.{}", a[0], a[1], a[2], a[3]),
            Self::V6(a) => {
                for (i, pair) in a.chunks_exact(2).enumerate() {
                    if i > 0 {
                        f.write_str(":")?;
                    }
                    write!(f, "{:x}", u16::from_be_bytes([pair[0], pair[1]]))?;
                }
                Ok(())
            }
        }
    }
}

/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Ethertype of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

header_view!(
    /// Ethernet II header (14 bytes).
    EthernetFrame,
    14
);
impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Destination MAC.
    pub fn dst(&self) -> [u8; 6] {
        let b = self.buffer.as_ref();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }
    /// Source MAC.
    pub fn src(&self) -> [u8; 6] {
        let b = self.buffer.as_ref();
        [b[6], b[7], b[8], b[9], b[10], b[11]]
    }
    /// Ethertype.
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), 12)
    }
}

impl<'a> EthernetFrame<&'a [u8]> {
    /// The IP datagram inside, skipping one 802.1Q tag if present.
    pub fn ip_payload(&self) -> Result<&'a [u8]> {
        self.check_len()?;
        let b: &'a [u8] = self.buffer;
        let (ty, at) = if self.ethertype() == ETHERTYPE_VLAN {
            if b.len() < 18 {
                return Err(WireError::Truncated);
            }
            (be16(b, 16), 18)
        } else {
            (self.ethertype(), 14)
        };
        match ty {
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => Ok(&b[at..]),
            _ => Err(WireError::NotUdp),
        }
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets addresses and ethertype.
    pub fn set(&mut self, dst: [u8; 6], src: [u8; 6], ethertype: u16) {
        let b = self.buffer.as_mut();
        b[..6].copy_from_slice(&dst);
        b[6..12].copy_from_slice(&src);
        set16(b, 12, ethertype);
    }
}

header_view!(
    /// IPv4 header without options (20 bytes).
    Ipv4Header,
    20
);
impl<T: AsRef<[u8]>> Ipv4Header<T> {
    /// Version (4).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }
    /// Header length in 32-bit words.
    pub fn ihl(&self) -> u8 {
        self.buffer.as_ref()[0] & 0x0f
    }
    /// Type of service byte: DSCP << 2 | ECN.
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Total length.
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// Flags and fragment offset.
    pub fn flags_frag(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[8]
    }
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[9]
    }
    /// Header checksum.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 10)
    }
    /// Source address.
    pub fn src(&self) -> [u8; 4] {
        be32(self.buffer.as_ref(), 12).to_be_bytes()
    }
    /// Destination address.
    pub fn dst(&self) -> [u8; 4] {
        be32(self.buffer.as_ref(), 16).to_be_bytes()
    }
    /// True if the header checksum is correct.
    pub fn verify_checksum(&self) -> bool {
        ipv4_checksum(&self.buffer.as_ref()[..20]) == 0
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Header<T> {
    /// Sets the TOS byte (checksum not updated).
    pub fn set_tos(&mut self, tos: u8) {
        self.buffer.as_mut()[1] = tos;
    }
    /// Recomputes the header checksum.
    pub fn fill_checksum(&mut self) {
        let b = self.buffer.as_mut();
        set16(b, 10, 0);
        let c = ipv4_checksum(&b[..20]);
        set16(b, 10, c);
    }
}

fn ipv4_checksum(h: &[u8]) -> u16 {
    !fold(sum16(h))
}

header_view!(
    /// IPv6 header without extension headers (40 bytes).
    Ipv6Header,
    40
);
impl<T: AsRef<[u8]>> Ipv6Header<T> {
    /// Version (6).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }
    /// Traffic class: DSCP << 2 | ECN.
    pub fn traffic_class(&self) -> u8 {
        let b = self.buffer.as_ref();
        (b[0] << 4) | (b[1] >> 4)
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        be32(self.buffer.as_ref(), 0) & 0x000f_ffff
    }
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[6]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[7]
    }
    /// Source address.
    pub fn src(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[8..24]);
        a
    }
    /// Destination address.
    pub fn dst(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[24..40]);
        a
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Header<T> {
    /// Sets the traffic class.
    pub fn set_traffic_class(&mut self, tc: u8) {
        let b = self.buffer.as_mut();
        b[0] = 0x60 | (tc >> 4);
        b[1] = (tc << 4) | (b[1] & 0x0f);
    }
}

header_view!(
    /// UDP header (8 bytes).
    UdpHeader,
    8
);
impl<T: AsRef<[u8]>> UdpHeader<T> {
    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Length of header plus payload.
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// True if the length field is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Checksum (0 = none; rxe always sends 0).
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
}

/// A received RoCEv2 datagram split into its parts, all validated.
#[derive(Debug, Clone, Copy)]
pub struct IpFrame<'a> {
    ip: &'a [u8],
    udp: &'a [u8],
    roce: &'a [u8],
}

impl<'a> IpFrame<'a> {
    /// Splits an IPv4 or IPv6 datagram (trailing bytes after the IP length, such as Ethernet
    /// padding, are ignored) and validates the RoCE packet's lengths. The UDP port is not
    /// checked: see [`udp`](Self::udp).
    pub fn parse(datagram: &'a [u8]) -> Result<Self> {
        let first = *datagram.first().ok_or(WireError::Truncated)?;
        let (ip_len, end) = match first >> 4 {
            4 => {
                let h = Ipv4Header::new_checked(datagram)?;
                if h.ihl() != 5 {
                    return Err(WireError::Ipv4Options);
                }
                if h.protocol() != 17 {
                    return Err(WireError::NotUdp);
                }
                if h.flags_frag() & 0x3fff != 0 {
                    return Err(WireError::BadLength);
                }
                (20, usize::from(h.total_len()))
            }
            6 => {
                let h = Ipv6Header::new_checked(datagram)?;
                if h.next_header() != 17 {
                    return Err(WireError::NotUdp);
                }
                (40, 40 + usize::from(h.payload_len()))
            }
            v => return Err(WireError::BadIpVersion(v)),
        };
        if end > datagram.len() {
            return Err(WireError::Truncated);
        }
        if end < ip_len + UdpHeader::<&[u8]>::HEADER_LEN {
            return Err(WireError::BadLength);
        }
        let udp = &datagram[ip_len..ip_len + 8];
        if usize::from(UdpHeader::new_unchecked(udp).len()) != end - ip_len {
            return Err(WireError::BadLength);
        }
        let roce = &datagram[ip_len + 8..end];
        RocePacket::new_checked(roce)?;
        Ok(Self {
            ip: &datagram[..ip_len],
            udp,
            roce,
        })
    }

    /// True for IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.ip.len() == 40
    }
    /// The IP header bytes.
    pub fn ip_header(&self) -> &'a [u8] {
        self.ip
    }
    /// The UDP header.
    pub fn udp(&self) -> UdpHeader<&'a [u8]> {
        UdpHeader::new_unchecked(self.udp)
    }
    /// The RoCE packet (BTH through ICRC).
    pub fn roce(&self) -> RocePacket<&'a [u8]> {
        RocePacket::new_unchecked(self.roce)
    }
    /// Source address.
    pub fn src(&self) -> IpAddress {
        if self.is_ipv6() {
            IpAddress::V6(Ipv6Header::new_unchecked(self.ip).src())
        } else {
            IpAddress::V4(Ipv4Header::new_unchecked(self.ip).src())
        }
    }
    /// Destination address.
    pub fn dst(&self) -> IpAddress {
        if self.is_ipv6() {
            IpAddress::V6(Ipv6Header::new_unchecked(self.ip).dst())
        } else {
            IpAddress::V4(Ipv4Header::new_unchecked(self.ip).dst())
        }
    }
    /// The traffic class (IPv4 TOS): DSCP << 2 | ECN.
    pub fn traffic_class(&self) -> u8 {
        if self.is_ipv6() {
            Ipv6Header::new_unchecked(self.ip).traffic_class()
        } else {
            Ipv4Header::new_unchecked(self.ip).tos()
        }
    }
    /// True if the ECN field says congestion experienced (CE, 0b11).
    pub fn ecn_ce(&self) -> bool {
        self.traffic_class() & 3 == 3
    }
    /// The ICRC computed over this datagram.
    pub fn compute_icrc(&self) -> u32 {
        let covered = &self.roce[..self.roce.len() - ICRC_LEN];
        // Lengths were validated in `parse`.
        icrc::compute(self.ip, self.udp, covered).unwrap_or(0)
    }
    /// Checks the ICRC carried by the packet.
    pub fn check_icrc(&self) -> Result<()> {
        let expected = self.compute_icrc();
        let found = self.roce().icrc();
        if found == expected {
            Ok(())
        } else {
            Err(WireError::BadIcrc { found, expected })
        }
    }
}

/// Marks ECN congestion-experienced on an ECN-capable IP datagram, as a switch does (IPv4
/// checksum updated). Returns true if the packet was marked; not-ECT packets are untouched.
pub fn mark_ce(datagram: &mut [u8]) -> bool {
    match datagram.first().map(|b| b >> 4) {
        Some(4) if datagram.len() >= 20 => {
            let mut h = Ipv4Header::new_unchecked(&mut datagram[..20]);
            if h.tos() & 3 == 0 {
                return false;
            }
            let tos = h.tos() | 3;
            h.set_tos(tos);
            h.fill_checksum();
            true
        }
        Some(6) if datagram.len() >= 40 => {
            let mut h = Ipv6Header::new_unchecked(&mut datagram[..40]);
            if h.traffic_class() & 3 == 0 {
                return false;
            }
            let tc = h.traffic_class() | 3;
            h.set_traffic_class(tc);
            true
        }
        _ => false,
    }
}

/// Recomputes the UDP or TCP checksum of an IPv4 or IPv6 datagram in place (a forwarding hop
/// does this for packets captured before checksum offload filled them in). Returns false,
/// leaving the datagram untouched, when it is neither a whole UDP datagram nor a TCP segment.
/// A UDP checksum that computes to 0 is sent as 0xFFFF, as RFC 768 says.
pub fn fill_l4_checksum(datagram: &mut [u8]) -> bool {
    let (ip_len, end, proto, pseudo) = match datagram.first().map(|b| b >> 4) {
        Some(4) if datagram.len() >= 20 => {
            let h = Ipv4Header::new_unchecked(&datagram[..20]);
            if h.ihl() != 5 || h.flags_frag() & 0x3fff != 0 {
                return false;
            }
            let end = usize::from(h.total_len());
            let sum = sum16(&datagram[12..20]) + end.saturating_sub(20) as u32;
            (20, end, h.protocol(), sum)
        }
        Some(6) if datagram.len() >= 40 => {
            let h = Ipv6Header::new_unchecked(&datagram[..40]);
            let len = usize::from(h.payload_len());
            (
                40,
                40 + len,
                h.next_header(),
                sum16(&datagram[8..40]) + len as u32,
            )
        }
        _ => return false,
    };
    let at = match proto {
        17 => 6,
        6 => 16,
        _ => return false,
    };
    if end > datagram.len() || end < ip_len + at + 2 {
        return false;
    }
    let l4 = &mut datagram[ip_len..end];
    if proto == 17 && usize::from(be16(l4, 4)) != l4.len() {
        return false;
    }
    set16(l4, at, 0);
    let c = !fold(pseudo + u32::from(proto) + sum16(l4));
    set16(l4, at, if c == 0 && proto == 17 { 0xffff } else { c });
    true
}

/// Folds a one's-complement sum's carries into 16 bits.
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// One's-complement sum of big-endian 16-bit words (an odd tail byte is padded with zero),
/// not yet folded.
fn sum16(b: &[u8]) -> u32 {
    let mut sum = 0u32;
    let mut it = b.chunks_exact(2);
    for pair in &mut it {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = it.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

/// How to frame a RoCE packet in IP and UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr {
    /// Source address.
    pub src: IpAddress,
    /// Destination address (same family as `src`).
    pub dst: IpAddress,
    /// UDP source port (RoCEv2 uses it for ECMP entropy; rxe picks 0xc000 | hash).
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
    /// Traffic class: DSCP << 2 | ECN (ECT(0) = 0b10).
    pub traffic_class: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv4 identification (unused for IPv6).
    pub ident: u16,
    /// IPv6 flow label (unused for IPv4).
    pub flow_label: u32,
}

impl FrameRepr {
    /// Bytes of IP and UDP header.
    pub const fn header_len(&self) -> usize {
        match self.src {
            IpAddress::V4(_) => 28,
            IpAddress::V6(_) => 48,
        }
    }

    /// Writes IP and UDP headers in front of the `roce_len`-byte RoCE packet that already sits
    /// at `buf[header_len()..]`, then fills its ICRC. Returns the datagram length.
    pub fn emit(&self, buf: &mut [u8], roce_len: usize) -> Result<usize> {
        let hl = self.header_len();
        let total = hl + roce_len;
        if buf.len() < total || roce_len < 12 + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        self.emit_headers(&mut buf[..hl], roce_len)?;
        let (head, roce) = buf[..total].split_at_mut(hl);
        let icrc = icrc::compute(
            &head[..hl - 8],
            &head[hl - 8..],
            &roce[..roce_len - ICRC_LEN],
        )?;
        RocePacket::new_unchecked(roce).set_icrc(icrc);
        Ok(total)
    }

    /// Writes only the IP and UDP headers for a `roce_len`-byte RoCE packet into
    /// `buf[..header_len()]`: what a receiver behind a UDP socket rebuilds to check an ICRC.
    pub fn emit_headers(&self, buf: &mut [u8], roce_len: usize) -> Result<()> {
        let hl = self.header_len();
        if buf.len() < hl {
            return Err(WireError::Truncated);
        }
        let udp_len = u16::try_from(8 + roce_len).map_err(|_| WireError::BadLength)?;
        match (self.src, self.dst) {
            (IpAddress::V4(s), IpAddress::V4(d)) => {
                let b = &mut buf[..20];
                b[0] = 0x45;
                b[1] = self.traffic_class;
                set16(b, 2, udp_len.checked_add(20).ok_or(WireError::BadLength)?);
                set16(b, 4, self.ident);
                set16(b, 6, 0x4000); // DF, as rxe
                b[8] = self.hop_limit;
                b[9] = 17;
                b[12..16].copy_from_slice(&s);
                b[16..20].copy_from_slice(&d);
                Ipv4Header::new_unchecked(b).fill_checksum();
            }
            (IpAddress::V6(s), IpAddress::V6(d)) => {
                let b = &mut buf[..40];
                set32(
                    b,
                    0,
                    (6 << 28)
                        | (u32::from(self.traffic_class) << 20)
                        | (self.flow_label & 0xf_ffff),
                );
                set16(b, 4, udp_len);
                b[6] = 17;
                b[7] = self.hop_limit;
                b[8..24].copy_from_slice(&s);
                b[24..40].copy_from_slice(&d);
            }
            _ => return Err(WireError::BadIpVersion(0)),
        }
        let u = &mut buf[hl - 8..hl];
        set16(u, 0, self.src_port);
        set16(u, 2, self.dst_port);
        set16(u, 4, udp_len);
        set16(u, 6, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BthRepr, ExtHeaders, Opcode, PKey, Psn, Qpn, RoceRepr, packet::pad_for};

    fn frame(src: IpAddress, dst: IpAddress) -> FrameRepr {
        FrameRepr {
            src,
            dst,
            src_port: 0xc123,
            dst_port: 4791,
            traffic_class: 0x02,
            hop_limit: 64,
            ident: 7,
            flow_label: 0x12345,
        }
    }

    fn send_only(buf: &mut [u8], payload: &[u8]) -> usize {
        let repr = RoceRepr {
            bth: BthRepr {
                opcode: Opcode::RC_SEND_ONLY,
                solicited: false,
                migreq: false,
                pad_count: pad_for(payload.len()),
                pkey: PKey::DEFAULT,
                fecn: false,
                becn: false,
                dest_qp: Qpn::new(0x11),
                ack_req: true,
                psn: Psn::new(1),
            },
            ext: ExtHeaders::None,
            payload_len: payload.len(),
        };
        let n = repr.emit(buf).unwrap();
        RocePacket::new_unchecked(&mut buf[..n])
            .payload_mut()
            .copy_from_slice(payload);
        n
    }

    #[test]
    fn build_parse_verify_v4_and_v6() {
        let v4 = frame(IpAddress::V4([10, 0, 0, 1]), IpAddress::V4([10, 0, 0, 2]));
        let v6 = frame(IpAddress::V6([0xfd; 16]), IpAddress::V6([0xfe; 16]));
        for f in [v4, v6] {
            let mut buf = [0u8; 128];
            let hl = f.header_len();
            let n = send_only(&mut buf[hl..], b"abcde");
            let total = f.emit(&mut buf, n).unwrap();
            let parsed = IpFrame::parse(&buf[..total]).unwrap();
            assert_eq!(parsed.src(), f.src);
            assert_eq!(parsed.dst(), f.dst);
            assert_eq!(parsed.udp().dst_port(), 4791);
            assert_eq!(parsed.traffic_class(), 0x02);
            assert_eq!(parsed.roce().payload(), b"abcde");
            parsed.check_icrc().unwrap();
            // A switch marks CE: ICRC still verifies.
            assert!(mark_ce(&mut buf[..total]));
            let marked = IpFrame::parse(&buf[..total]).unwrap();
            assert!(marked.ecn_ce());
            marked.check_icrc().unwrap();
            if !marked.is_ipv6() {
                assert!(Ipv4Header::new_unchecked(marked.ip_header()).verify_checksum());
            }
            // Any flipped payload bit fails the ICRC.
            buf[total - 6] ^= 0x10;
            assert!(matches!(
                IpFrame::parse(&buf[..total]).unwrap().check_icrc(),
                Err(WireError::BadIcrc { .. })
            ));
        }
    }

    #[test]
    fn gid_mapping() {
        let a = IpAddress::V4([192, 168, 1, 10]);
        assert_eq!(a.to_gid()[10..], [0xff, 0xff, 192, 168, 1, 10]);
        assert_eq!(IpAddress::from_gid(a.to_gid()), a);
        let v6 = IpAddress::V6([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(IpAddress::from_gid(v6.to_gid()), v6);
    }

    #[test]
    fn bad_framing() {
        assert_eq!(IpFrame::parse(&[]).unwrap_err(), WireError::Truncated);
        assert_eq!(
            IpFrame::parse(&[0x50; 40]).unwrap_err(),
            WireError::BadIpVersion(5)
        );
        let mut b = [0u8; 60];
        b[0] = 0x46;
        assert_eq!(IpFrame::parse(&b).unwrap_err(), WireError::Ipv4Options);
        b[0] = 0x45;
        b[9] = 6;
        assert_eq!(IpFrame::parse(&b).unwrap_err(), WireError::NotUdp);
    }

    #[test]
    fn udp_checksum_matches_a_known_datagram() {
        // 10.0.0.1:1000 -> 10.0.0.2:2000, payload "abc", checksum worked by hand: pseudo
        // header 0x0a00+0x0001+0x0a00+0x0002+0x0011+0x000b = 0x141f, UDP header
        // 0x03e8+0x07d0+0x000b = 0x0bc3, data 0x6162+0x6300 = 0xc462; total 0xe444, so 0x1bbb.
        let mut d = [
            0x45, 0, 0, 31, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x03, 0xe8,
            0x07, 0xd0, 0, 11, 0xaa, 0xbb, b'a', b'b', b'c',
        ];
        assert!(fill_l4_checksum(&mut d));
        assert_eq!(u16::from_be_bytes([d[26], d[27]]), 0x1bbb);
        // Neither UDP nor TCP, or a length that lies: untouched.
        let mut t = d;
        t[9] = 1;
        assert!(!fill_l4_checksum(&mut t));
        let mut short = d;
        short[25] = 40;
        assert!(!fill_l4_checksum(&mut short));
        assert_eq!(short[26..28], d[26..28]);
    }

    #[test]
    fn tcp_checksum_matches_a_known_segment() {
        // 10.0.0.1:1000 -> 10.0.0.2:2000, a bare 20-byte SYN (seq 1, window 0x100), worked
        // by hand: pseudo header 0x0a00+0x0001+0x0a00+0x0002+0x0006+0x0014 = 0x141d, TCP
        // header 0x03e8+0x07d0+0x0001+0x5002+0x0100 = 0x5cbb; total 0x70d8, so 0x8f27.
        let mut d = [
            0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x03, 0xe8, 0x07,
            0xd0, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0x01, 0, 0x12, 0x34, 0, 0,
        ];
        assert!(fill_l4_checksum(&mut d));
        assert_eq!(u16::from_be_bytes([d[36], d[37]]), 0x8f27);
    }

    #[test]
    fn udp_checksum_of_emitted_frames_verifies() {
        for (s, d) in [
            (IpAddress::V4([10, 1, 2, 3]), IpAddress::V4([10, 1, 2, 4])),
            (IpAddress::V6([0xfe; 16]), IpAddress::V6([0x20; 16])),
        ] {
            for payload in [0usize, 1, 7, 1024] {
                let f = frame(s, d);
                let mut buf = vec![0u8; 2048];
                let hl = f.header_len();
                let data = vec![0x5a; payload];
                let r = send_only(&mut buf[hl..], &data);
                let n = f.emit(&mut buf, r).unwrap();
                assert!(fill_l4_checksum(&mut buf[..n]));
                // Summing everything covered, the checksum included, gives all ones.
                let ip = &buf[..hl - 8];
                let pseudo = if ip[0] >> 4 == 4 {
                    sum16(&ip[12..20]) + 17 + (n - 20) as u32
                } else {
                    sum16(&ip[8..40]) + 17 + (n - 40) as u32
                };
                let sum = fold(pseudo + sum16(&buf[hl - 8..n]));
                assert_eq!(sum, 0xffff, "{s:?} payload {payload}");
            }
        }
    }
}
