//! Point-to-point receives from any of several peers: which one's message is first.

use std::os::fd::RawFd;
use std::time::Duration;

use nix::poll::PollFlags;

use super::spin_pause;
use crate::frame::{FRAME_CLOSE, FRAME_DATA};
use std::time::Instant;

use crate::error::{CclError, ErrorKind, Result};
use crate::frame::{FRAME_ABORT, HEADER_LEN, Header, P2P_CODE};

use super::abort::abort_error;
use super::ctx::lost;
use super::links::Links;
use super::sleep_on;

/// Waits until the link of one of `peers` holds a point-to-point frame header at its front,
/// and returns that peer and the header; nothing is consumed. A peer whose link holds
/// something else first (a later collective's frame, its goodbye) cannot send this message
/// now and is left out; with none left the wait fails. An abort frame is its sender's
/// error, a lost link names the peer, and `deadline` ends the wait with a timeout.
pub(crate) fn wait_p2p(
    links: &mut Links,
    peers: &[usize],
    deadline: Instant,
    spin: Duration,
    what: &str,
) -> Result<(usize, Header)> {
    let started = Instant::now();
    let waits = deadline.saturating_duration_since(started).as_millis();
    let mut live: Vec<usize> = peers.to_vec();
    let mut left_out: Vec<usize> = Vec::new();
    let mut round = 0u32;
    loop {
        let mut b = [0u8; HEADER_LEN];
        let mut i = 0;
        while i < live.len() {
            let p = live[i];
            if links.closed[p] {
                left_out.push(live.remove(i));
                continue;
            }
            let link = links.link(p)?;
            let n = link.peek(&mut b).map_err(|e| lost(p, what, &e))?;
            if n < HEADER_LEN {
                i += 1;
                continue;
            }
            match Header::decode(&b) {
                None => {
                    return Err(CclError::new(
                        ErrorKind::Mismatch,
                        format!("{what}: rank {p} sent bytes that are not a Monel frame"),
                    )
                    .with_ranks(vec![p]));
                }
                Some(h) if h.kind == FRAME_ABORT => {
                    let mut full = vec![0u8; HEADER_LEN + (h.len as usize).min(4096)];
                    let n = link.peek(&mut full).unwrap_or(0);
                    return Err(abort_error(p, what, &full[HEADER_LEN.min(n)..n]));
                }
                Some(h) if h.kind == FRAME_DATA && h.sig.coll == P2P_CODE => return Ok((p, h)),
                Some(h) => {
                    if h.kind == FRAME_CLOSE {
                        links.closed[p] = true;
                    }
                    left_out.push(live.remove(i));
                }
            }
        }
        if live.is_empty() {
            return Err(CclError::new(
                ErrorKind::Mismatch,
                format!(
                    "{what}: ranks {left_out:?} moved on to a collective or destroyed their \
                     communicator without sending it"
                ),
            )
            .with_ranks(left_out));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(CclError::new(
                ErrorKind::Timeout,
                format!("{what}: Timed out waiting {waits} ms for ranks {live:?}"),
            )
            .with_ranks(live));
        }
        if now - started < spin {
            spin_pause(round, 64);
            round = round.wrapping_add(1);
            continue;
        }
        let mut armed: Vec<(RawFd, PollFlags)> = Vec::new();
        let mut ready = false;
        for &p in &live {
            let l = links.link(p)?;
            match l.arm(true, false) {
                Some(f) => armed.push((l.fd(), f)),
                None => ready = true,
            }
        }
        if !ready {
            sleep_on(armed.iter().copied(), deadline - now);
        }
        for &p in &live {
            links.link(p)?.disarm();
        }
    }
}
