//! The packet engine's settings (flow control, ECN, DCQCN, buffers) and what it reports.

use monel_rc::congestion::DcqcnParams;

use crate::error::PlanError;

/// How links keep from overflowing buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowControl {
    /// RoCE's priority flow control: pause frames per ingress port.
    Pfc,
    /// InfiniBand's credits per link.
    Credits,
    /// None: a packet that finds the buffer full is dropped.
    Lossy,
}

/// ECN marking at switch egress queues (RED-like, as DCQCN's congestion point).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ecn {
    /// Queue below which nothing is marked, bytes.
    pub kmin_bytes: u64,
    /// Queue above which everything is marked, bytes.
    pub kmax_bytes: u64,
    /// Marking probability at Kmax.
    pub pmax: f64,
}

impl Ecn {
    /// Production settings for a link speed: HPCC's 100 KB and 400 KB per 25 Gb/s (Alibaba's
    /// production values, proportional to the speed), capped at SimAI's 400 Gb/s values
    /// (800 KB, 3200 KB); Pmax 0.2.
    pub fn for_link(bps: f64) -> Self {
        let kmin = (100_000.0 * bps / 25e9).min(800_000.0) as u64;
        Self {
            kmin_bytes: kmin,
            kmax_bytes: 4 * kmin,
            pmax: 0.2,
        }
    }

    pub(crate) fn probability(&self, queued: u64) -> f64 {
        if queued <= self.kmin_bytes {
            0.0
        } else if queued > self.kmax_bytes {
            1.0
        } else {
            self.pmax * (queued - self.kmin_bytes) as f64
                / (self.kmax_bytes - self.kmin_bytes).max(1) as f64
        }
    }
}

/// The packet engine's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PacketParams {
    /// Payload bytes per packet (the path MTU).
    pub mtu: u32,
    /// Bytes each packet adds on the wire (headers, CRCs, preamble and gap).
    pub header_bytes: u32,
    /// Flow control on switch links.
    pub flow_control: FlowControl,
    /// Shared buffer of each switch, bytes.
    pub switch_buffer_bytes: u64,
    /// Receive buffer of each NIC, bytes.
    pub nic_buffer_bytes: u64,
    /// PFC's dynamic threshold: pause an ingress port holding more than `alpha` times the
    /// free buffer.
    pub pfc_alpha: f64,
    /// PFC resumes when the port's bytes fall this far below the threshold (or to zero).
    pub pfc_resume_bytes: u64,
    /// A fixed PFC threshold per ingress port, bytes, instead of the dynamic one
    /// (`pfc_alpha`): what switches configured with static XOFF limits do.
    pub pfc_xoff_bytes: Option<u64>,
    /// Credits (receive buffer) per link, bytes; `None`: enough for line rate (two round
    /// trips of data, at least four packets).
    pub credit_bytes: Option<u64>,
    /// ECN marking at switches (RoCE).
    pub ecn: Option<Ecn>,
    /// DCQCN at the senders, with these parameters (their line rate is each sender's NIC
    /// speed, given by the caller).
    pub dcqcn: Option<DcqcnParams>,
    /// Adaptive routing on upward hops.
    pub adaptive_routing: bool,
    /// Resend timeout after a drop, seconds.
    pub rto_s: f64,
    /// Seed of ECN marking's random draws.
    pub seed: u64,
    /// Record every QP's rate and goodput this often, seconds.
    pub sample_s: Option<f64>,
    /// Whether receivers acknowledge every data packet (RC's per-packet ACK, headers alone:
    /// `header_bytes` on the wire) back along the reverse path, where ACKs queue with data
    /// at switches and go first at the NIC; off: no reverse traffic.
    pub acks: bool,
}

impl PacketParams {
    /// RoCEv2 at `edge_bps`: 4096 B MTU, 78 B per packet on the wire (Ethernet, IPv4, UDP,
    /// BTH, ICRC, FCS, preamble and gap), PFC, 32 MiB switch buffers, ECN per
    /// [`Ecn::for_link`], DCQCN with NVIDIA-NIC defaults scaled to the speed.
    pub fn roce(edge_bps: f64) -> Self {
        Self {
            mtu: 4096,
            header_bytes: 78,
            flow_control: FlowControl::Pfc,
            switch_buffer_bytes: 32 << 20,
            nic_buffer_bytes: 4 << 20,
            pfc_alpha: 1.0 / 8.0,
            pfc_resume_bytes: 2 * (4096 + 78),
            pfc_xoff_bytes: None,
            credit_bytes: None,
            ecn: Some(Ecn::for_link(edge_bps)),
            dcqcn: Some(DcqcnParams::for_line_rate(edge_bps)),
            adaptive_routing: false,
            rto_s: 100e-6,
            seed: 1,
            sample_s: None,
            acks: false,
        }
    }

    /// InfiniBand: 4096 B MTU, 26 B per packet (LRH, BTH, ICRC, VCRC), credits, no ECN or
    /// DCQCN, static routing.
    pub fn infiniband() -> Self {
        Self {
            header_bytes: 26,
            flow_control: FlowControl::Credits,
            ecn: None,
            dcqcn: None,
            ..Self::roce(400e9)
        }
    }

    /// The defaults for a fabric: InfiniBand where it routes D-mod-k, else RoCE at its
    /// endpoint speed.
    pub fn for_fabric(f: &crate::topology::Fabric) -> Self {
        if f.routing == crate::topology::Routing::DestMod {
            Self::infiniband()
        } else {
            Self::roce(f.edge_bps)
        }
    }

