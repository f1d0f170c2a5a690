//! UDP segmentation offload planning (sans-IO): which queued packets leave as one GSO message
//! (the kernel cuts it into datagrams of one size, the last one shorter or equal). Each
//! message carries its own `UDP_SEGMENT` size, so messages of any sizes share a sendmmsg.
//!
//! The ICRC covers the IPv4 ID. On an unconnected socket with DF set the kernel sends ID 0,
//! and GSO numbers the segments of a message 0, 1, 2...; the sender therefore frames the k-th
//! packet of a message with ID k before the kernel assigns it (`Message::first` + k).

/// Most UDP payload bytes in one GSO message (IPv4 allows 65,507; a margin for IPv6).
pub(crate) const MAX_GSO_BYTES: usize = 65_000;

/// Most segments in one GSO message (the kernel's `UDP_MAX_SEGMENTS` is 64 before 6.9).
pub(crate) const MAX_SEGMENTS: usize = 64;

/// Packets `first..first + count` of a socket's queue, sent as one message the kernel cuts
/// every `seg` bytes. `count == 1` is a plain datagram of `seg` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) seg: usize,
}

/// Groups packets, given in sending order as (destination, length), into messages. A message
/// holds consecutive packets to one destination, all of one length but the last, which may
/// be shorter; it takes a shorter packet as its tail only when that packet does not start a
/// run of its own (a WRITE's FIRST packet, longer by its RETH, leaves alone and its MIDDLE
/// packets go together).
pub(crate) fn plan<K: PartialEq>(pkts: &[(K, usize)], out: &mut Vec<Message>) {
    out.clear();
    let mut i = 0;
    while i < pkts.len() {
        let (ref key, seg) = pkts[i];
        let fits = |count: usize, bytes: usize, len: usize| {
            count < MAX_SEGMENTS && bytes + len <= MAX_GSO_BYTES
        };
        let mut j = i + 1;
        let mut bytes = seg;
        while j < pkts.len() && pkts[j].0 == *key && pkts[j].1 == seg && fits(j - i, bytes, seg) {
            bytes += seg;
            j += 1;
        }
        if j < pkts.len() && pkts[j].0 == *key && pkts[j].1 < seg && fits(j - i, bytes, pkts[j].1) {
            let starts_run = pkts
                .get(j + 1)
                .is_some_and(|n| n.0 == *key && n.1 == pkts[j].1);
            if !starts_run {
                j += 1;
            }
        }
        out.push(Message {
            first: i,
            count: j - i,
            seg,
        });
        i = j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(pkts: &[(u8, usize)]) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        plan(pkts, &mut out);
        out.iter().map(|m| (m.first, m.count, m.seg)).collect()
    }

    #[test]
    fn a_write_leaves_as_first_then_middles_with_their_tail() {
        // FIRST (RETH), 14 MIDDLE, LAST with ImmDt (4 bytes longer than MIDDLE).
        let mut pkts = vec![(1u8, 4128)];
        pkts.extend([(1, 4112); 14]);
        pkts.push((1, 4116));
        assert_eq!(
            planned(&pkts),
            vec![(0, 1, 4128), (1, 14, 4112), (15, 1, 4116)]
        );
        // A shorter LAST is the MIDDLEs' tail.
        *pkts.last_mut().unwrap() = (1, 900);
        assert_eq!(planned(&pkts), vec![(0, 1, 4128), (1, 15, 4112)]);
    }

    #[test]
    fn destinations_and_limits_cut_messages() {
        let pkts = [(1u8, 100), (1, 100), (2, 100), (2, 50), (1, 100)];
        assert_eq!(planned(&pkts), vec![(0, 2, 100), (2, 2, 100), (4, 1, 100)]);
        // 15 datagrams of 4112 B fit in 65,000 bytes, 16 do not.
        let big = vec![(0u8, 4112); 40];
        assert_eq!(
            planned(&big),
            vec![(0, 15, 4112), (15, 15, 4112), (30, 10, 4112)]
        );
        let small = vec![(0u8, 60); 200];
        let p = planned(&small);
        assert_eq!(p[0], (0, MAX_SEGMENTS, 60));
        assert_eq!(p.iter().map(|m| m.1).sum::<usize>(), 200);
    }

    #[test]
    fn every_message_is_valid_for_the_kernel() {
        // Deterministic pseudo-random packet streams; every plan must cover each packet once,
        // in order, with the kernel's shape rules.
        let mut x = 0x5eed_u64;
        for round in 0..500 {
            let n = (round % 70) + 1;
            let pkts: Vec<(u8, usize)> = (0..n)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    let key = ((x >> 60) % 3) as u8;
                    let len = [32, 60, 1040, 4112, 4116, 4128][((x >> 40) % 6) as usize];
                    (key, len)
                })
                .collect();
            let mut msgs = Vec::new();
            plan(&pkts, &mut msgs);
            let mut next = 0;
            for m in &msgs {
                assert_eq!(m.first, next, "seed 0x5eed round {round}");
                let part = &pkts[m.first..m.first + m.count];
                assert!(part.iter().all(|p| p.0 == part[0].0));
                assert!(part[..m.count - 1].iter().all(|p| p.1 == m.seg));
                assert!(part[m.count - 1].1 <= m.seg);
                assert!(m.count <= MAX_SEGMENTS);
                assert!(part.iter().map(|p| p.1).sum::<usize>() <= MAX_GSO_BYTES);
                next += m.count;
            }
            assert_eq!(next, pkts.len());
        }
    }
}
