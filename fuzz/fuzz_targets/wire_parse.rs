//! Arbitrary bytes through every parser: no panic, and whatever parses re-emits identically.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monel_wire::pcap::PcapReader;
use monel_wire::{ExtLayout, IpFrame, RocePacket, RoceRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = RocePacket::new_checked(data) {
        let _ = format!("{p}");
        if let Ok(repr) = RoceRepr::parse(&p) {
            let mut out = vec![0u8; repr.buffer_len()];
            let n = repr.emit(&mut out).expect("a parsed repr emits");
            assert_eq!(n, data.len());
            // Headers re-emit byte for byte, except reserved bits and bytes, which emit as 0.
            let h = repr.header_len();
            let mut expect = data[..h].to_vec();
            expect[4] &= 0xc0;
            expect[8] &= 0x80;
            match repr.ext.layout() {
                ExtLayout::Cnp => expect[12..28].fill(0),
                ExtLayout::Deth | ExtLayout::DethImm => expect[16] = 0,
                _ => {}
            }
            assert_eq!(&out[..h], &expect[..], "headers re-emit byte for byte");
        }
    }
    if let Ok(f) = IpFrame::parse(data) {
        let _ = f.check_icrc();
        let _ = format!("{} {} {}", f.src(), f.dst(), f.roce());
    }
    if let Ok(r) = PcapReader::new(data) {
        for rec in r.clone().flatten() {
            let _ = r.ip_payload(&rec);
        }
    }
});
