//! A barrier that names the ranks that did not arrive (torch's `monitored_barrier`, as Gloo
//! runs it): every other rank reports to rank 0, which waits for all of them within the
//! timeout and then releases them; a rank that misses the timeout is named, and the others
//! learn that rank 0 gave up.

use std::time::{Duration, Instant};

use super::Communicator;
use crate::error::{CclError, ErrorKind, Result};
use crate::frame::Signature;

/// The tag of the barrier's messages (kept out of users' way at the top of the range).
pub const MONITORED_BARRIER_TAG: u32 = 0xffff_ff01;

impl Communicator {
    /// Waits until every rank arrives, or fails within `timeout` naming the ranks that did
    /// not: on rank 0, the first of them in rank order, or all of them (`wait_all`); on the
    /// others, that rank 0 did not release them. Either failure fails the communicator, as
    /// a timed-out collective does.
    pub fn monitored_barrier(&mut self, timeout: Duration, wait_all: bool) -> Result<()> {
        let (me, n) = (self.rank, self.nranks);
        let deadline = Instant::now() + timeout;
        let ms = timeout.as_millis();
        let sig = Signature::p2p(0, 1, MONITORED_BARRIER_TAG);
        let mut byte = [0u8; 1];
        if me != 0 {
            let res = self
                .send_tagged(
                    &[1],
                    1,
                    monel_sched::dtype::DataType::U8,
                    0,
                    MONITORED_BARRIER_TAG,
                )
                .and_then(|()| {
                    self.recv_matching(&mut byte, &[0], MONITORED_BARRIER_TAG, deadline)
                });
            return match res {
                Ok(_) => Ok(()),
                Err(e) => {
                    let e = CclError::new(
                        e.kind.clone(),
                        format!(
                            "Rank {me} successfully reached monitoredBarrier, but received \
                             errors while waiting for send/recv from rank 0. Please check \
                             rank 0 logs for faulty rank. ({e})"
                        ),
                    )
                    .with_ranks(vec![0]);
                    self.conclude(sig, Err(e))
                }
            };
        }
        let mut waiting: Vec<usize> = (1..n).collect();
        while !waiting.is_empty() {
            match self.recv_matching(&mut byte, &waiting, MONITORED_BARRIER_TAG, deadline) {
                Ok(p) => waiting.retain(|&q| q != p),
                // Not arrived in time, gone, or moved on to other calls: failed to pass.
                Err(e)
                    if matches!(
                        e.kind,
                        ErrorKind::Timeout | ErrorKind::Mismatch | ErrorKind::PeerLost
                    ) =>
                {
                    let message = if timeout.is_zero() {
                        format!("Rank 0 timed out in monitoredBarrier after {ms} ms.")
                    } else if wait_all && waiting.len() > 1 {
                        let list: Vec<String> = waiting.iter().map(usize::to_string).collect();
                        format!(
                            "Ranks {} failed to pass monitoredBarrier in {ms} ms",
                            list.join(", ")
                        )
                    } else {
                        format!(
                            "Rank {} failed to pass monitoredBarrier in {ms} ms",
                            waiting[0]
                        )
                    };
                    let e = CclError::new(ErrorKind::Timeout, message).with_ranks(waiting);
                    return self.conclude(sig, Err(e));
                }
                Err(e) => return self.conclude(sig, Err(e)),
            }
        }
        for p in 1..n {
            self.send_tagged(
                &[1],
                1,
                monel_sched::dtype::DataType::U8,
                p,
                MONITORED_BARRIER_TAG,
            )?;
        }
        Ok(())
    }

    /// Sets how long each later blocking call may wait (the communicator's `MONEL_TIMEOUT`;
    /// torch's per-call timeouts set it around one call).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.cfg.timeout = timeout;
    }
}
