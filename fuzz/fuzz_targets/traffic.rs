//! The fabric planner's traffic files (Monel's CSV, htsim's connection matrices, spine pins)
//! on arbitrary text: typed errors, never a panic, whatever the counts and indices claim.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = monel_fabric::parse_csv(&text);
    let _ = monel_fabric::parse_cm(&text);
    let _ = monel_fabric::parse_pins(&text);
});
