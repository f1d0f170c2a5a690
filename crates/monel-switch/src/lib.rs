//! A software Ethernet switch for testing RoCEv2 across network namespaces.
//!
//! The kernels this project runs on have no netem and no ECN-marking qdisc, so the impaired
//! path between namespaces is a forwarding hop of our own: the switch owns one end of a veth
//! pair per namespace and forwards whole Ethernet frames between them through AF_PACKET
//! sockets. Each egress port is the network simulator's link model
//! ([`monel_netsim::Port`]): a drop-tail queue drained at a configured rate, RED-style ECN
//! marking by queue depth (DCQCN's congestion point), a propagation delay, and seeded loss,
//! reordering, duplication and corruption. UDP is impaired; ARP, neighbour discovery and TCP
//! (connection setup) pass untouched.
//!
//! [`forwarding::Switch`] is the logic, sans-IO and deterministic; [`run`] is the I/O loop.

pub mod forwarding;
pub mod packet_socket;

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

pub use forwarding::{PortCounters, Switch};
pub use monel_netsim::{EcnConfig, LinkConfig, LinkStats};
pub use packet_socket::PacketSocket;

/// The longest the loop sleeps without checking the stop flag.
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Frames read from one port before the others get a turn.
const RX_BURST: usize = 64;

/// Forwards between `ports` (interface names) until `stop` is set, and returns the switch so
/// its counters can be read. `link` shapes every egress port; `seed` seeds the faults.
pub fn run(ports: &[String], link: LinkConfig, seed: u64, stop: &AtomicBool) -> io::Result<Switch> {
    let socks = ports
        .iter()
        .map(|p| PacketSocket::open(p))
        .collect::<io::Result<Vec<_>>>()?;
    // Delays of microseconds need a timer that fires when asked.
    let _ = nix::sys::prctl::set_timerslack(1_000);
    let mut sw = Switch::new(socks.len(), link, seed);
    let start = Instant::now();
    let mut buf = vec![0u8; 65536];
    let mut tx_overruns = 0u64;
    let mut fds: Vec<PollFd<'_>> = socks
        .iter()
        .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN))
        .collect();
    while !stop.load(Ordering::Relaxed) {
        let now = start.elapsed();
        while let Some((p, f)) = sw.poll_egress(now) {
            if !socks[p].send(&f)? {
                tx_overruns += 1;
            }
        }
        let sleep = match sw.poll_timeout() {
            Some(t) => t.saturating_sub(start.elapsed()).min(MAX_SLEEP),
            None => MAX_SLEEP,
        };
        match ppoll(&mut fds, Some(TimeSpec::from_duration(sleep)), None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        for (i, (s, fd)) in socks.iter().zip(&fds).enumerate() {
            if fd.revents().is_none_or(|r| r.is_empty()) {
                continue;
            }
            for _ in 0..RX_BURST {
                match s.recv(&mut buf)? {
                    Some(n) => sw.ingress(start.elapsed(), i, buf[..n].to_vec()),
                    None => break,
                }
            }
        }
    }
    if tx_overruns > 0 {
        eprintln!("monel switch: {tx_overruns} frames dropped by full interface queues");
    }
    Ok(sw)
}

/// A human-readable table of every port's counters.
pub fn report(sw: &Switch, ports: &[String]) -> String {
    let mut s = String::from(
        "port          rx_frames     rx_udp   tx_udp  tx_other    lost  q_drops  ce_marked reordered  dup  max_queue_B\n",
    );
    for (i, name) in ports.iter().enumerate().take(sw.ports()) {
        let c = sw.counters(i);
        let e = sw.egress_stats(i);
        s.push_str(&format!(
            "{name:<12} {:>10} {:>10} {:>8} {:>9} {:>7} {:>8} {:>10} {:>9} {:>4} {:>12}\n",
            c.rx_frames,
            c.rx_udp,
            e.tx_packets,
            c.tx_bypass,
            e.lost,
            e.overflow_drops,
            e.ecn_marked,
            e.reordered,
            e.duplicated,
            e.max_queue
        ));
    }
    s
}
