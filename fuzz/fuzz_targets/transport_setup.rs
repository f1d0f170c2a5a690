//! monel-ccl's transport_setup parsers on arbitrary bytes: typed errors, never a panic, an abort or
//! an allocation a claimed count or length asks for.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    monel_ccl::fuzzing::transport_setup(data);
});
