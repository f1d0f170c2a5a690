//! Per-QP counters, named after rxe's.

/// Counters of one QP. Plain numbers; they only grow.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpStats {
    /// Packets sent (all kinds).
    pub tx_packets: u64,
    /// RoCE bytes sent (BTH through ICRC).
    pub tx_bytes: u64,
    /// Packets received and accepted for processing.
    pub rx_packets: u64,
    /// Request packets sent again (go-back-N).
    pub retransmitted_packets: u64,
    /// Retransmit timer expiries.
    pub timeouts: u64,
    /// PSN sequence error NAKs sent (responder saw a gap).
    pub seq_naks_sent: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks_received: u64,
    /// RNR NAKs sent (no receive posted).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Duplicate requests received (re-ACKed or replayed, never re-executed).
    pub duplicate_requests: u64,
    /// Responses for PSNs already acknowledged.
    pub duplicate_responses: u64,
    /// Out-of-sequence packets dropped.
    pub out_of_sequence: u64,
    /// Remote access error NAKs sent.
    pub access_errors: u64,
    /// Invalid request NAKs sent.
    pub invalid_requests: u64,
    /// ACK packets sent.
    pub acks_sent: u64,
    /// CNPs sent.
    pub cnps_sent: u64,
    /// CNPs received.
    pub cnps_received: u64,
    /// Packets dropped as malformed or not for this QP's state.
    pub dropped: u64,
    /// Immediate retries after a response gap on a READ/atomic.
    pub fast_retries: u64,
}
