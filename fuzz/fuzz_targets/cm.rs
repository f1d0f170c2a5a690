//! The connection manager's messages on arbitrary bytes: typed errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    monel_verbs::cm::fuzz_messages(data);
});
