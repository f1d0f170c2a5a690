//! Max-min fair sharing of links by flows (the fluid model of a lossless fabric whose
//! congestion control converges to fair shares), and draining a set of flows to the end.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::LinkId;

/// Max-min fair rates (bits per second) of flows crossing links of `capacity`, by water
/// filling: the most constrained link fixes the rate of its flows, which leave the problem,
/// until every flow has a rate. A flow with an empty path (inside one host) gets `f64::INFINITY`.
pub fn max_min_rates(capacity: &[f64], paths: &[&[LinkId]]) -> Vec<f64> {
    max_min_rates_by(capacity, paths.len(), |f| paths[f])
}

/// [`max_min_rates`] for `n` flows whose paths `path(f)` gives. Links are visited through a
/// heap of per-link fair shares: O(F·P·log L) for F flows of P links over L links.
pub fn max_min_rates_by<'a>(
    capacity: &[f64],
    n: usize,
    path: impl Fn(usize) -> &'a [LinkId],
) -> Vec<f64> {
    let mut rate = vec![f64::NAN; n];
    // Compact the links in use.
    let mut local = vec![u32::MAX; capacity.len()];
    let mut links: Vec<LinkId> = Vec::new();
    let mut users: Vec<u32> = Vec::new();
    for (f, rate) in rate.iter_mut().enumerate() {
        let p = path(f);
        if p.is_empty() {
            *rate = f64::INFINITY;
        }
        for &l in p {
            if local[l] == u32::MAX {
                local[l] = links.len() as u32;
                links.push(l);
                users.push(0);
            }
            users[local[l] as usize] += 1;
        }
    }
    // Flows by link (CSR).
    let mut start = Vec::with_capacity(links.len() + 1);
    start.push(0usize);
    for &u in &users {
        start.push(start.last().expect("seeded") + u as usize);
    }
    let mut fill = start.clone();
    let mut by_link = vec![0u32; *start.last().expect("seeded")];
    for f in 0..n {
        for &l in path(f) {
            let i = local[l] as usize;
            by_link[fill[i]] = f as u32;
            fill[i] += 1;
        }
    }
    let mut left: Vec<f64> = links.iter().map(|&l| capacity[l]).collect();
    let share = |left: f64, users: u32| (left.max(0.0) / f64::from(users)).to_bits();
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = (0..links.len())
        .map(|i| Reverse((share(left[i], users[i]), i as u32)))
        .collect();
    while let Some(Reverse((bits, i))) = heap.pop() {
        let i = i as usize;
        if users[i] == 0 || share(left[i], users[i]) != bits {
            continue; // stale
        }
        let s = f64::from_bits(bits);
        for &f in &by_link[start[i]..start[i + 1]] {
            let f = f as usize;
            if !rate[f].is_nan() {
                continue;
            }
            rate[f] = s;
            for &l in path(f) {
                let j = local[l] as usize;
                left[j] -= s;
                users[j] -= 1;
                if users[j] > 0 && j != i {
                    heap.push(Reverse((share(left[j], users[j]), j as u32)));
                }
            }
        }
    }
    rate
}

/// Flows that all start at once, each sending `bits[f]` along `path(f)`, rates re-shared max-min
/// fairly whenever one finishes: the time each one's last bit leaves, seconds.
pub fn drain<'a>(capacity: &[f64], bits: &[f64], path: impl Fn(usize) -> &'a [LinkId]) -> Vec<f64> {
    let n = bits.len();
    let mut done = vec![0.0f64; n];
    let mut left: Vec<f64> = bits.to_vec();
    let mut active: Vec<usize> = (0..n).filter(|&f| bits[f] > 0.0).collect();
    let mut t = 0.0;
    while !active.is_empty() {
        let rates = max_min_rates_by(capacity, active.len(), |k| path(active[k]));
        let dt = active
            .iter()
            .zip(&rates)
            .map(|(&f, &r)| left[f] / r)
            .fold(f64::INFINITY, f64::min);
        t += dt;
        active = active
            .iter()
            .zip(&rates)
            .filter_map(|(&f, &r)| {
                left[f] -= r * dt;
                if left[f] <= bits[f] * 1e-9 || r.is_infinite() {
                    done[f] = t;
                    None
                } else {
                    Some(f)
                }
            })
            .collect();
    }
    done
}

