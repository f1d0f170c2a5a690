//! Which cores the ranks on one machine can run on, so a rank knows whether spinning while it
//! waits takes a core another rank needs.
//!
//! A rank's own view is not enough: `std::thread::available_parallelism` counts the cores in
//! the calling thread's affinity mask (and a cgroup's CPU quota), so a rank that a launcher
//! bound to one core (`mpirun --bind-to core`, Slurm's `--cpu-bind=cores`, `taskset` per
//! rank) sees one core, and two such ranks on two cores looked oversubscribed: they handed
//! their core over on every idle look (an 8-byte AllReduce on 2 ranks took 0.44 us bound
//! against 0.19 us unbound). Each rank therefore publishes its mask and its own count in the
//! rendezvous table ([`this_rank`]), and the ranks that share a machine count the union of
//! their masks ([`shared_cores`]).

use std::collections::BTreeSet;

/// Most CPUs a published mask may name (larger numbers are ignored as garbage).
const MAX_CPU: usize = 4096;

/// This rank's entry for the rendezvous table: its affinity mask as a Linux CPU list, a
/// slash, and the cores `available_parallelism` grants it (`0-3,8/5`). The count alone when
/// the mask cannot be read (`/5`).
pub(crate) fn this_rank() -> String {
    let avail = std::thread::available_parallelism().map_or(1, usize::from);
    let list = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            let n = nix::sched::CpuSet::count().min(MAX_CPU);
            cpu_list((0..n).filter(|&c| set.is_set(c).unwrap_or(false)))
        })
        .unwrap_or_default();
    format!("{list}/{avail}")
}

/// A Linux CPU list (`0-3,8`) of increasing CPU numbers.
fn cpu_list(cpus: impl Iterator<Item = usize>) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for c in cpus {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == c => *hi = c,
            _ => runs.push((c, c)),
        }
    }
    runs.iter()
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// One rank's published entry: its mask (empty when unknown) and its own core count.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    mask: BTreeSet<usize>,
    avail: usize,
}

/// Parses [`this_rank`]'s text; `None` for anything malformed (a peer's garbage only costs
/// the estimate, never the run).
fn parse(text: &str) -> Option<Entry> {
    let (list, avail) = text.split_once('/')?;
    let avail: usize = avail.parse().ok().filter(|&a| (1..=MAX_CPU).contains(&a))?;
    let mut mask = BTreeSet::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        if lo > hi || hi >= MAX_CPU {
            return None;
        }
        mask.extend(lo..=hi);
    }
    Some(Entry { mask, avail })
}

/// Cores that the ranks with these entries (this rank's among them) can use together: the
/// union of their masks, capped by any rank's own count that is smaller than its mask (a
/// cgroup's CPU quota, which the ranks of one container share). `None` when an entry is
/// malformed or has no mask; callers then fall back to this rank's own count.
pub(crate) fn shared_cores<'a>(entries: impl IntoIterator<Item = &'a str>) -> Option<usize> {
    let mut union = BTreeSet::new();
    let mut quota = usize::MAX;
    for e in entries {
        let e = parse(e)?;
        if e.mask.is_empty() {
            return None;
        }
        if e.avail < e.mask.len() {
            quota = quota.min(e.avail);
        }
        union.extend(e.mask);
    }
    (!union.is_empty()).then(|| union.len().min(quota))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip() {
        assert_eq!(cpu_list([0, 1, 2, 3, 8, 10, 11].into_iter()), "0-3,8,10-11");
        assert_eq!(cpu_list(std::iter::empty()), "");
        let e = parse("0-3,8,10-11/7").unwrap();
        assert_eq!(
            e.mask.iter().copied().collect::<Vec<_>>(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(e.avail, 7);
        let mine = parse(&this_rank()).unwrap();
        assert!(mine.avail >= 1 && mine.avail <= mine.mask.len().max(1));
    }

    #[test]
    fn ranks_bound_to_their_own_cores_share_all_of_them() {
        // Two ranks bound one core each: two cores between them, not one.
        assert_eq!(shared_cores(["0/1", "1/1"]), Some(2));
        // Both bound to the same core: one.
        assert_eq!(shared_cores(["0/1", "0/1"]), Some(1));
        // Unbound on a 2-core machine.
        assert_eq!(shared_cores(["0-1/2", "0-1/2"]), Some(2));
        // A quota of 2 cores on an 8-core mask caps the union.
        assert_eq!(shared_cores(["0-7/2", "0-7/2"]), Some(2));
        assert_eq!(shared_cores(["0-7/8", "0-3/2"]), Some(2));
    }

    #[test]
    fn garbage_gives_no_estimate() {
        for bad in [
            "",
            "/",
            "0-1",
            "0-1/0",
            "x/2",
            "3-1/2",
            "0-99999/2",
            "/2",
            "0,,1/x",
        ] {
            assert_eq!(shared_cores(["0-1/2", bad]), None, "{bad:?}");
        }
    }
}
