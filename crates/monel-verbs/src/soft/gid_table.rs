//! How a soft device's GID table follows its interface's addresses, as rxe's follows netdev
//! events: an entry whose address is gone is cleared (a zero GID) and its index stays
//! unused until an address takes it again; every other entry keeps its index, so QPs and
//! address handles that name an index never see it change under them. Sans-IO: the table
//! and the addresses in, the new table out.

use std::net::IpAddr;

use crate::device::{GidEntry, rxe_order};
use monel_peer::gid::{Gid, GidKind};

/// Most entries a soft device's GID table holds (each costs its sockets); addresses past
/// that get no GID.
pub(crate) const MAX_GIDS: usize = 64;

/// The table after the interface came to hold exactly `addrs`: gone addresses cleared, new
/// ones (in rxe's order) in the first cleared entry or at the end, up to [`MAX_GIDS`].
/// Trailing cleared entries are dropped, as a table ends at its last filled entry.
pub(crate) fn follow(table: &[GidEntry], addrs: &[(IpAddr, u32)]) -> Vec<GidEntry> {
    let holds = |g: &GidEntry| {
        g.gid != Gid::default() && addrs.iter().any(|&(ip, _)| Gid::from_ip(ip) == g.gid)
    };
    let mut out: Vec<GidEntry> = table
        .iter()
        .map(|g| if holds(g) { *g } else { cleared() })
        .collect();
    let mut fresh: Vec<(IpAddr, u32)> = addrs
        .iter()
        .copied()
        .filter(|&(ip, _)| !out.iter().any(|g| g.gid == Gid::from_ip(ip)))
        .collect();
    fresh.sort_by_key(|(ip, _)| rxe_order(ip));
    fresh.dedup_by_key(|(ip, _)| *ip);
    for (ip, ifindex) in fresh {
        let entry = GidEntry {
            gid: Gid::from_ip(ip),
            ifindex,
            kind: GidKind::RoceV2,
        };
        match out.iter().position(|g| g.gid == Gid::default()) {
            Some(i) => out[i] = entry,
            None if out.len() < MAX_GIDS => out.push(entry),
            None => break,
        }
    }
    while out.last().is_some_and(|g| g.gid == Gid::default()) {
        out.pop();
    }
    out
}

fn cleared() -> GidEntry {
    GidEntry {
        gid: Gid::default(),
        ifindex: 0,
        kind: GidKind::RoceV2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn ips(t: &[GidEntry]) -> Vec<Option<IpAddr>> {
        t.iter()
            .map(|g| (g.gid != Gid::default()).then(|| g.gid.to_ip()))
            .collect()
    }

    #[test]
    fn an_empty_table_fills_in_rxe_order() {
        let t = follow(
            &[],
            &[(ip("fd77::1"), 3), (ip("10.0.0.1"), 3), (ip("fe80::1"), 3)],
        );
        assert_eq!(
            ips(&t),
            [
                Some(ip("fe80::1")),
                Some(ip("10.0.0.1")),
                Some(ip("fd77::1"))
            ]
        );
        assert!(
            t.iter()
                .all(|g| g.ifindex == 3 && g.kind == GidKind::RoceV2)
        );
    }

    #[test]
    fn entries_keep_their_index_as_addresses_come_and_go() {
        let a = [(ip("fe80::1"), 2), (ip("10.0.0.1"), 2), (ip("10.0.0.2"), 2)];
        let t = follow(&[], &a);
        // 10.0.0.1 goes: its index is cleared, the others stay where they were.
        let t = follow(&t, &[a[0], a[2]]);
        assert_eq!(ips(&t), [Some(ip("fe80::1")), None, Some(ip("10.0.0.2"))]);
        // A new address takes the cleared index; the next one goes to the end.
        let t = follow(
            &t,
            &[a[0], a[2], (ip("192.168.1.5"), 2), (ip("fd00::9"), 2)],
        );
        assert_eq!(
            ips(&t),
            [
                Some(ip("fe80::1")),
                Some(ip("192.168.1.5")),
                Some(ip("10.0.0.2")),
                Some(ip("fd00::9"))
            ]
        );
        // Nothing changed: the same table.
        assert_eq!(
            follow(
                &t,
                &[a[0], a[2], (ip("192.168.1.5"), 2), (ip("fd00::9"), 2)]
            ),
            t
        );
        // The last entries go: the table ends at its last filled entry.
        let t = follow(&t, &[a[0]]);
        assert_eq!(ips(&t), [Some(ip("fe80::1"))]);
        assert_eq!(follow(&t, &[]), []);
    }

    #[test]
    fn the_table_is_bounded_and_an_address_listed_twice_gets_one_entry() {
        let many: Vec<(IpAddr, u32)> = (0..MAX_GIDS as u32 + 10)
            .map(|i| (IpAddr::from((0x0a00_0000 + i).to_be_bytes()), 1))
            .collect();
        let t = follow(&[], &many);
        assert_eq!(t.len(), MAX_GIDS);
        let t = follow(&[], &[(ip("10.1.1.1"), 1), (ip("10.1.1.1"), 1)]);
        assert_eq!(t.len(), 1);
    }
}
