//! Per-packet engine cost: one 4 KiB-MTU RDMA WRITE packet through requester and responder,
#![allow(missing_docs)] // criterion macros generate undocumented items
//! plus its share of ACK processing, without the payload copy.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monel_rc::bench_support::EngineLoop;

fn per_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));
    let mut lp = EngineLoop::new();
    lp.run(10_000);
    g.bench_function("write_4k_mtu_per_packet", |b| b.iter(|| lp.run(1)));
    g.finish();
}

criterion_group!(benches, per_packet);
criterion_main!(benches);
