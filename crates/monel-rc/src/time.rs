//! The engine's own notion of time: nanoseconds on a clock the caller owns. The engine never
//! reads a clock; every input carries `now`.

use core::ops::{Add, AddAssign};
use core::time::Duration;

/// A point in time, in nanoseconds since an epoch of the caller's choosing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Self = Self(0);
    /// From nanoseconds since the epoch.
    pub const fn from_nanos(ns: u64) -> Self {
        Self(ns)
    }
    /// From microseconds since the epoch.
    pub const fn from_micros(us: u64) -> Self {
        Self(us * 1000)
    }
    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Self;
    fn add(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}
impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

/// The earlier of two optional deadlines (`None`: no deadline).
pub fn earliest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The local ACK timeout of a QP attribute value: 4.096 us x 2^timeout; 0 means infinite.
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    (timeout != 0).then(|| Duration::from_nanos(4096u64 << timeout.min(31)))
}

/// The delay an RNR NAK timer code asks for (IBA table 45; rxe `rnrnak_usec`).
pub fn rnr_delay(code: u8) -> Duration {
    // In units of 10 us; code 0 (655.36 ms) is handled apart.
    const TENS_OF_MICROS: [u32; 32] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    let v = TENS_OF_MICROS[usize::from(code & 0x1f)];
    if code & 0x1f == 0 {
        Duration::from_micros(655_360)
    } else {
        Duration::from_micros(u64::from(v) * 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_as_ib_spec() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(67_108_864)));
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(1), Duration::from_micros(10));
        assert_eq!(rnr_delay(12), Duration::from_micros(640));
        assert_eq!(rnr_delay(31), Duration::from_micros(491_520));
        assert_eq!(
            Instant::from_micros(3) + Duration::from_nanos(5),
            Instant::from_nanos(3005)
        );
    }
}
