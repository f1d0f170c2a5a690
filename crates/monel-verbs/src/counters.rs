//! Device counters, like rxe's `rdma statistic` set.

use std::fmt;

use monel_rc::QpStats;

/// Counters of one device: what its sockets saw, plus the sum of its QPs' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Datagrams received.
    pub rx_packets: u64,
    /// Bytes received (UDP payload).
    pub rx_bytes: u64,
    /// Datagrams sent.
    pub tx_packets: u64,
    /// Bytes sent (UDP payload).
    pub tx_bytes: u64,
    /// Dropped: ICRC wrong.
    pub icrc_errors: u64,
    /// Accepted IPv4 packets whose ICRC only matched after solving for the IP ID (segments
    /// of a GSO message after the first, senders such as rxe that number their datagrams).
    pub icrc_ip_id_solved: u64,
    /// Dropped: no QP with that number.
    pub unknown_qpn: u64,
    /// Dropped: source address (or, once pinned, UDP source port) is not the QP's peer's.
    pub bad_source: u64,
    /// Dropped: a protected QP's packet whose tag was wrong (forged or altered).
    pub auth_failed: u64,
    /// Dropped: a protected QP's packet seen before (replayed) or older than the window.
    pub replayed: u64,
    /// Dropped: too short, bad lengths, unknown opcode layout.
    pub malformed: u64,
    /// Received with ECN congestion experienced.
    pub ecn_ce: u64,
    /// Send calls that failed.
    pub tx_errors: u64,
    /// Number of sendmmsg calls.
    pub tx_batches: u64,
    /// Number of recvmmsg calls that returned data.
    pub rx_batches: u64,
    /// Datagrams sent inside GSO messages (the kernel cut them from one buffer).
    pub tx_segmented: u64,
    /// Datagrams received coalesced by GRO (several in one buffer).
    pub rx_coalesced: u64,
    /// Payload bytes sent straight from registered memory (zero-copy gather), not copied
    /// into a packet buffer first.
    pub tx_zero_copy_bytes: u64,
    /// Live QPs.
    pub qps: u64,
    /// Live memory regions (including per-QP inline buffers).
    pub mrs: u64,
    /// The QPs' counters, summed (destroyed QPs included).
    pub qp: QpStats,
}

impl DeviceCounters {
    /// Every counter by name, in display order (the QPs' sums prefixed `qp_`).
    pub fn rows(&self) -> [(&'static str, u64); 32] {
        let q = &self.qp;
        [
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("icrc_errors", self.icrc_errors),
            ("icrc_ip_id_solved", self.icrc_ip_id_solved),
            ("unknown_qpn", self.unknown_qpn),
            ("bad_source", self.bad_source),
            ("auth_failed", self.auth_failed),
            ("replayed", self.replayed),
            ("malformed", self.malformed),
            ("ecn_ce", self.ecn_ce),
            ("tx_errors", self.tx_errors),
            ("tx_segmented", self.tx_segmented),
            ("rx_coalesced", self.rx_coalesced),
            ("tx_zero_copy_bytes", self.tx_zero_copy_bytes),
            ("qps", self.qps),
            ("mrs", self.mrs),
            ("qp_retransmitted", q.retransmitted_packets),
            ("qp_timeouts", q.timeouts),
            ("qp_seq_naks_sent", q.seq_naks_sent),
            ("qp_seq_naks_received", q.seq_naks_received),
            ("qp_rnr_naks_sent", q.rnr_naks_sent),
            ("qp_rnr_naks_received", q.rnr_naks_received),
            ("qp_duplicate_requests", q.duplicate_requests),
            ("qp_duplicate_responses", q.duplicate_responses),
            ("qp_out_of_sequence", q.out_of_sequence),
            ("qp_access_errors", q.access_errors),
            ("qp_invalid_requests", q.invalid_requests),
            ("qp_cnps_sent", q.cnps_sent),
            ("qp_cnps_received", q.cnps_received),
            ("qp_dropped", q.dropped),
        ]
    }
}

impl fmt::Display for DeviceCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in self.rows() {
            writeln!(f, "{k:<24} {v}")?;
        }
        Ok(())
    }
}
