//! Max-min fair sharing of links by flows (the fluid model of a lossless fabric whose
//! congestion control converges to fair shares).

/// A flow in the fluid model.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// The links it crosses.
    pub path: Vec<crate::LinkId>,
    /// Bits still to send.
    pub remaining_bits: f64,
}

/// Max-min fair rates (bits per second) of flows crossing links of `capacity`, by water
/// filling: the most constrained link fixes the rate of its flows, which leave the problem,
/// until every flow has a rate. A flow with an empty path (inside one host) gets `f64::INFINITY`.
pub fn max_min_rates(capacity: &[f64], paths: &[&[crate::LinkId]]) -> Vec<f64> {
    let mut rate = vec![f64::NAN; paths.len()];
    let mut left = capacity.to_vec();
    let mut users = vec![0usize; capacity.len()];
    let mut by_link: Vec<Vec<usize>> = vec![Vec::new(); capacity.len()];
    let mut open = 0;
    for (f, p) in paths.iter().enumerate() {
        if p.is_empty() {
            rate[f] = f64::INFINITY;
            continue;
        }
        open += 1;
        for &l in p.iter() {
            users[l] += 1;
            by_link[l].push(f);
        }
    }
    while open > 0 {
        // The bottleneck: the least share per flow among links still carrying open flows.
        let (mut best, mut share) = (usize::MAX, f64::INFINITY);
        for l in 0..capacity.len() {
            if users[l] > 0 {
                let s = left[l] / users[l] as f64;
                if s < share {
                    (best, share) = (l, s);
                }
            }
        }
        for &f in &by_link[best] {
            if rate[f].is_nan() {
                rate[f] = share.max(0.0);
                open -= 1;
                for &l in paths[f] {
                    left[l] -= share;
                    users[l] -= 1;
                }
            }
        }
    }
    rate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_max_min_example() {
        // Links 0 and 1 of capacity 10; flow a crosses both, b only link 0, c only link 1,
        // d only link 1: link 1 is the bottleneck (3 flows), a = c = d = 10/3, b = 20/3.
        let paths: [&[usize]; 4] = [&[0, 1], &[0], &[1], &[1]];
        let r = max_min_rates(&[10.0, 10.0], &paths);
        let third = 10.0 / 3.0;
        for (got, want) in r.iter().zip([third, 2.0 * third, third, third]) {
            assert!((got - want).abs() < 1e-12, "{r:?}");
        }
        // No link is oversubscribed.
        assert!(r[0] + r[1] <= 10.0 + 1e-9 && r[0] + r[2] + r[3] <= 10.0 + 1e-9);
    }

    #[test]
    fn flows_inside_a_host_are_not_limited_by_links() {
        let paths: [&[usize]; 2] = [&[], &[0]];
        assert_eq!(max_min_rates(&[5.0], &paths), vec![f64::INFINITY, 5.0]);
    }
}