    pub(crate) fn check(&self) -> Result<(), PacketError> {
        let bad = |field: &'static str, why: String| Err(PacketError::Invalid { field, why });
        if self.mtu < 256 || self.mtu > 1 << 20 {
            return bad("packet.mtu", format!("{} B: want 256 B to 1 MiB", self.mtu));
        }
        let need = u64::from(self.mtu + self.header_bytes);
        for (field, v) in [
            ("packet.switch_buffer", self.switch_buffer_bytes),
            ("packet.nic_buffer", self.nic_buffer_bytes),
        ] {
            if v < 4 * need {
                return bad(
                    field,
                    format!("{v} B: want at least four packets ({need} B each)"),
                );
            }
        }
        if let Some(x) = self.pfc_xoff_bytes
            && (x < need || x > self.switch_buffer_bytes)
        {
            return bad(
                "packet.pfc_threshold",
                format!(
                    "{x} B: want one packet ({need} B) to the switch buffer ({} B)",
                    self.switch_buffer_bytes
                ),
            );
        }
        if self.header_bytes > 1 << 16 {
            return bad(
                "packet.header_bytes",
                format!("{} B: want at most 64 KiB", self.header_bytes),
            );
        }
        if let Some(c) = self.credit_bytes
            && c < need
        {
            return bad(
                "packet.credits",
                format!("{c} B: want at least one packet ({need} B)"),
            );
        }
        if !(self.pfc_alpha > 0.0 && self.pfc_alpha.is_finite()) {
            return bad(
                "packet.pfc_alpha",
                format!("{}: want a positive number", self.pfc_alpha),
            );
        }
        if let Some(e) = self.ecn
            && (e.kmin_bytes > e.kmax_bytes || !(0.0..=1.0).contains(&e.pmax))
        {
            return bad(
                "packet.ecn",
                format!(
                    "Kmin {} B, Kmax {} B, Pmax {}: want Kmin <= Kmax and Pmax in 0..1",
                    e.kmin_bytes, e.kmax_bytes, e.pmax
                ),
            );
        }
        if !(self.rto_s > 0.0 && self.rto_s.is_finite()) {
            return bad(
                "packet.rto",
                format!("{} s: want a positive time", self.rto_s),
            );
        }
        if let Some(s) = self.sample_s
            && !(s > 0.0 && s.is_finite())
        {
            return bad("packet.sample", format!("{s} s: want a positive time"));
        }
        Ok(())
    }
}

/// A transfer between two GPUs, for [`simulate_flows`](crate::simulate_flows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flow {
    /// Sending GPU.
    pub from: usize,
    /// Receiving GPU.
    pub to: usize,
    /// Bytes.
    pub bytes: u64,
    /// When it starts, seconds.
    pub start_s: f64,
    /// Its QP's UDP source port (ECMP hashes it).
    pub sport: u16,
    /// NIC rail between servers (`None`: the receiver's own NIC).
    pub rail: Option<usize>,
}

/// Why the packet engine cannot run: the planner's error (a bad setting names its field as
/// `packet.FIELD`; schedules that cannot run are a replay error).
pub type PacketError = PlanError;

/// Every QP's state at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When, seconds.
    pub t_s: f64,
    /// Each QP's DCQCN rate (its line rate without DCQCN), bits per second.
    pub rate_bps: Vec<f64>,
    /// Each QP's goodput since the previous sample, bits per second.
    pub goodput_bps: Vec<f64>,
}

/// What a packet simulation saw.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PacketReport {
    /// When the last message was delivered, seconds.
    pub time_s: f64,
    /// Events processed (stale timers and superseded pause frames not counted).
    pub events: u64,
    /// Packets sent (retransmissions included).
    pub packets: u64,
    /// ACKs sent (with `acks`).
    pub acks: u64,
    /// Messages delivered.
    pub messages: usize,
    /// Payload bytes delivered across links.
    pub bytes: u64,
    /// Each job's completion time, seconds (for [`simulate_jobs`](crate::simulate_jobs)).
    pub job_time_s: Vec<f64>,
    /// Each explicit flow's completion time, seconds (for [`simulate_flows`](crate::simulate_flows)).
    pub flow_done_s: Vec<f64>,
    /// PFC pause frames sent.
    pub pauses: u64,
    /// Seconds each link spent paused, by link.
    pub paused_s: Vec<f64>,
    /// Packets marked CE.
    pub ecn_marks: u64,
    /// CNPs sent.
    pub cnps: u64,
    /// Packets dropped at full buffers.
    pub drops: u64,
    /// Largest egress queue, bytes.
    pub max_queue_bytes: u64,
    /// Largest buffer use of one switch, bytes.
    pub max_buffer_bytes: u64,
    /// Bytes each link carried on the wire, by link.
    pub link_bytes: Vec<u64>,
    /// QPs (rank pairs or flows) that sent across links.
    pub qps: usize,
    /// Most QPs whose path crosses one switch-to-switch link (ECMP collisions).
    pub max_qps_per_fabric_link: usize,
    /// Busy fraction of switch-to-switch links over the run, averaged over those links
    /// (`None` without such links).
    pub fabric_utilization: Option<f64>,
    /// Periodic samples, when asked for.
    pub samples: Vec<Sample>,
}

impl PacketReport {
    /// Links that were paused at some point.
    pub fn paused_links(&self) -> usize {
        self.paused_s.iter().filter(|&&s| s > 0.0).count()
    }
}
