//! How a context runs its NIC: the options [`crate::Context::open`] takes.

use monel_rc::congestion::CongestionConfig;

/// How a context runs its soft RNIC.
#[derive(Debug, Clone)]
pub struct ContextConfig {
    /// UDP port to bind and to send to (RoCEv2: 4791).
    pub udp_port: u16,
    /// Threads waiting on a CQ spin on the sockets instead of sleeping (lower latency, one
    /// core spinning per waiting thread; the progress thread still sleeps between timers).
    pub busy_poll: bool,
    /// DSCP for outgoing packets.
    pub dscp: u8,
    /// Mark outgoing packets ECN-capable (ECT(0)) so switches can mark CE for DCQCN.
    pub ecn: bool,
    /// Congestion control for new QPs.
    pub congestion: CongestionConfig,
    /// Datagrams per recvmmsg batch; a send batch holds four times as many packets (a
    /// sendmmsg carries several GSO messages of up to 15 4 KiB packets each).
    pub batch: usize,
    /// UDP segmentation offload: a run of equal-size packets to one peer leaves as one GSO
    /// message, each segment's ICRC computed for the IPv4 ID the kernel will give it; and
    /// UDP GRO on receive. Falls back to plain datagrams if the kernel refuses.
    pub gso: bool,
    /// Send-only UDP sockets per GID, on ports the kernel picks; each QP sends from one of
    /// them, chosen by its QPN, so ECMP switches hashing the 5-tuple spread QPs over paths
    /// (RoCE NICs and rxe give each QP its own source port). 0: every packet leaves from
    /// `udp_port`. Receiving is always on `udp_port`. At most 256.
    pub source_ports: usize,
    /// Zero-copy sends: request payloads of at least 512 bytes go from the registered
    /// region straight into the send system call (an iovec per piece), not through a
    /// packet buffer. The region's lock is held while the batch is sent.
    pub zero_copy: bool,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            udp_port: monel_wire::ROCE_V2_UDP_PORT,
            busy_poll: false,
            dscp: 26,
            ecn: true,
            congestion: CongestionConfig::None,
            batch: 32,
            gso: true,
            source_ports: 8,
            zero_copy: true,
        }
    }
}

impl ContextConfig {
    /// The IP traffic class byte sent: DSCP << 2 | ECN.
    pub fn traffic_class(&self) -> u8 {
        (self.dscp << 2) | if self.ecn { 0b10 } else { 0 }
    }
}
