//! Point-to-point: send, receive, and groups of them (`ncclGroupStart`/`End`). Receives
//! outside a group match by tag and may take any source (see `matching`).

use std::sync::PoisonError;

use monel_sched::buffers::Buffers;
use monel_sched::dtype::DataType;
use monel_sched::plan::{Call, Collective};
use monel_sched::schedule::{Buf, Op, Schedule, Span, Step};

use super::{Communicator, Io, part};
use crate::error::{CclError, ErrorKind, Result};
use crate::exec;
use crate::frame::Signature;

/// One operation of a [`Communicator::group`].
pub enum GroupOp<'a> {
    /// `ncclSend`.
    Send {
        /// The data.
        buf: &'a [u8],
        /// Elements.
        count: usize,
        /// Their type.
        dtype: DataType,
        /// Destination rank.
        peer: usize,
        /// The message's tag (0 where the caller has none).
        tag: u32,
    },
    /// `ncclRecv`.
    Recv {
        /// Where the data lands.
        buf: &'a mut [u8],
        /// Elements.
        count: usize,
        /// Their type.
        dtype: DataType,
        /// Source rank.
        peer: usize,
        /// The tag the message must carry: a receive in a group takes the next message
        /// from `peer`, unless one with this tag was set aside earlier, and fails loudly
        /// (a mismatch) if the next carries another tag.
        tag: u32,
    },
    /// A collective (as [`Communicator::collective`]), run after the group's sends and
    /// receives.
    Collective {
        /// Which.
        coll: Collective,
        /// Element type.
        dtype: DataType,
        /// Elements.
        count: usize,
        /// Buffers.
        io: Io<'a>,
    },
}

impl Communicator {
    /// Sends `count` elements of `buf` to `peer` (`ncclSend`). It returns once the data is
    /// on its way; a large message waits for `peer` to receive it, so two ranks that send to
    /// each other must do it in one [`Self::group`] (as with NCCL).
    pub fn send(&mut self, buf: &[u8], count: usize, dtype: DataType, peer: usize) -> Result<()> {
        self.send_tagged(buf, count, dtype, peer, 0)
    }

    /// As [`Self::send`], the message carrying `tag` (MPI's and torch's tags): a receive
    /// for another tag leaves it for its own.
    pub fn send_tagged(
        &mut self,
        buf: &[u8],
        count: usize,
        dtype: DataType,
        peer: usize,
        tag: u32,
    ) -> Result<()> {
        self.group(vec![GroupOp::Send {
            buf,
            count,
            dtype,
            peer,
            tag,
        }])
    }

    /// Receives `count` elements from `peer` into `buf` (`ncclRecv`): the first message
    /// from `peer` with tag 0. The counts must agree.
    pub fn recv(
        &mut self,
        buf: &mut [u8],
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        self.recv_tagged(buf, count, dtype, Some(peer), 0).map(drop)
    }

