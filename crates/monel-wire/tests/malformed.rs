//! Malformed input of any kind gives a typed error, never a panic; representations round-trip.

use monel_wire::frame::{FrameRepr, IpAddress, IpFrame};
use monel_wire::packet::pad_for;
use monel_wire::pcap::PcapReader;
use monel_wire::{
    AethRepr, AethSyndrome, AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, Msn, Opcode, PKey, Psn,
    QKey, Qpn, RKey, RethRepr, RocePacket, RoceRepr,
};
use proptest::prelude::*;

fn ext_for(op: Opcode, a: u64, b: u64, k: u32) -> Option<ExtHeaders> {
    use monel_wire::ExtLayout as L;
    let reth = RethRepr {
        va: a,
        rkey: RKey(k),
        dma_len: b as u32,
    };
    let aeth = AethRepr {
        syndrome: AethSyndrome::from_byte(k as u8 & 0x7f),
        msn: Msn::new(k),
    };
    let deth = DethRepr {
        qkey: QKey(k),
        src_qp: Qpn::new(b as u32),
    };
    Some(match op.layout()? {
        L::None => ExtHeaders::None,
        L::Reth => ExtHeaders::Reth(reth),
        L::RethImm => ExtHeaders::RethImm(reth, k),
        L::Imm => ExtHeaders::Imm(k),
        L::Ieth => ExtHeaders::Ieth(RKey(k)),
        L::Aeth => ExtHeaders::Aeth(aeth),
        L::AethAtomicAck => ExtHeaders::AethAtomicAck(aeth, a),
        L::AtomicEth => ExtHeaders::AtomicEth(AtomicEthRepr {
            va: a,
            rkey: RKey(k),
            swap_add: b,
            compare: !a,
        }),
        L::Deth => ExtHeaders::Deth(deth),
        L::DethImm => ExtHeaders::DethImm(deth, k),
        L::Cnp => ExtHeaders::Cnp,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = RocePacket::new_checked(&bytes[..]) {
            let _ = RoceRepr::parse(&p);
            let _ = format!("{p}");
            let _ = (p.payload(), p.pad(), p.icrc(), p.imm(), p.ieth(), p.reth(), p.aeth());
        }
        if let Ok(f) = IpFrame::parse(&bytes) {
            let _ = f.check_icrc();
            let _ = (f.src(), f.dst(), f.ecn_ce(), format!("{}", f.roce()));
        }
        if let Ok(r) = PcapReader::new(&bytes) {
            for rec in r.clone().flatten() {
                let _ = r.ip_payload(&rec);
            }
        }
    }

    #[test]
    fn mutated_valid_frames_never_panic(at in 0usize..120, bit in 0u8..8, cut in 0usize..120) {
        let mut buf = vec![0u8; 256];
        let repr = RoceRepr {
            bth: BthRepr { opcode: Opcode::RC_WRITE_ONLY_IMM, solicited: true, migreq: false,
                pad_count: pad_for(33), pkey: PKey::DEFAULT, fecn: false, becn: false,
                dest_qp: Qpn::new(9), ack_req: true, psn: Psn::new(3) },
            ext: ExtHeaders::RethImm(RethRepr { va: 1, rkey: RKey(2), dma_len: 33 }, 4),
            payload_len: 33,
        };
        let f = FrameRepr { src: IpAddress::V4([10,0,0,1]), dst: IpAddress::V4([10,0,0,2]),
            src_port: 1, dst_port: 4791, traffic_class: 2, hop_limit: 64, ident: 0, flow_label: 0 };
        let n = repr.emit(&mut buf[28..]).unwrap();
        let total = f.emit(&mut buf, n).unwrap();
        buf.truncate(total);
        let i = at % total;
        buf[i] ^= 1 << bit;
        let end = total - cut.min(total);
        if let Ok(fr) = IpFrame::parse(&buf[..end]) {
            // A single flipped bit outside the masked fields must never verify.
            let masked = [1usize, 8, 10, 11, 26, 27, 32];
            if end == total && !masked.contains(&i) {
                prop_assert!(fr.check_icrc().is_err());
            }
            let _ = RoceRepr::parse(&fr.roce());
        }
    }

    #[test]
    fn repr_roundtrip(op in any::<u8>(), psn in any::<u32>(), qp in any::<u32>(), a in any::<u64>(),
                      b in any::<u64>(), k in any::<u32>(), len in 0usize..64, flags in any::<u8>()) {
        let op = Opcode(op);
        let Some(ext) = ext_for(op, a, b, k) else { return Ok(()) };
        let len = if op.has_payload() { len } else { 0 };
        let repr = RoceRepr {
            bth: BthRepr { opcode: op, solicited: flags & 1 != 0, migreq: flags & 2 != 0,
                pad_count: pad_for(len), pkey: PKey(k as u16), fecn: flags & 4 != 0,
                becn: flags & 8 != 0, dest_qp: Qpn::new(qp), ack_req: flags & 16 != 0,
                psn: Psn::new(psn) },
            ext,
            payload_len: len,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        prop_assert_eq!(repr.emit(&mut buf), Ok(buf.len()));
        let p = RocePacket::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(RoceRepr::parse(&p), Ok(repr));
    }
}
