//! Collectives over typed slices: the element type picks the data type and the slices'
//! lengths the counts, with the same results as the byte API's.

use half::bf16;
use monel_ccl::{CclError, CommConfig, Communicator, ErrorKind, RedOp, UniqueId};

/// Runs `f` on `n` ranks (threads) of one communicator; their results in rank order.
fn ranks<T: Send + 'static>(
    n: usize,
    f: impl Fn(&mut Communicator) -> Result<T, CclError> + Send + Sync + Clone + 'static,
) -> Vec<Result<T, CclError>> {
    let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let (id, f) = (id.clone(), f.clone());
            std::thread::spawn(move || {
                let mut c = Communicator::init_rank(n, r, &id, CommConfig::default())?;
                f(&mut c)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn typed_collectives_match_their_definitions() {
    let n = 3;
    let got = ranks(n, move |c| {
        let r = c.rank();
        // f32 sum: element i sums r + i.
        let send: Vec<f32> = (0..5).map(|i| (r + i) as f32).collect();
        let mut sum = vec![0f32; 5];
        c.all_reduce_slice(&send, &mut sum, RedOp::Sum)?;
        // i64 max in place.
        let mut max = vec![r as i64 * 10 - 7; 4];
        c.all_reduce_slice_in_place(&mut max, RedOp::Max)?;
        // u8 broadcast from rank 2.
        let mut b = if r == 2 {
            vec![9u8, 8, 7]
        } else {
            vec![0u8; 3]
        };
        c.broadcast_slice(&mut b, 2)?;
        // i32 all-gather, one element per rank.
        let mut all = vec![0i32; n];
        c.all_gather_slice(&[r as i32 + 100], &mut all)?;
        // bf16 reduce-scatter: each rank keeps two sums.
        let parts: Vec<bf16> = (0..2 * n).map(|i| bf16::from_f32(i as f32)).collect();
        let mut mine = vec![bf16::ZERO; 2];
        c.reduce_scatter_slice(&parts, &mut mine, RedOp::Sum)?;
        // u64 all-to-all: rank r sends r * 10 + j to rank j.
        let out: Vec<u64> = (0..n as u64).map(|j| r as u64 * 10 + j).collect();
        let mut got = vec![0u64; n];
        c.all_to_all_slice(&out, &mut got)?;
        // f64 reduce to rank 1.
        let mut red = vec![0f64; 2];
        c.reduce_slice(&[r as f64, 0.5], &mut red, RedOp::Sum, 1)?;
        Ok((r, sum, max, b, all, mine, got, red))
    });
    for res in got {
        let (r, sum, max, b, all, mine, got, red) = res.unwrap();
        let want: Vec<f32> = (0..5).map(|i| (3 * i + 3) as f32).collect();
        assert_eq!(sum, want, "rank {r}");
        assert_eq!(max, vec![13i64; 4], "rank {r}");
        assert_eq!(b, vec![9, 8, 7], "rank {r}");
        assert_eq!(all, vec![100, 101, 102], "rank {r}");
        let keep: Vec<f32> = mine.iter().map(|x| x.to_f32()).collect();
        assert_eq!(keep, vec![(6 * r) as f32, (6 * r + 3) as f32], "rank {r}");
        assert_eq!(
            got,
            (0..3u64).map(|j| j * 10 + r as u64).collect::<Vec<_>>()
        );
        if r == 1 {
            assert_eq!(red, vec![3.0, 1.5]);
        }
    }
}

#[test]
fn a_slice_that_does_not_split_over_the_ranks_is_refused_and_the_communicator_lives_on() {
    let got = ranks(2, |c| {
        let mut out = [0f32; 3];
        let e = c.all_to_all_slice(&[1f32, 2.0, 3.0], &mut out).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        let mut v = [c.rank() as f32 + 1.0];
        c.all_reduce_slice_in_place(&mut v, RedOp::Sum)?;
        Ok(v[0])
    });
    for g in got {
        assert_eq!(g.unwrap(), 3.0);
    }
}