/// Why flows with dependencies cannot all start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unstartable {
    /// Flow `flow` waits for `on`, which is not one of the `n` flows.
    Missing { flow: usize, on: usize, n: usize },
    /// Flow `flow` waits for itself, through others or directly.
    Cycle { flow: usize },
}

impl std::fmt::Display for Unstartable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing { flow, on, n } => {
                write!(f, "flow {flow} waits for flow {on}; there are {n}")
            }
            Self::Cycle { flow } => write!(f, "flow {flow} waits in a cycle: it can never start"),
        }
    }
}

/// Checks that every one of `n` flows can start: each flow in `after(f)` exists, and no flow
/// waits on itself (Kahn's order over the dependency counts).
pub(crate) fn check_dependencies<'a>(
    n: usize,
    after: impl Fn(usize) -> &'a [usize],
) -> Result<(), Unstartable> {
    let mut waiting = vec![0usize; n];
    let mut children = vec![Vec::new(); n];
    for (f, wait) in waiting.iter_mut().enumerate() {
        for &d in after(f) {
            if d >= n {
                return Err(Unstartable::Missing { flow: f, on: d, n });
            }
            *wait += 1;
            children[d].push(f);
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&f| waiting[f] == 0).collect();
    let mut seen = 0;
    while let Some(f) = ready.pop() {
        seen += 1;
        for &c in &children[f] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                ready.push(c);
            }
        }
    }
    match waiting.iter().position(|&w| w > 0) {
        Some(flow) if seen < n => Err(Unstartable::Cycle { flow }),
        _ => Ok(()),
    }
}

/// Flows that start at `start[f]` seconds, and not before every flow in `after[f]` has
/// arrived (`after` empty: no dependencies), each sending `bits[f]` along `path(f)` at
/// max-min fair rates re-shared whenever one starts or finishes; a flow arrives `latency(f)`
/// after its last bit leaves. Returns each flow's start and arrival, seconds. The
/// dependencies must not form a cycle (flows caught in one never start: NaN).
pub fn drain_timed<'a>(
    capacity: &[f64],
    bits: &[f64],
    start: &[f64],
    after: &[Vec<usize>],
    path: impl Fn(usize) -> &'a [LinkId],
    latency: impl Fn(usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let n = bits.len();
    let mut waiting: Vec<usize> = (0..n).map(|f| after.get(f).map_or(0, Vec::len)).collect();
    let mut children = vec![Vec::new(); n];
    for (f, deps) in after.iter().enumerate() {
        for &d in deps {
            children[d].push(f);
        }
    }
    let mut began = vec![f64::NAN; n];
    let mut arrived = vec![f64::NAN; n];
    let mut ready_at: Vec<f64> = start.to_vec();
    // Flows whose dependencies have arrived, by the time they may start.
    let mut pending: BinaryHeap<Reverse<(u64, usize)>> = (0..n)
        .filter(|&f| waiting[f] == 0)
        .map(|f| Reverse((start[f].to_bits(), f)))
        .collect();
    let mut left: Vec<f64> = bits.to_vec();
    let mut active: Vec<usize> = Vec::new();
    // Arrivals in flight (a flow's last bit has left), by arrival time.
    let mut landing: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut t = 0.0f64;
    // The shares change only when a flow starts or finishes; landings alone keep them.
    let mut rates: Vec<f64> = Vec::new();
    let mut reshare = true;
    loop {
        let next_start = pending.peek().map(|Reverse((b, _))| f64::from_bits(*b));
        let next_land = landing.peek().map(|Reverse((b, _))| f64::from_bits(*b));
        if reshare {
            rates = max_min_rates_by(capacity, active.len(), |k| path(active[k]));
            reshare = false;
        }
        let finish = active
            .iter()
            .zip(&rates)
            .map(|(&f, &r)| t + left[f] / r)
            .fold(f64::INFINITY, f64::min);
        let next = [next_start, next_land, Some(finish)]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        if !next.is_finite() {
            break;
        }
        let dt = next - t;
        t = next;
        let mut still = Vec::with_capacity(active.len());
        for (&f, &r) in active.iter().zip(&rates) {
            left[f] -= r * dt;
            // Done, or so nearly that its finish rounds to now (no progress otherwise).
            if left[f] <= bits[f] * 1e-9 || r.is_infinite() || t + left[f] / r <= t {
                landing.push(Reverse(((t + latency(f)).to_bits(), f)));
                reshare = true;
            } else {
                still.push(f);
            }
        }
        active = still;
        while let Some(&Reverse((b, f))) = landing.peek() {
            if f64::from_bits(b) > t {
                break;
            }
            landing.pop();
            arrived[f] = f64::from_bits(b);
            for &c in &children[f] {
                waiting[c] -= 1;
                ready_at[c] = ready_at[c].max(arrived[f]);
                if waiting[c] == 0 {
                    pending.push(Reverse((ready_at[c].to_bits(), c)));
                }
            }
        }
        while let Some(&Reverse((b, f))) = pending.peek() {
            if f64::from_bits(b) > t {
                break;
            }
            pending.pop();
            began[f] = t;
            if bits[f] > 0.0 {
                active.push(f);
                reshare = true;
            } else {
                landing.push(Reverse(((t + latency(f)).to_bits(), f)));
            }
        }
    }
    (began, arrived)
}

