//! Host topology: which ranks share a host, and the order rings and trees take them in.

use crate::bootstrap::PeerAddrs;

/// The ranks' places in rings and trees: grouped by host (the machine, or the address where
/// the machine is unknown, and `MONEL_HOST`), hosts in the order of their lowest rank, ranks
/// ascending within a host. Every rank computes it from the same rendezvous table, so all
/// agree; ranks placed host by host already (as launchers usually place them) keep their
/// own numbers.
pub(crate) fn host_order(table: &[PeerAddrs]) -> Vec<usize> {
    let mut hosts: Vec<(String, String)> = Vec::new();
    let mut of = Vec::with_capacity(table.len());
    for p in table {
        let k = host_key(p);
        let h = hosts.iter().position(|x| *x == k).unwrap_or_else(|| {
            hosts.push(k);
            hosts.len() - 1
        });
        of.push(h);
    }
    let mut order: Vec<usize> = (0..table.len()).collect();
    order.sort_by_key(|&r| (of[r], r));
    order
}

/// What tells hosts apart: the machine (its address where unknown) and `MONEL_HOST`.
pub(super) fn host_key(p: &PeerAddrs) -> (String, String) {
    let m = if p.machine.is_empty() {
        p.data.ip().to_string()
    } else {
        p.machine.clone()
    };
    (m, p.host.clone())
}

/// How many ranks each host has, when every host has as many, else 0; `order` is
/// [`host_order`]'s, which puts each host's ranks next to each other.
pub(crate) fn per_host(table: &[PeerAddrs], order: &[usize]) -> usize {
    let mut sizes: Vec<usize> = Vec::new();
    for (k, &r) in order.iter().enumerate() {
        if k > 0 && host_key(&table[order[k - 1]]) == host_key(&table[r]) {
            *sizes.last_mut().expect("a host") += 1;
        } else {
            sizes.push(1);
        }
    }
    match sizes.first() {
        Some(&l) if sizes.iter().all(|&x| x == l) => l,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_order_groups_ranks_by_machine_and_host_and_counts_them() {
        let peer = |ip: &str, machine: &str, host: &str| PeerAddrs {
            data: format!("{ip}:1").parse().unwrap(),
            status: format!("{ip}:2").parse().unwrap(),
            machine: machine.into(),
            host: host.into(),
            cpus: String::new(),
        };
        // Two machines, ranks placed cyclically.
        let t = [
            peer("10.0.0.1", "m1", ""),
            peer("10.0.0.2", "m2", ""),
            peer("10.0.0.1", "m1", ""),
            peer("10.0.0.2", "m2", ""),
        ];
        assert_eq!(host_order(&t), [0, 2, 1, 3]);
        assert_eq!(per_host(&t, &host_order(&t)), 2);
        // One machine standing in for two hosts (MONEL_HOST); hosts in order of their
        // lowest rank.
        let t = [
            peer("10.0.0.1", "m", "b"),
            peer("10.0.0.1", "m", "a"),
            peer("10.0.0.1", "m", "b"),
            peer("10.0.0.1", "m", "a"),
            peer("10.0.0.1", "m", "a"),
        ];
        assert_eq!(host_order(&t), [0, 2, 1, 3, 4]);
        // Hosts of 2 and 3 ranks: no common size.
        assert_eq!(per_host(&t, &host_order(&t)), 0);
        // Unknown machines fall back to the address; placed host by host: the identity.
        let t = [
            peer("10.0.0.1", "", ""),
            peer("10.0.0.1", "", ""),
            peer("10.0.0.2", "", ""),
        ];
        assert_eq!(host_order(&t), [0, 1, 2]);
        assert_eq!(per_host(&t, &host_order(&t)), 0);
        assert_eq!(per_host(&t[..2], &[0, 1]), 2, "one host of two");
        assert_eq!(per_host(&t[1..], &[0, 1]), 1, "two hosts of one");
    }
}
