//! DCQCN reaction point (sender), NVIDIA-NIC flavour.
//!
//! Equations (Zhu et al., SIGCOMM 2015, with the knobs and defaults of NVIDIA/Mellanox NICs):
//! * first CNP: alpha = 1, RC = RT = min(RC, rate_on_first_cnp);
//! * alpha, every `alpha_period`: alpha = (1 - g) alpha + g if a CNP arrived in the period,
//!   else alpha = (1 - g) alpha (computed lazily, so idle periods cost nothing);
//! * rate cut, at most once per `rate_reduce_period`, when CNPs arrived: RT = RC (if clamping
//!   applies), RC = max(min_rate, RC (1 - alpha / 2)), counters reset;
//! * rate increase on each timer event (`time_reset`) and byte-counter event (`byte_reset`):
//!   fast recovery RC = (RT + RC) / 2 while max(T, BC) < F; hyper increase RT += R_HAI when
//!   min(T, BC) > F; additive increase RT += R_AI otherwise; then RC = (RT + RC) / 2.
//!
//! Pacing: each data packet delays the next by `bytes * 8 / RC`, at the RC in force when the
//! next one is due (so a recovering rate shortens a pending gap); a sender behind schedule
//! catches up for at most `pacing_slack`.

use core::time::Duration;
use std::sync::Arc;

use super::{Controller, ControllerMetrics};
use crate::time::{Instant, earliest};

/// DCQCN parameters. [`Default`] gives NVIDIA-NIC defaults for a 100 Gb/s port.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnParams {
    /// Line rate in bits per second.
    pub line_rate_bps: f64,
    /// EWMA gain g (NVIDIA `dce_tcp_g` 1019/1024 fixed point: g = 5/1024).
    pub g: f64,
    /// Alpha update period (NVIDIA `dce_tcp_rtt`: 1 us).
    pub alpha_period: Duration,
    /// Alpha after the first CNP (NVIDIA `initial_alpha_value` 1023/1023).
    pub initial_alpha: f64,
    /// Minimum time between rate cuts (NVIDIA `rate_reduce_monitor_period`: 4 us).
    pub rate_reduce_period: Duration,
    /// Rate set on the first CNP, capped by the current rate (NVIDIA
    /// `rate_to_set_on_first_cnp`: 85 Gb/s on a 100 Gb/s port).
    pub rate_on_first_cnp_bps: f64,
    /// Lowest rate (NVIDIA `rpg_min_rate`: 1 Mb/s).
    pub min_rate_bps: f64,
    /// Largest cut as a fraction (NVIDIA `rpg_min_dec_fac` 50%: at most halve).
    pub max_decrease: f64,
    /// Set RT = RC on every cut (NVIDIA `clamp_tgt_rate`: false).
    pub clamp_target_rate: bool,
    /// Set RT = RC on a cut after a timer increase (NVIDIA `clamp_tgt_rate_after_time_inc`: true).
    pub clamp_target_after_time_inc: bool,
    /// Rate-increase timer (NVIDIA `rpg_time_reset`: 300 us).
    pub time_reset: Duration,
    /// Rate-increase byte counter (NVIDIA `rpg_byte_reset` 32767 x 64 B).
    pub byte_reset: u64,
    /// Fast-recovery threshold F (NVIDIA `rpg_threshold`: 1).
    pub threshold: u32,
    /// Additive increase step (NVIDIA `rpg_ai_rate`: 5 Mb/s).
    pub rate_ai_bps: f64,
    /// Hyper increase step (NVIDIA `rpg_hai_rate`: 50 Mb/s).
    pub rate_hai_bps: f64,
    /// Notification point: minimum time between CNPs a receiver sends per QP
    /// (mlx5 `np_min_time_between_cnps`: 4 us).
    pub cnp_interval: Duration,
    /// How far behind schedule the pacer may catch up in a burst (a token bucket's depth in
    /// time). A sender that wakes late for its next packet (a software timer) sends what
    /// it owes for up to this long instead of losing the time; an idle one banks no more.
    pub pacing_slack: Duration,
}

