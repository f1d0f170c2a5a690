//! Congestion control of a QP's sender: a rate limiter driven by CNPs.
//!
//! [`Controller`] is the interface; [`NoControl`] and [`Dcqcn`] implement it. The QP holds an
//! [`AnyController`] (enum dispatch, no allocation on the packet path).

mod dcqcn;

pub use dcqcn::{Dcqcn, DcqcnParams};

use crate::time::Instant;

/// A sender-side congestion controller. Rate-based (DCQCN) controllers pace; window-based ones
/// would bound bytes in flight. The engine asks before every data packet.
pub trait Controller {
    /// A data packet of `bytes` (wire bytes) left at `now`.
    fn on_sent(&mut self, now: Instant, bytes: usize);
    /// A CNP for this QP arrived at `now`.
    fn on_cnp(&mut self, now: Instant);
    /// The earliest time the next data packet may leave (pacing), if limited.
    fn next_send_time(&self) -> Option<Instant>;
    /// The controller's next internal deadline.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Runs internal timers due at `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// Current metrics.
    fn metrics(&self) -> ControllerMetrics;
}

/// What a controller reports.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ControllerMetrics {
    /// Current sending rate in bits per second (`None`: unlimited).
    pub rate_bps: Option<f64>,
    /// Target rate in bits per second.
    pub target_bps: Option<f64>,
    /// DCQCN's congestion estimate alpha.
    pub alpha: Option<f64>,
    /// CNPs seen.
    pub cnps: u64,
}

/// Which controller a QP uses.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum CongestionConfig {
    /// Send as fast as the window allows.
    #[default]
    None,
    /// DCQCN with these parameters.
    Dcqcn(DcqcnParams),
}

impl CongestionConfig {
    /// Builds the controller.
    pub fn build(&self) -> AnyController {
        match self {
            Self::None => AnyController::None(NoControl::default()),
            Self::Dcqcn(p) => AnyController::Dcqcn(Dcqcn::new(*p)),
        }
    }
}

/// No congestion control: never paces, counts CNPs.
#[derive(Debug, Clone, Default)]
pub struct NoControl {
    cnps: u64,
}

impl Controller for NoControl {
    fn on_sent(&mut self, _: Instant, _: usize) {}
    fn on_cnp(&mut self, _: Instant) {
        self.cnps += 1;
    }
    fn next_send_time(&self) -> Option<Instant> {
        None
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _: Instant) {}
    fn metrics(&self) -> ControllerMetrics {
        ControllerMetrics {
            cnps: self.cnps,
            ..Default::default()
        }
    }
}

/// One of the controllers, dispatched without a box.
#[allow(missing_docs)]
// One per QP, consulted on every data packet: kept inline rather than boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum AnyController {
    None(NoControl),
    Dcqcn(Dcqcn),
}

macro_rules! dispatch {
    ($self:ident, $c:ident => $e:expr) => {
        match $self {
            AnyController::None($c) => $e,
            AnyController::Dcqcn($c) => $e,
        }
    };
}

impl Controller for AnyController {
    fn on_sent(&mut self, now: Instant, bytes: usize) {
        dispatch!(self, c => c.on_sent(now, bytes))
    }
    fn on_cnp(&mut self, now: Instant) {
        dispatch!(self, c => c.on_cnp(now))
    }
    fn next_send_time(&self) -> Option<Instant> {
        dispatch!(self, c => c.next_send_time())
    }
    fn poll_timeout(&self) -> Option<Instant> {
        dispatch!(self, c => c.poll_timeout())
    }
    fn handle_timeout(&mut self, now: Instant) {
        dispatch!(self, c => c.handle_timeout(now))
    }
    fn metrics(&self) -> ControllerMetrics {
        dispatch!(self, c => c.metrics())
    }
}
