//! The two OCP 8-bit float formats NCCL reduces (`ncclFloat8e4m3`, `ncclFloat8e5m2`):
//! decoding through a table, encoding by rounding to the nearest value (ties to the even
//! code), saturating at the largest finite value as CUDA's `__NV_SATFINITE` conversions do.

/// One of the formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8 {
    /// 4 exponent bits (bias 7), 3 mantissa bits; no infinities, NaN = S.1111.111.
    E4M3,
    /// 5 exponent bits (bias 15), 2 mantissa bits; infinities and NaNs as IEEE.
    E5M2,
}

impl Fp8 {
    const fn shape(self) -> (u32, i32) {
        match self {
            Self::E4M3 => (3, 7),
            Self::E5M2 => (2, 15),
        }
    }

    /// The largest finite code (positive).
    const fn max_code(self) -> u8 {
        match self {
            Self::E4M3 => 0x7e,
            Self::E5M2 => 0x7b,
        }
    }

    /// The value of `code` (a table lookup).
    pub fn to_f32(self, code: u8) -> f32 {
        static TABLES: std::sync::OnceLock<[[f32; 256]; 2]> = std::sync::OnceLock::new();
        let t = TABLES.get_or_init(|| {
            let mut t = [[0f32; 256]; 2];
            for c in 0..=255u8 {
                t[0][usize::from(c)] = Self::E4M3.decode(c);
                t[1][usize::from(c)] = Self::E5M2.decode(c);
            }
            t
        });
        t[self as usize][usize::from(code)]
    }

    fn decode(self, code: u8) -> f32 {
        let (mbits, bias) = self.shape();
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let mag = code & 0x7f;
        let e = i32::from(mag >> mbits);
        let m = f32::from(mag & ((1 << mbits) - 1) as u8);
        let scale = (1u32 << mbits) as f32;
        let emax = (1 << (7 - mbits)) - 1;
        match self {
            Self::E4M3 if mag == 0x7f => return f32::NAN,
            Self::E5M2 if e == emax => {
                return if m == 0.0 {
                    sign * f32::INFINITY
                } else {
                    f32::NAN
                };
            }
            _ => {}
        }
        if e == 0 {
            sign * m / scale * 2f32.powi(1 - bias)
        } else {
            sign * (1.0 + m / scale) * 2f32.powi(e - bias)
        }
    }

    /// The nearest code to `x` (ties to even), saturating at the largest finite value.
    pub fn from_f32(self, x: f32) -> u8 {
        if x.is_nan() {
            return 0x7f;
        }
        let (mbits, bias) = self.shape();
        let bits = x.to_bits();
        let sign = ((bits >> 31) as u8) << 7;
        let a = x.abs();
        let max = self.max_code();
        if a >= self.to_f32(max) {
            return sign | max;
        }
        let e = ((bits >> 23) & 0xff) as i32 - 127;
        let code = if e < 1 - bias {
            // Below the smallest normal: a multiple of the subnormal step, rounded.
            let steps = a * 2f32.powi(bias - 1 + mbits as i32);
            steps.round_ties_even() as u32
        } else {
            let shift = 23 - mbits;
            let mant = bits & 0x7f_ffff;
            let mut c = (((e + bias) as u32) << mbits) | (mant >> shift);
            let rem = mant & ((1 << shift) - 1);
            let half = 1 << (shift - 1);
            if rem > half || (rem == half && c & 1 == 1) {
                c += 1; // a carry out of the mantissa is the next exponent, as it should be
            }
            c
        };
        sign | (code.min(u32::from(max)) as u8)
    }

    /// [`Self::from_f32`] by search over the codes: the reference the tests hold it to.
    pub fn from_f32_by_search(self, x: f32) -> u8 {
        if x.is_nan() {
            return 0x7f;
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        let max = self.max_code();
        if a >= self.to_f32(max) {
            return sign | max;
        }
        // Positive codes 0..=max increase with their values: find the pair around `a`.
        let (mut lo, mut hi) = (0u8, max);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.to_f32(mid) <= a {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (vl, vh) = (self.to_f32(lo), self.to_f32(hi));
        let code = if a - vl < vh - a || (a - vl == vh - a && lo % 2 == 0) {
            lo
        } else {
            hi
        };
        sign | code
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        for (f, code, v) in [
            (Fp8::E4M3, 0x38, 1.0),
            (Fp8::E4M3, 0x7e, 448.0),
            (Fp8::E4M3, 0x01, 2f32.powi(-9)),
            (Fp8::E4M3, 0xc0, -2.0),
            (Fp8::E5M2, 0x3c, 1.0),
            (Fp8::E5M2, 0x7b, 57344.0),
            (Fp8::E5M2, 0x01, 2f32.powi(-16)),
        ] {
            assert_eq!(f.to_f32(code), v, "{f:?} {code:#x}");
            assert_eq!(f.from_f32(v), code, "{f:?} {v}");
        }
        // Infinity decodes, and saturates on the way back.
        assert_eq!(Fp8::E5M2.to_f32(0x7c), f32::INFINITY);
        assert_eq!(Fp8::E5M2.from_f32(f32::INFINITY), 0x7b);
        assert_eq!(Fp8::E4M3.from_f32(f32::NEG_INFINITY), 0xfe);
        assert!(Fp8::E4M3.to_f32(0x7f).is_nan());
        assert!(Fp8::E5M2.to_f32(0x7e).is_nan());
    }

    #[test]
    fn every_code_round_trips_and_rounding_is_to_nearest_even() {
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for c in 0..=255u8 {
                let v = f.to_f32(c);
                if v.is_finite() {
                    // -0 and +0 are both zero; every other value comes back to its code.
                    let back = f.from_f32(v);
                    assert!(back == c || v == 0.0, "{f:?} {c:#x} -> {v} -> {back:#x}");
                }
            }
            // Halfway between 1.0 and the next value rounds to 1.0 (even mantissa).
            let next = f.to_f32(f.from_f32(1.0) + 1);
            assert_eq!(f.from_f32((1.0 + next) / 2.0), f.from_f32(1.0));
            assert_eq!(f.from_f32(1e9), f.max_code());
            assert_eq!(f.from_f32(-1e9), 0x80 | f.max_code());
        }
    }

    #[test]
    fn fast_encoding_agrees_with_search() {
        // Every code's value, the midpoints between neighbours, and a spread of f32 bits.
        let mut xs: Vec<f32> = Vec::new();
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for c in 0..0x7fu8 {
                let (a, b) = (f.to_f32(c), f.to_f32(c + 1));
                if a.is_finite() && b.is_finite() {
                    xs.extend([a, b, (a + b) / 2.0, a + (b - a) / 3.0, -(a + b) / 2.0]);
                }
            }
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            xs.push(f32::from_bits(x));
        }
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for &v in &xs {
                if v.is_nan() {
                    continue;
                }
                assert_eq!(f.from_f32(v), f.from_f32_by_search(v), "{f:?} {v:e}");
            }
        }
    }
}
