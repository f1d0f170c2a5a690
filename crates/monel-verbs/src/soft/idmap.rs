//! Maps keyed by 32-bit identifiers (QPNs, memory keys) with a multiply-xorshift hash. The
//! keys are drawn at random locally and packets only look them up, never insert them, so
//! SipHash's defence against chosen keys buys nothing here, and it costs on every packet.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A map from 32-bit identifiers.
pub(crate) type IdMap<V> = HashMap<u32, V, IdHash>;

/// Builds [`IdHasher`]s.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdHash;

impl BuildHasher for IdHash {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

/// Hashes one integer: a multiplication spreads it to the high bits (hashbrown's control
/// bytes), a shift folds them back into the low bits (its bucket index).
#[derive(Debug)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 ^= u64::from(n);
    }
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_and_random_keys_spread_over_buckets_and_control_bytes() {
        let hash = |k: u32| IdHash.hash_one(k);
        for keys in [
            (0..4096u32).collect::<Vec<_>>(),
            (0..4096u32)
                .map(|i| i.wrapping_mul(0x0100_0193) ^ 0xdead_beef)
                .collect(),
        ] {
            let mut low = std::collections::HashSet::new();
            let mut top = std::collections::HashSet::new();
            for &k in &keys {
                low.insert(hash(k) & 4095);
                top.insert(hash(k) >> 57);
            }
            // 4,096 keys into 4,096 buckets: a fair hash fills about 63%; all 128 tags.
            assert!(low.len() > 2300, "{} buckets", low.len());
            assert_eq!(top.len(), 128);
        }
        let mut m: IdMap<u32> = IdMap::default();
        for k in 0..1000 {
            m.insert(k * 7, k);
        }
        assert!((0..1000).all(|k| m.get(&(k * 7)) == Some(&k)));
        assert_eq!(m.get(&1), None);
    }
}
