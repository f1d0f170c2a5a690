//! Reduction and copy kernels against memcpy, on buffers of a given size (default 16 MiB),
//! float32 sum: GB/s of one operand processed, median of 9 runs, interleaved.
//!   cargo run --release -p monel-sched --example kernels [BYTES]

use std::time::Instant;

use monel_sched::reduce::{reduce_into, reduce_to};
use monel_sched::{DataType, RedOp};

/// A named kernel writing its output into the buffer it is given.
type Kernel<'a> = (&'a str, &'a dyn Fn(&mut [u8]));

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(16 << 20);
    let x: Vec<u8> = (0..n).map(|i| (i % 251) as u8 & 0x3f).collect();
    let y: Vec<u8> = (0..n).map(|i| (i % 241) as u8 & 0x3f).collect();
    let mut out = vec![1u8; n];
    let (t, op) = (DataType::F32, RedOp::Sum);
    let kernels: [Kernel<'_>; 3] = [
        ("memcpy", &|o| o.copy_from_slice(&x)),
        ("reduce_into (o += x)", &|o| reduce_into(o, &x, t, op)),
        ("reduce_to (o = x + y)", &|o| reduce_to(o, &x, &y, t, op)),
    ];
    let mut times = vec![Vec::new(); kernels.len()];
    for _ in 0..9 {
        for (k, (_, f)) in kernels.iter().enumerate() {
            let t0 = Instant::now();
            f(&mut out);
            times[k].push(t0.elapsed().as_secs_f64());
        }
    }
    for (k, (name, _)) in kernels.iter().enumerate() {
        times[k].sort_by(f64::total_cmp);
        println!("{name:>24}: {:6.2} GB/s", n as f64 / times[k][4] / 1e9);
    }
}
