//! Every RoCEv2 packet of a real rxe capture (ibv_rc_pingpong between two Soft-RoCE hosts,
//! 1000 packets) must parse, re-emit byte-identical and verify its ICRC.

use monel_wire::frame::{FrameRepr, IpFrame, Ipv4Header};
use monel_wire::pcap::PcapReader;
use monel_wire::{ROCE_V2_UDP_PORT, RocePacket, RoceRepr};

const CAPTURE: &[u8] = include_bytes!("data/rxe-pingpong.pcap");

#[test]
fn every_rxe_packet_parses_reemits_and_verifies() {
    let reader = PcapReader::new(CAPTURE).unwrap();
    let mut roce = 0;
    let mut opcodes = std::collections::BTreeMap::new();
    for (i, rec) in reader.clone().enumerate() {
        let rec = rec.unwrap();
        let Ok(ip) = reader.ip_payload(&rec) else {
            continue;
        };
        let Ok(frame) = IpFrame::parse(ip) else {
            continue;
        };
        if frame.udp().dst_port() != ROCE_V2_UDP_PORT {
            continue;
        }
        roce += 1;
        frame
            .check_icrc()
            .unwrap_or_else(|e| panic!("record {i}: {e}"));
        let pkt = frame.roce();
        let repr = RoceRepr::parse(&pkt).unwrap_or_else(|e| panic!("record {i}: {e}"));
        *opcodes.entry(repr.bth.opcode.name()).or_insert(0) += 1;

        // Re-emit from the representations only.
        let v4 = Ipv4Header::new_unchecked(frame.ip_header());
        let framing = FrameRepr {
            src: frame.src(),
            dst: frame.dst(),
            src_port: frame.udp().src_port(),
            dst_port: frame.udp().dst_port(),
            traffic_class: frame.traffic_class(),
            hop_limit: v4.ttl(),
            ident: v4.ident(),
            flow_label: 0,
        };
        let mut out = vec![0u8; ip.len() + 64];
        let hl = framing.header_len();
        let n = repr.emit(&mut out[hl..]).unwrap();
        RocePacket::new_unchecked(&mut out[hl..hl + n])
            .payload_mut()
            .copy_from_slice(pkt.payload());
        let total = framing.emit(&mut out, n).unwrap();
        let original = &ip[..usize::from(v4.total_len())];
        assert_eq!(
            &out[..total],
            original,
            "record {i} ({}) differs",
            repr.bth.opcode
        );
    }
    assert_eq!(roce, 1000, "the capture holds 1000 RoCEv2 packets");
    // ibv_rc_pingpong at MTU 1024 with 4 KiB messages: FIRST, 2 x MIDDLE, LAST, and ACKs.
    assert_eq!(opcodes.get("RC_SEND_FIRST"), Some(&200));
    assert_eq!(opcodes.get("RC_SEND_MIDDLE"), Some(&400));
    assert_eq!(opcodes.get("RC_SEND_LAST"), Some(&200));
    assert_eq!(opcodes.get("RC_ACKNOWLEDGE"), Some(&200));
}

#[test]
fn corrupting_any_covered_byte_breaks_the_icrc() {
    let reader = PcapReader::new(CAPTURE).unwrap();
    let rec = reader
        .clone()
        .filter_map(Result::ok)
        .find(|r| {
            reader
                .ip_payload(r)
                .ok()
                .and_then(|ip| IpFrame::parse(ip).ok())
                .is_some()
        })
        .unwrap();
    let ip = reader.ip_payload(&rec).unwrap().to_vec();
    let len = usize::from(Ipv4Header::new_unchecked(&ip[..20]).total_len());
    // Bytes the ICRC covers: IP addresses/lengths/ID/protocol, UDP ports/length, BTH (but byte
    // 4), ext headers and payload. Flip one bit in each and expect a mismatch or a parse error.
    let masked = [1usize, 8, 10, 11, 26, 27, 28 + 4];
    for at in 0..len - 4 {
        if masked.contains(&at) {
            continue;
        }
        let mut bad = ip.clone();
        bad[at] ^= 0x01;
        if let Ok(f) = IpFrame::parse(&bad[..len]) {
            assert!(f.check_icrc().is_err(), "flip at byte {at} went unnoticed");
        }
    }
}
