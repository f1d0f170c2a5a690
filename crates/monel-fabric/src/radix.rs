//! A monotone priority queue on integer times (a radix heap): the packet engine never
//! schedules into the past, so an event goes into the bucket of the highest bit where its
//! time differs from the last one taken out, and a pop only redistributes one bucket.
//! Amortized O(log of the time span) per event, with no comparisons between far events.
//! Events due at the same time come out in an unspecified but deterministic order.

/// A radix heap of `(time, item)`.
#[derive(Debug, Clone)]
pub(crate) struct RadixHeap<T> {
    last: u64,
    len: usize,
    buckets: Vec<Vec<(u64, T)>>,
    spare: Vec<(u64, T)>,
}

fn bucket(t: u64, last: u64) -> usize {
    (u64::BITS - (t ^ last).leading_zeros()) as usize
}

impl<T: Copy> RadixHeap<T> {
    pub(crate) fn new() -> Self {
        Self {
            last: 0,
            len: 0,
            buckets: (0..=u64::BITS).map(|_| Vec::new()).collect(),
            spare: Vec::new(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `item` due at `t`; a time before the last one popped is taken as that time.
    pub(crate) fn push(&mut self, t: u64, item: T) {
        let t = t.max(self.last);
        self.buckets[bucket(t, self.last)].push((t, item));
        self.len += 1;
    }

    /// Takes an item due earliest.
    pub(crate) fn pop(&mut self) -> Option<(u64, T)> {
        if self.len == 0 {
            return None;
        }
        if self.buckets[0].is_empty() {
            let i = self
                .buckets
                .iter()
                .position(|b| !b.is_empty())
                .expect("len > 0");
            let mut moving =
                std::mem::replace(&mut self.buckets[i], std::mem::take(&mut self.spare));
            self.last = moving.iter().map(|&(t, _)| t).min().expect("non-empty");
            for &(t, item) in &moving {
                self.buckets[bucket(t, self.last)].push((t, item));
            }
            moving.clear();
            self.spare = moving;
        }
        self.len -= 1;
        self.buckets[0].pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_order_like_a_binary_heap() {
        let mut seed = 0x1234_5678u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut h = RadixHeap::new();
        let mut now = 0u64;
        let mut popped = Vec::new();
        let mut pushed = 0u64;
        for round in 0..20_000u64 {
            for _ in 0..(next() % 3) {
                let t = now + next() % (1 << (next() % 40));
                h.push(t, round);
                pushed += 1;
            }
            if let Some((t, _)) = h.pop() {
                assert!(t >= now, "seed 0x12345678: {t} popped after {now}");
                now = t;
                popped.push(t);
            }
        }
        while let Some((t, _)) = h.pop() {
            assert!(t >= now);
            now = t;
            popped.push(t);
        }
        assert_eq!(popped.len() as u64, pushed);
        assert!(h.is_empty());
    }
}