impl Default for DcqcnParams {
    fn default() -> Self {
        Self {
            line_rate_bps: 100e9,
            g: 5.0 / 1024.0,
            alpha_period: Duration::from_micros(1),
            initial_alpha: 1.0,
            rate_reduce_period: Duration::from_micros(4),
            rate_on_first_cnp_bps: 85e9,
            min_rate_bps: 1e6,
            max_decrease: 0.5,
            clamp_target_rate: false,
            clamp_target_after_time_inc: true,
            time_reset: Duration::from_micros(300),
            byte_reset: 32767 * 64,
            threshold: 1,
            rate_ai_bps: 5e6,
            rate_hai_bps: 50e6,
            cnp_interval: Duration::from_micros(4),
            pacing_slack: Duration::from_micros(50),
        }
    }
}

impl DcqcnParams {
    /// Defaults scaled to another line rate (steps and first-CNP rate in proportion).
    pub fn for_line_rate(bps: f64) -> Self {
        let d = Self::default();
        let k = bps / d.line_rate_bps;
        Self {
            line_rate_bps: bps,
            rate_on_first_cnp_bps: d.rate_on_first_cnp_bps * k,
            rate_ai_bps: d.rate_ai_bps * k,
            rate_hai_bps: d.rate_hai_bps * k,
            ..d
        }
    }
}

/// DCQCN rate limiter state for one QP.
#[derive(Debug, Clone)]
pub struct Dcqcn {
    /// Shared: many QPs of one device (or one simulation) keep one copy hot in cache.
    p: Arc<DcqcnParams>,
    rc: f64,
    rt: f64,
    alpha: f64,
    active: bool,
    cnp_in_alpha_period: bool,
    alpha_updated: Instant,
    cnp_pending: bool,
    next_cut_allowed: Instant,
    cut_at: Option<Instant>,
    increase_at: Option<Instant>,
    time_inc_since_cut: bool,
    bytes: u64,
    t_stage: u32,
    bc_stage: u32,
    last_sent_at: Instant,
    last_sent_bytes: usize,
    cnps: u64,
}

impl Dcqcn {
    /// A controller sending at line rate until the first CNP.
    pub fn new(p: DcqcnParams) -> Self {
        Self::shared(Arc::new(p))
    }

    /// Like [`Dcqcn::new`], with parameters shared by other controllers.
    pub fn shared(p: Arc<DcqcnParams>) -> Self {
        Self {
            rc: p.line_rate_bps,
            rt: p.line_rate_bps,
            alpha: p.initial_alpha,
            active: false,
            cnp_in_alpha_period: false,
            alpha_updated: Instant::ZERO,
            cnp_pending: false,
            next_cut_allowed: Instant::ZERO,
            cut_at: None,
            increase_at: None,
            time_inc_since_cut: false,
            bytes: 0,
            t_stage: 0,
            bc_stage: 0,
            last_sent_at: Instant::ZERO,
            last_sent_bytes: 0,
            cnps: 0,
            p,
        }
    }

    /// Current rate in bits per second.
    pub fn rate_bps(&self) -> f64 {
        self.rc
    }

    fn update_alpha(&mut self, now: Instant) {
        let period = self.p.alpha_period.as_nanos().max(1) as u64;
        let elapsed = now.as_nanos().saturating_sub(self.alpha_updated.as_nanos());
        let k = elapsed / period;
        if k == 0 {
            return;
        }
        let g = self.p.g;
        let mut decays = k;
        if self.cnp_in_alpha_period {
            self.alpha = (1.0 - g) * self.alpha + g;
            self.cnp_in_alpha_period = false;
            decays -= 1;
        }
        if decays > 0 {
            self.alpha *= (1.0 - g).powi(decays.min(i32::MAX as u64) as i32);
        }
        self.alpha_updated = Instant::from_nanos(self.alpha_updated.as_nanos() + k * period);
    }