/// A seeded generator of numbers below `m` (`rnd(m)`), for the engines' random tests.
#[cfg(test)]
pub(crate) fn uniform(seed: u64) -> impl FnMut(usize) -> usize {
    let mut seed = seed;
    move |m| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize % m
    }
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

    #[test]
    fn max_min_is_fair_and_fills_a_bottleneck_on_random_cases() {
        // Every flow is either limited by a saturated link on which it has the largest
        // rate (the max-min condition), and no link is over capacity.
        let mut rnd = uniform(0x5eed);
        for case in 0..200 {
            let links = 1 + rnd(12);
            let cap: Vec<f64> = (0..links).map(|_| 1.0 + rnd(9) as f64).collect();
            let paths: Vec<Vec<usize>> = (0..1 + rnd(20))
                .map(|_| {
                    let mut p: Vec<usize> = (0..1 + rnd(3)).map(|_| rnd(links)).collect();
                    p.sort_unstable();
                    p.dedup();
                    p
                })
                .collect();
            let refs: Vec<&[usize]> = paths.iter().map(|p| p.as_slice()).collect();
            let r = max_min_rates(&cap, &refs);
            let mut load = vec![0.0; links];
            for (p, &x) in paths.iter().zip(&r) {
                for &l in p {
                    load[l] += x;
                }
            }
            for l in 0..links {
                assert!(
                    load[l] <= cap[l] * (1.0 + 1e-9),
                    "case {case} (seed 0x5eed): link {l}"
                );
            }
            for (f, p) in paths.iter().enumerate() {
                let limited = p.iter().any(|&l| {
                    load[l] >= cap[l] * (1.0 - 1e-9)
                        && paths
                            .iter()
                            .zip(&r)
                            .filter(|(q, _)| q.contains(&l))
                            .all(|(_, &y)| y <= r[f] * (1.0 + 1e-9))
                });
                assert!(
                    limited,
                    "case {case} (seed 0x5eed): flow {f} is not max-min limited"
                );
            }
        }
    }

    #[test]
    fn drain_reshares_when_flows_finish() {
        // Two flows share link 0 (capacity 2): a sends 1 bit, b 3 bits. Both at 1 b/s until
        // a finishes at t=1, then b alone at 2 b/s: its last 2 bits take 1 s more.
        let paths: [&[usize]; 2] = [&[0], &[0]];
        let t = drain(&[2.0], &[1.0, 3.0], |f| paths[f]);
        assert!(
            (t[0] - 1.0).abs() < 1e-12 && (t[1] - 2.0).abs() < 1e-12,
            "{t:?}"
        );
    }
}
