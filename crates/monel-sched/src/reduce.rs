//! Reduction kernels on little-endian byte buffers: `dst = dst op src`, elementwise.
//!
//! Written as straight loops over fixed-size chunks so the compiler vectorises them; f16 and
//! bf16 are widened to f32, reduced and rounded once per call. Integers wrap on overflow.
//! Min and max of a NaN are unspecified (as in NCCL).

use half::{bf16, f16};

use crate::dtype::{DataType, RedOp};
use crate::fp8::Fp8;

/// `dst[i] = dst[i] op src[i]` over fixed-size little-endian elements.
macro_rules! kernel2 {
    (($dst:expr, $src:expr), $t:ty, $n:literal, |$a:ident, $b:ident| $e:expr) => {
        for (d, s) in $dst.chunks_exact_mut($n).zip($src.chunks_exact($n)) {
            let $a = <$t>::from_le_bytes(d.try_into().expect("chunk"));
            let $b = <$t>::from_le_bytes(s.try_into().expect("chunk"));
            d.copy_from_slice(&($e).to_le_bytes());
        }
    };
}

/// `out[i] = x[i] op y[i]`.
macro_rules! kernel3 {
    (($out:expr, $x:expr, $y:expr), $t:ty, $n:literal, |$a:ident, $b:ident| $e:expr) => {
        for ((d, x), y) in $out
            .chunks_exact_mut($n)
            .zip($x.chunks_exact($n))
            .zip($y.chunks_exact($n))
        {
            let $a = <$t>::from_le_bytes(x.try_into().expect("chunk"));
            let $b = <$t>::from_le_bytes(y.try_into().expect("chunk"));
            d.copy_from_slice(&($e).to_le_bytes());
        }
    };
}

/// Every type and operation through kernel `$k` over the buffers `$bufs`.
macro_rules! dispatch {
    ($k:ident, $bufs:tt, $dtype:expr, $op:expr) => {{
        macro_rules! int_ops {
            ($t:ty, $n:literal) => {
                match $op {
                    RedOp::Sum | RedOp::Avg => $k!($bufs, $t, $n, |a, b| a.wrapping_add(b)),
                    RedOp::Prod => $k!($bufs, $t, $n, |a, b| a.wrapping_mul(b)),
                    RedOp::Min => $k!($bufs, $t, $n, |a, b| a.min(b)),
                    RedOp::Max => $k!($bufs, $t, $n, |a, b| a.max(b)),
                }
            };
        }
        macro_rules! float_ops {
            ($t:ty, $n:literal) => {
                match $op {
                    RedOp::Sum | RedOp::Avg => $k!($bufs, $t, $n, |a, b| a + b),
                    RedOp::Prod => $k!($bufs, $t, $n, |a, b| a * b),
                    RedOp::Min => $k!($bufs, $t, $n, |a, b| if b < a { b } else { a }),
                    RedOp::Max => $k!($bufs, $t, $n, |a, b| if b > a { b } else { a }),
                }
            };
        }
        let op = $op;
        match $dtype {
            DataType::I8 => int_ops!(i8, 1),
            DataType::U8 => int_ops!(u8, 1),
            DataType::I32 => int_ops!(i32, 4),
            DataType::U32 => int_ops!(u32, 4),
            DataType::I64 => int_ops!(i64, 8),
            DataType::U64 => int_ops!(u64, 8),
            DataType::F32 => float_ops!(f32, 4),
            DataType::F64 => float_ops!(f64, 8),
            DataType::F16 => $k!($bufs, u16, 2, |a, b| f16::from_f32(widened(
                f16::from_bits(a).to_f32(),
                f16::from_bits(b).to_f32(),
                op
            ))
            .to_bits()),
            DataType::Bf16 => $k!($bufs, u16, 2, |a, b| bf16::from_f32(widened(
                bf16::from_bits(a).to_f32(),
                bf16::from_bits(b).to_f32(),
                op
            ))
            .to_bits()),
            DataType::F8E4M3 => $k!($bufs, u8, 1, |a, b| {
                let f = Fp8::E4M3;
                f.from_f32(widened(f.to_f32(a), f.to_f32(b), op))
            }),
            DataType::F8E5M2 => $k!($bufs, u8, 1, |a, b| {
                let f = Fp8::E5M2;
                f.from_f32(widened(f.to_f32(a), f.to_f32(b), op))
            }),
        }
    }};
}

