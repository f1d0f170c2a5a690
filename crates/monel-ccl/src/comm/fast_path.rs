//! The two-rank tiny path: an AllReduce small enough to go as one frame each way,
//! without the executor.

use monel_sched::buffers::Buffers;
use monel_sched::dtype::RedOp;
use monel_sched::reduce;
use monel_sched::schedule::{Buf, Op, Schedule, Span, Step};

use super::{Communicator, describe_sig};
use crate::error::{CclError, Result};
use crate::frame::Signature;

/// Bytes per rank up to which a two-rank direct AllReduce takes
/// [`Communicator::tiny_pair`].
pub(super) const TINY: usize = 256;

/// Polls of the ring for the peer's frame before [`Communicator::tiny_pair`] hands the
/// call to the executor (tens of microseconds).
pub(super) const TINY_SPINS: u32 = 2000;

impl Communicator {
    /// A tiny AllReduce between two ranks by the direct algorithm, without the executor:
    /// the same frame as the schedule's goes out whole, and the peer's, if it is already
    /// there or comes within a short spin, is reduced straight out of the ring. The
    /// executor's general machinery cost more than the exchange itself: an 8-byte AllReduce
    /// went from 0.32 to 0.20 us on the 2-core development VM. Anything else (no frame yet, another frame first, an
    /// abort, a dead peer) goes to the executor with the rest of the schedule, which handles
    /// it as for every call. `None`: not taken and nothing sent (not a ring link, or no
    /// room in it), so the caller runs the whole schedule under the same `sig`.
    pub(super) fn tiny_pair(
        &mut self,
        sig: Signature,
        op: RedOp,
        count: usize,
        bufs: &mut Buffers<'_>,
    ) -> Option<Result<()>> {
        let peer = 1 - self.rank;
        let (input, output) = (
            Span::of(Buf::Input, 0..count),
            Span::of(Buf::Output, 0..count),
        );
        let dtype = bufs.dtype();
        let mut mine = [0u8; TINY];
        let bytes = {
            let src = bufs.bytes(input).ok()?;
            mine[..src.len()].copy_from_slice(src);
            src.len()
        };
        // Sent, then the peer's frame reduced where it lies.
        let mut landed = None;
        let yield_often = self.yield_every == 1;
        self.links.exchange_whole(
            peer,
            sig,
            &mine[..bytes],
            TINY_SPINS,
            yield_often,
            &mut |theirs| {
                landed = Some(bufs.bytes_mut(output).map(|out| {
                    reduce::reduce_to(out, &mine[..bytes], theirs, dtype, op);
                }));
            },
        )?;
        if matches!(landed, Some(Ok(()))) {
            self.tiny_done += 1;
        }
        let res = match landed {
            Some(Ok(())) if op == RedOp::Avg => bufs.divide(output).map_err(CclError::from),
            Some(r) => r.map_err(CclError::from),
            None => {
                // The executor takes it from here: the receive, then the average.
                let mut rest = Schedule::default();
                rest.steps.push(Step {
                    ops: vec![Op::RecvReduce {
                        peer,
                        acc: input,
                        dst: output,
                    }],
                });
                if op == RedOp::Avg {
                    rest.steps.push(Step {
                        ops: vec![Op::Divide { dst: output }],
                    });
                }
                self.execute(sig, &rest, bufs, None)
            }
        };
        tracing::info!(
            target: "monel::coll",
            "rank {}: {} via direct (two-rank tiny path)",
            self.rank,
            describe_sig(&sig)
        );
        Some(res)
    }
}