    fn cut(&mut self, now: Instant) {
        self.update_alpha(now);
        if self.p.clamp_target_rate
            || (self.p.clamp_target_after_time_inc && self.time_inc_since_cut)
        {
            self.rt = self.rc;
        }
        let factor = (1.0 - self.alpha / 2.0).max(1.0 - self.p.max_decrease);
        self.rc = (self.rc * factor).max(self.p.min_rate_bps);
        self.t_stage = 0;
        self.bc_stage = 0;
        self.bytes = 0;
        self.time_inc_since_cut = false;
        self.cnp_pending = false;
        self.next_cut_allowed = now + self.p.rate_reduce_period;
        self.cut_at = None;
        self.increase_at = Some(now + self.p.time_reset);
    }

    fn increase(&mut self) {
        let f = self.p.threshold;
        if self.t_stage.max(self.bc_stage) < f {
            // Fast recovery: towards the target.
        } else if self.t_stage.min(self.bc_stage) > f {
            self.rt += self.p.rate_hai_bps;
        } else {
            self.rt += self.p.rate_ai_bps;
        }
        self.rt = self.rt.min(self.p.line_rate_bps);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.p.line_rate_bps);
        if self.rc >= self.p.line_rate_bps * 0.999_999 && !self.cnp_pending {
            // Back at line rate: go quiet until the next CNP.
            self.rc = self.p.line_rate_bps;
            self.active = false;
            self.increase_at = None;
        }
    }
}

impl Controller for Dcqcn {
    fn on_sent(&mut self, now: Instant, bytes: usize) {
        // Pacing continues from when this packet was due, so a late wake-up is made up in a
        // burst, but never from earlier than `pacing_slack` ago, so an idle sender banks
        // little credit.
        let due = self.next_send_time().unwrap_or(now);
        let floor = now
            .as_nanos()
            .saturating_sub(self.p.pacing_slack.as_nanos() as u64);
        self.last_sent_at = Instant::from_nanos(due.as_nanos().max(floor));
        self.last_sent_bytes = bytes;
        if self.active {
            self.bytes += bytes as u64;
            if self.bytes >= self.p.byte_reset {
                self.bytes -= self.p.byte_reset;
                self.increase();
                self.bc_stage += 1;
            }
        }
    }

    fn on_cnp(&mut self, now: Instant) {
        self.cnps += 1;
        self.update_alpha(now);
        if !self.active {
            self.active = true;
            self.alpha = self.p.initial_alpha;
            self.alpha_updated = now;
            self.rc = self.rc.min(self.p.rate_on_first_cnp_bps);
            self.rt = self.rc;
            self.next_cut_allowed = now;
        }
        self.cnp_in_alpha_period = true;
        self.cnp_pending = true;
        if now >= self.next_cut_allowed {
            self.cut(now);
        } else {
            self.cut_at = Some(self.next_cut_allowed);
        }
    }

    fn next_send_time(&self) -> Option<Instant> {
        // Computed from the current rate, so a rate increase shortens a pending gap.
        if self.last_sent_bytes == 0 {
            return None;
        }
        let gap_ns = (self.last_sent_bytes as f64 * 8.0 * 1e9 / self.rc) as u64;
        Some(Instant::from_nanos(self.last_sent_at.as_nanos() + gap_ns))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        earliest(self.cut_at, self.increase_at)
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.cut_at.is_some_and(|t| t <= now) {
            self.cut_at = None;
            if self.cnp_pending {
                self.cut(now);
            }
        }
        if let Some(t) = self.increase_at.filter(|t| *t <= now) {
            self.increase_at = Some(t + self.p.time_reset);
            self.time_inc_since_cut = true;
            self.increase();
            self.t_stage += 1;
        }
    }

