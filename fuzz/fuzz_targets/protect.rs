//! Protected RoCE packets (tag, sequence number, encryption) on arbitrary bytes: a forged or
//! replayed verdict, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    monel_verbs::protect::fuzz_open(data);
});
