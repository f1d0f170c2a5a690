//! Big-endian field access on byte slices. Callers check lengths first (the views' contract).

pub(crate) type Field = core::ops::Range<usize>;

#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
#[inline]
pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}
#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
#[inline]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}
#[inline]
pub(crate) fn set16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn set24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
#[inline]
pub(crate) fn set32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn set64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Defines a zero-copy header view with the smoltcp constructor set.
macro_rules! header_view {
    ($(#[$m:meta])* $name:ident, $len:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }
        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of the header in bytes.
            pub const HEADER_LEN: usize = $len;
            /// Wraps a buffer without checking its length (for emitting into sized buffers).
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }
            /// Wraps a buffer after checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }
            /// Checks that the buffer holds the whole header.
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::WireError::Truncated)
                } else {
                    Ok(())
                }
            }
            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
pub(crate) use header_view;