    fn metrics(&self) -> ControllerMetrics {
        ControllerMetrics {
            rate_bps: Some(self.rc),
            target_bps: Some(self.rt),
            alpha: Some(self.alpha),
            cnps: self.cnps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Instant {
        Instant::from_micros(n)
    }

    #[test]
    fn first_cnp_cuts_by_half_then_recovers() {
        let mut d = Dcqcn::new(DcqcnParams::default());
        assert_eq!(d.rate_bps(), 100e9);
        d.on_cnp(us(10));
        // alpha = 1: RC = 85G x (1 - 1/2).
        assert!((d.rate_bps() - 42.5e9).abs() < 1.0, "{}", d.rate_bps());
        // A second CNP within 4 us is deferred to the end of the period.
        d.on_cnp(us(11));
        assert_eq!(d.poll_timeout(), Some(us(14)));
        d.handle_timeout(us(14));
        let after_two = d.rate_bps();
        assert!((21.25e9..42.5e9).contains(&after_two), "{after_two}");
        // Without CNPs, a sender that keeps sending climbs back: timer and byte-counter
        // events, fast recovery, then additive and hyper increase, until line rate.
        let mut now = us(14);
        let mut last = d.rate_bps();
        while d.rate_bps() < 100e9 && now < Instant::from_nanos(2_000_000_000) {
            d.on_sent(now, 65536);
            let next = d.next_send_time().unwrap();
            while let Some(t) = d.poll_timeout().filter(|t| *t <= next) {
                d.handle_timeout(t);
            }
            assert!(d.rate_bps() >= last, "never decreases without CNPs");
            last = d.rate_bps();
            now = next;
        }
        assert_eq!(d.rate_bps(), 100e9, "recovered by {now:?}");
        assert_eq!(d.poll_timeout(), None, "quiet at line rate");
    }

    #[test]
    fn alpha_decays_without_cnps() {
        let mut d = Dcqcn::new(DcqcnParams::default());
        d.on_cnp(us(0));
        let a0 = d.metrics().alpha.unwrap();
        d.update_alpha(us(1000));
        let a1 = d.metrics().alpha.unwrap();
        let g = 5.0 / 1024.0;
        let expect = ((1.0 - g) * a0 + g) * (1.0 - g).powi(999);
        assert!((a1 - expect).abs() < 1e-12, "{a1} vs {expect}");
    }

    #[test]
    fn pacing_spaces_packets_by_rate() {
        let mut d = Dcqcn::new(DcqcnParams::for_line_rate(8e9));
        d.on_sent(us(0), 1000);
        assert_eq!(d.next_send_time(), Some(Instant::from_nanos(1000)));
        d.on_sent(Instant::from_nanos(1000), 1000);
        assert_eq!(d.next_send_time(), Some(Instant::from_nanos(2000)));
    }

    #[test]
    fn a_late_sender_catches_up_within_the_slack_only() {
        let p = DcqcnParams {
            pacing_slack: Duration::from_micros(10),
            ..DcqcnParams::for_line_rate(8e9)
        };
        let mut d = Dcqcn::new(p);
        // 1000 B at 8 Gb/s: one packet per microsecond.
        d.on_sent(us(0), 1000);
        // Woken 5 us late: the schedule continues from when the packet was due, so the
        // next four are due at once (a burst), not a microsecond after each wake-up.
        d.on_sent(us(6), 1000);
        assert_eq!(d.next_send_time(), Some(us(2)));
        for _ in 0..4 {
            d.on_sent(us(6), 1000);
        }
        assert_eq!(d.next_send_time(), Some(us(6)));
        d.on_sent(us(6), 1000);
        assert_eq!(d.next_send_time(), Some(us(7)), "caught up: paced again");
        // Idle for a millisecond: at most 10 us of credit.
        d.on_sent(us(1000), 1000);
        assert_eq!(d.next_send_time(), Some(us(991)));
    }
}