    /// Runs operations as one group (`ncclGroupStart` .. `ncclGroupEnd`): every send and
    /// receive progresses at once, so any exchange pattern completes (all-to-all, rings,
    /// sends to self matched with receives from self in order); the collectives then run in
    /// the order given.
    pub fn group(&mut self, ops: Vec<GroupOp<'_>>) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(CclError::new(
                ErrorKind::Aborted,
                format!("communicator failed earlier: {e}"),
            ));
        }
        let n = self.nranks;
        let mut sends: Vec<(usize, u32, &[u8])> = Vec::new();
        let mut recvs: Vec<(usize, u32, &mut [u8])> = Vec::new();
        let mut colls = Vec::new();
        // The message's bytes, once its peer and buffer are checked.
        let bytes_of = |what: &str, peer: usize, count: usize, dtype: DataType, len: usize| {
            if peer >= n {
                return Err(CclError::invalid(format!(
                    "{what}: peer {peer} is not a rank (0..{n})"
                )));
            }
            let bytes = count.saturating_mul(dtype.size());
            if len < bytes {
                return Err(CclError::invalid(format!(
                    "{what}: buffer has {len} bytes, {count} {dtype} elements need {bytes}"
                )));
            }
            Ok(bytes)
        };
        // Empty messages are no-ops on both sides (as in NCCL).
        for op in ops {
            match op {
                GroupOp::Send {
                    buf,
                    count,
                    dtype,
                    peer,
                    tag,
                } => {
                    let b = bytes_of("send", peer, count, dtype, buf.len())?;
                    if b > 0 {
                        sends.push((peer, tag, &buf[..b]));
                    }
                }
                GroupOp::Recv {
                    buf,
                    count,
                    dtype,
                    peer,
                    tag,
                } => {
                    let b = bytes_of("recv", peer, count, dtype, buf.len())?;
                    if b > 0 {
                        recvs.push((peer, tag, &mut buf[..b]));
                    }
                }
                GroupOp::Collective {
                    coll,
                    dtype,
                    count,
                    io,
                } => colls.push((coll, dtype, count, io)),
            }
        }
        // Messages set aside by earlier tagged receives come first.
        let mut waiting = Vec::with_capacity(recvs.len());
        for (peer, tag, buf) in recvs {
            if !self.take_stashed(peer, tag, buf)? {
                waiting.push((peer, tag, buf));
            }
        }
        if !sends.is_empty() || !waiting.is_empty() {
            self.point_to_point(sends, waiting)?;
        }
        for (coll, dtype, count, io) in colls {
            self.collective(Call::new(coll, dtype, count), io)?;
        }
        Ok(())
    }

    /// Runs a group's sends and receives (peer, tag, bytes) as one step.
    pub(super) fn point_to_point(
        &mut self,
        sends: Vec<(usize, u32, &[u8])>,
        recvs: Vec<(usize, u32, &mut [u8])>,
    ) -> Result<()> {
        let me = self.rank;
        let span = |buf, len| Span { buf, off: 0, len };
        let mut step = Vec::new();
        // Sends to self meet receives from self in order, as local copies.
        let self_recvs: Vec<usize> = (0..recvs.len()).filter(|&j| recvs[j].0 == me).collect();
        let mut self_sends = 0;
        for (i, (peer, tag, b)) in sends.iter().enumerate() {
            let src = span(Buf::SendPart(part(i)?), b.len());
            if *peer != me {
                step.push(Op::Send { peer: *peer, src });
                continue;
            }
            let Some(&j) = self_recvs.get(self_sends) else {
                return Err(CclError::invalid(format!(
                    "send to self (rank {me}) without a matching recv from self in the group"
                )));
            };
            self_sends += 1;
            if recvs[j].2.len() != b.len() || recvs[j].1 != *tag {
                return Err(CclError::invalid(format!(
                    "send to self of {} bytes, tag {tag}, meets a recv from self of {} bytes, tag {}",
                    b.len(),
                    recvs[j].2.len(),
                    recvs[j].1
                )));
            }
            step.push(Op::Copy {
                src,
                dst: span(Buf::RecvPart(part(j)?), b.len()),
            });
        }
        if self_sends != self_recvs.len() {
            return Err(CclError::invalid(format!(
                "recv from self (rank {me}) without a matching send to self in the group"
            )));
        }
        for (j, (peer, _, b)) in recvs.iter().enumerate() {
            if *peer != me {
                step.push(Op::Recv {
                    peer: *peer,
                    dst: span(Buf::RecvPart(part(j)?), b.len()),
                    reduce: false,
                });
            }
        }
        let total: usize = sends.iter().map(|s| s.2.len()).sum::<usize>()
            + recvs.iter().map(|r| r.2.len()).sum::<usize>();
        let send_tags: Vec<u32> = sends.iter().map(|s| s.1).collect();
        let recv_tags: Vec<u32> = recvs.iter().map(|r| r.1).collect();
        let sig = Signature {
            seq: 0,
            coll: exec::P2P_CODE,
            dtype: 0,
            op: 0,
            root: 0,
            count: total as u64,
            algo: 0,
        };
        {
            let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            st.sig = Some(sig);
            st.state = "running";
        }
        let sched = Schedule {
            steps: vec![Step { ops: step }],
            scratch: 0,
        };
        let mut bufs = Buffers::parts(
            sends.into_iter().map(|s| s.2).collect(),
            recvs.into_iter().map(|r| r.2).collect(),
            self.nranks,
        );
        let res = self.execute(sig, &sched, &mut bufs, Some((&send_tags, &recv_tags)));
        self.conclude(sig, res)
    }
}
