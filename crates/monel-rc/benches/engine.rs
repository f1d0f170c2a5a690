//! Per-packet engine cost: one 4 KiB-MTU RDMA WRITE packet through requester and responder,
//! plus its share of ACK processing, without the payload copy. Baseline in the same run: a
//! 4 KiB memcpy (the copy the engine figure leaves out), so the ratio survives a noisy host.
#![allow(missing_docs)] // criterion macros generate undocumented items

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monel_rc::bench_support::EngineLoop;

fn per_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));
    let mut lp = EngineLoop::new();
    lp.run(10_000);
    g.bench_function("write_4k_mtu_per_packet", |b| b.iter(|| lp.run(1)));
    let src = vec![0x5au8; 4096];
    let mut dst = vec![0u8; 4096];
    g.bench_function("baseline_memcpy_4k", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.finish();
}

criterion_group!(benches, per_packet);
criterion_main!(benches);
