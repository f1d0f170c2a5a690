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
    /// UD datagrams dropped for a wrong Q_Key.
    pub qkey_violations: u64,
    /// UD datagrams dropped because no receive was posted.
    pub no_recv_drops: u64,
}

impl core::ops::AddAssign for QpStats {
    /// Sums counters (e.g. over the QPs of a device).
    fn add_assign(&mut self, o: Self) {
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.rx_packets += o.rx_packets;
        self.retransmitted_packets += o.retransmitted_packets;
        self.timeouts += o.timeouts;
        self.seq_naks_sent += o.seq_naks_sent;
        self.seq_naks_received += o.seq_naks_received;
        self.rnr_naks_sent += o.rnr_naks_sent;
        self.rnr_naks_received += o.rnr_naks_received;
        self.duplicate_requests += o.duplicate_requests;
        self.duplicate_responses += o.duplicate_responses;
        self.out_of_sequence += o.out_of_sequence;
        self.access_errors += o.access_errors;
        self.invalid_requests += o.invalid_requests;
        self.acks_sent += o.acks_sent;
        self.cnps_sent += o.cnps_sent;
        self.cnps_received += o.cnps_received;
        self.dropped += o.dropped;
        self.fast_retries += o.fast_retries;
        self.qkey_violations += o.qkey_violations;
        self.no_recv_drops += o.no_recv_drops;
    }
}
