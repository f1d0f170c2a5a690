//! Fabrics the integration tests share.

use monel_fabric::{Cluster, LeafSpine};

/// `hosts` plain hosts on one switch.
pub(crate) fn one_switch(hosts: usize, bps: f64, lat: f64) -> Cluster {
    LeafSpine {
        leaves: 1,
        hosts_per_leaf: hosts,
        spines: 0,
        host_link_bps: bps,
        spine_link_bps: bps,
        link_latency_s: lat,
    }
    .build()
    .map(Cluster::plain)
    .unwrap()
}
