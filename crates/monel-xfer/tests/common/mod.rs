//! What the transfer engine's tests share.
#![allow(dead_code)]

use monel_xfer::{Desc, Op};

/// `len` bytes of a pattern that differs with `seed`.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// A descriptor: `op` of `len` bytes between `local` at `lo` and `remote` at `ro`.
pub(crate) fn desc<'a>(
    op: Op,
    local: &'a str,
    lo: u64,
    remote: &'a str,
    ro: u64,
    len: u64,
) -> Desc<'a> {
    Desc {
        op,
        local,
        local_offset: lo,
        remote,
        remote_offset: ro,
        len,
    }
}
