//! Runs N data packets through the engine loop; used under callgrind by
//! `scripts/engine-callgrind.sh` to count instructions per packet.

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let mut lp = monel_rc::bench_support::EngineLoop::new();
    let done = lp.run(n);
    println!("{done} packets");
}