fn widened(a: f32, b: f32, op: RedOp) -> f32 {
    match op {
        RedOp::Sum | RedOp::Avg => a + b,
        RedOp::Prod => a * b,
        RedOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        RedOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

/// `dst[i] = dst[i] op src[i]` for every element. Both slices hold whole elements of `dtype`
/// and have the same length (the caller checks; extra bytes are ignored).
pub fn reduce_into(dst: &mut [u8], src: &[u8], dtype: DataType, op: RedOp) {
    debug_assert_eq!(dst.len(), src.len());
    dispatch!(kernel2, (dst, src), dtype, op)
}

/// `out[i] = x[i] op y[i]`: one pass where a copy and [`reduce_into`] would take two.
pub fn reduce_to(out: &mut [u8], x: &[u8], y: &[u8], dtype: DataType, op: RedOp) {
    debug_assert!(out.len() == x.len() && x.len() == y.len());
    dispatch!(kernel3, (out, x, y), dtype, op)
}

/// Divides every element by `n` (the last step of [`RedOp::Avg`]): floats exactly as `x / n`
/// (f16/bf16 through f32), integers by truncating division.
pub fn divide(buf: &mut [u8], dtype: DataType, n: usize) {
    macro_rules! div {
        ($t:ty, $sz:literal, $conv:expr) => {
            for d in buf.chunks_exact_mut($sz) {
                let a = <$t>::from_le_bytes(d.try_into().expect("chunk"));
                let n: $t = $conv;
                d.copy_from_slice(&(a / n).to_le_bytes());
            }
        };
    }
    match dtype {
        DataType::I8 => div!(i8, 1, n as i8),
        DataType::U8 => div!(u8, 1, n as u8),
        DataType::I32 => div!(i32, 4, n as i32),
        DataType::U32 => div!(u32, 4, n as u32),
        DataType::I64 => div!(i64, 8, n as i64),
        DataType::U64 => div!(u64, 8, n as u64),
        DataType::F32 => div!(f32, 4, n as f32),
        DataType::F64 => div!(f64, 8, n as f64),
        DataType::F16 => {
            for d in buf.chunks_exact_mut(2) {
                let a = f16::from_bits(u16::from_le_bytes([d[0], d[1]])).to_f32();
                d.copy_from_slice(&f16::from_f32(a / n as f32).to_bits().to_le_bytes());
            }
        }
        DataType::Bf16 => {
            for d in buf.chunks_exact_mut(2) {
                let a = bf16::from_bits(u16::from_le_bytes([d[0], d[1]])).to_f32();
                d.copy_from_slice(&bf16::from_f32(a / n as f32).to_bits().to_le_bytes());
            }
        }
        DataType::F8E4M3 | DataType::F8E5M2 => {
            let f = if dtype == DataType::F8E4M3 {
                Fp8::E4M3
            } else {
                Fp8::E5M2
            };
            for d in buf.iter_mut() {
                *d = f.from_f32(f.to_f32(*d) / n as f32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn float_ops_and_avg() {
        let mut a = f32s(&[1.0, -2.0, 3.5]);
        reduce_into(&mut a, &f32s(&[2.0, 5.0, -1.0]), DataType::F32, RedOp::Sum);
        assert_eq!(a, f32s(&[3.0, 3.0, 2.5]));
        reduce_into(&mut a, &f32s(&[2.0, 0.5, 4.0]), DataType::F32, RedOp::Max);
        assert_eq!(a, f32s(&[3.0, 3.0, 4.0]));
        reduce_into(&mut a, &f32s(&[2.0, 0.5, 4.0]), DataType::F32, RedOp::Min);
        assert_eq!(a, f32s(&[2.0, 0.5, 4.0]));
        divide(&mut a, DataType::F32, 2);
        assert_eq!(a, f32s(&[1.0, 0.25, 2.0]));
    }

    #[test]
    fn three_operand_form_matches_two_operand() {
        for t in DataType::ALL {
            for op in RedOp::ALL {
                let x: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x15).collect();
                let y: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(11) ^ 0x2c).collect();
                let mut two = x.clone();
                reduce_into(&mut two, &y, t, op);
                let mut three = vec![0u8; 64];
                reduce_to(&mut three, &x, &y, t, op);
                // Bitwise, NaNs included: the same arithmetic in the same order.
                assert_eq!(two, three, "{t} {op:?}");
            }
        }
    }

    #[test]
    fn integers_wrap_and_divide_truncating() {
        let mut a = vec![250u8, 7];
        reduce_into(&mut a, &[10, 3], DataType::U8, RedOp::Sum);
        assert_eq!(a, [4, 10]);
        let mut b: Vec<u8> = (-7i32).to_le_bytes().to_vec();
        divide(&mut b, DataType::I32, 2);
        assert_eq!(i32::from_le_bytes(b.try_into().unwrap()), -3);
    }

    #[test]
    fn half_types_reduce_in_f32() {
        // 2048 + 1 is not representable in f16; the f32 sum rounds once, to 2048.
        let h = |x: f32| f16::from_f32(x).to_bits().to_le_bytes().to_vec();
        let mut a = h(2048.0);
        reduce_into(&mut a, &h(1.0), DataType::F16, RedOp::Sum);
        assert_eq!(a, h(2048.0));
        let mut a = h(1.5);
        reduce_into(&mut a, &h(2.0), DataType::F16, RedOp::Prod);
        assert_eq!(a, h(3.0));
        let b = |x: f32| bf16::from_f32(x).to_bits().to_le_bytes().to_vec();
        let mut a = b(1.0);
        reduce_into(&mut a, &b(-3.0), DataType::Bf16, RedOp::Min);
        assert_eq!(a, b(-3.0));
    }
}
