//! Newtypes for the numbers that have meaning on the wire.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// Packet sequence number: 24 bits, compared and advanced modulo 2^24.
///
/// `a.after(b)` holds when `a` is up to 2^23 - 1 steps ahead of `b`, as rxe's
/// `psn_compare(a, b) = (s32)((a - b) << 8)`. There is deliberately no `Ord`: the order is
/// only meaningful within half the sequence space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 PSN bits.
    pub const MASK: u32 = 0x00ff_ffff;

    /// Takes the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Self(v & Self::MASK)
    }
    /// The raw 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
    /// Signed distance `self - other` in `-2^23 ..= 2^23 - 1`.
    pub const fn diff(self, other: Self) -> i32 {
        (self.0.wrapping_sub(other.0) << 8) as i32 >> 8
    }
    /// True if `self` comes strictly after `other`.
    pub const fn after(self, other: Self) -> bool {
        self.diff(other) > 0
    }
    /// True if `self` comes strictly before `other`.
    pub const fn before(self, other: Self) -> bool {
        self.diff(other) < 0
    }
    /// The next PSN.
    pub const fn next(self) -> Self {
        Self::new(self.0.wrapping_add(1))
    }
}

impl Add<u32> for Psn {
    type Output = Self;
    fn add(self, rhs: u32) -> Self {
        Self::new(self.0.wrapping_add(rhs))
    }
}
impl AddAssign<u32> for Psn {
    fn add_assign(&mut self, rhs: u32) {
        *self = *self + rhs;
    }
}
impl Sub<u32> for Psn {
    type Output = Self;
    fn sub(self, rhs: u32) -> Self {
        Self::new(self.0.wrapping_sub(rhs))
    }
}
impl Sub for Psn {
    type Output = i32;
    fn sub(self, rhs: Self) -> i32 {
        self.diff(rhs)
    }
}
impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}
impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Message sequence number carried in the AETH: 24 bits, modulo 2^24.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct Msn(u32);

impl Msn {
    /// Takes the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Self(v & 0x00ff_ffff)
    }
    /// The raw 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
    /// The next MSN (wraps at 2^24).
    pub const fn next(self) -> Self {
        Self::new(self.0.wrapping_add(1))
    }
}

/// Queue pair number: 24 bits. 0 is SMI (not on RoCE), 1 is GSI, 0xffffff is multicast.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Qpn(u32);

impl Qpn {
    /// The general services interface QP.
    pub const GSI: Self = Self(1);
    /// The multicast destination QPN.
    pub const MULTICAST: Self = Self(0x00ff_ffff);
    /// Takes the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Self(v & 0x00ff_ffff)
    }
    /// The raw 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
}
impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}
impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

macro_rules! key_type {
    ($(#[$m:meta])* $name:ident($ty:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        pub struct $name(pub $ty);
        impl $name {
            /// The raw value.
            pub const fn value(self) -> $ty {
                self.0
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

key_type!(
    /// Partition key. The low 15 bits name the partition, bit 15 marks full membership.
    PKey(u16)
);
key_type!(
    /// Remote key: names a memory region (or window) for access by a peer.
    RKey(u32)
);
key_type!(
    /// Local key: names a memory region for the local scatter/gather lists.
    LKey(u32)
);
key_type!(
    /// Queue key of an unreliable-datagram QP.
    QKey(u32)
);

impl PKey {
    /// The default full-membership partition key that rxe sends.
    pub const DEFAULT: Self = Self(0xffff);
    /// True if two keys admit each other: same partition, at least one full member
    /// (rxe's `pkey_match`).
    pub const fn matches(self, other: Self) -> bool {
        (self.0 & 0x7fff) != 0
            && (self.0 & 0x7fff) == (other.0 & 0x7fff)
            && ((self.0 & 0x8000) != 0 || (other.0 & 0x8000) != 0)
    }
}

impl QKey {
    /// The well-known Q_Key of the GSI QP.
    pub const GSI: Self = Self(0x8001_0000);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn psn_wraps() {
        let top = Psn::new(0xff_ffff);
        assert_eq!(top.next(), Psn::new(0));
        assert!(Psn::new(0).after(top));
        assert!(top.before(Psn::new(5)));
        assert_eq!(Psn::new(3) - top, 4);
        assert_eq!(top + 10, Psn::new(9));
        assert_eq!(Psn::new(2) - 5u32, Psn::new(0xff_fffd));
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
    }

    #[test]
    fn pkey_match_as_rxe() {
        assert!(PKey(0xffff).matches(PKey(0x7fff)));
        assert!(!PKey(0x7fff).matches(PKey(0x7fff)));
        assert!(!PKey(0xffff).matches(PKey(0x8001)));
        assert!(!PKey(0x8000).matches(PKey(0x8000)));
    }

    proptest! {
        #[test]
        fn psn_add_then_diff(a in 0u32..0x100_0000, n in 0u32..0x80_0000) {
            let p = Psn::new(a);
            prop_assert_eq!((p + n).diff(p), n as i32);
            prop_assert_eq!(p.diff(p + n), -(n as i32));
            prop_assert_eq!((p + n) - n, p);
            prop_assert!(n == 0 || (p + n).after(p));
        }
    }
}
