//! The transfer engine's messages (segment tables, notifications, withdrawals) and its TCP
//! frames on arbitrary bytes: typed errors, never a panic, and what parses encodes back to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    monel_xfer::wire::fuzz_decode(data);
    monel_xfer::stream::fuzz_decode(data);
});
