//! An AllReduce through the Communicator: four ranks (threads here; processes or hosts work
//! the same way) join one communicator and sum a float32 vector, then check the result.
//!
//!   cargo run --release -p monel-ccl --example all_reduce [RANKS]

use monel_ccl::{CommConfig, Communicator, RedOp, UniqueId};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(4);
    // One rank (or a launcher) creates the id and hands it to the others.
    let id = UniqueId::create("127.0.0.1:0".parse()?)?;
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let id = id.clone();
            std::thread::spawn(move || -> Result<Vec<f32>, monel_ccl::CclError> {
                let mut comm = Communicator::init_rank(n, rank, &id, CommConfig::default())?;
                // Rank r contributes [r, r + 1, ..., r + 7].
                let mine: Vec<f32> = (0..8).map(|i| (rank + i) as f32).collect();
                let mut sum = vec![0f32; mine.len()];
                comm.all_reduce_slice(&mine, &mut sum, RedOp::Sum)?;
                if rank == 0 {
                    for p in comm.paths() {
                        println!("{p}");
                    }
                }
                Ok(sum)
            })
        })
        .collect();
    // Element i sums r + i over the ranks: n * i + n * (n - 1) / 2.
    let want: Vec<f32> = (0..8).map(|i| (n * i + n * (n - 1) / 2) as f32).collect();
    for (rank, t) in ranks.into_iter().enumerate() {
        let got = t.join().expect("rank thread")?;
        assert_eq!(got, want, "rank {rank}");
    }
    println!("all_reduce over {n} ranks: every rank has {want:?}");
    Ok(())
}
