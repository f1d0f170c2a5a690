//! The memory a schedule runs on: the user's buffers (separate or in place) and scratch,
//! addressed by [`Span`]s, with the local operations (copy, reduce, divide) every executor
//! shares.

use std::ops::Range;

use crate::dtype::{DataType, RedOp};
use crate::error::{Result, SchedError};
use crate::reduce::{divide, reduce_into, reduce_to};
use crate::schedule::{Buf, Span};
use monel_copy::copy;

/// Where a span's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mem {
    /// The separate, read-only input.
    In,
    /// The user's mutable buffer (output, or the single buffer in place).
    User,
    Scratch,
    /// A point-to-point group's send buffer.
    SendPart(usize),
    /// A point-to-point group's receive buffer.
    RecvPart(usize),
}

/// One rank's buffers for one collective.
pub struct Buffers<'a> {
    input: Option<&'a [u8]>,
    user: &'a mut [u8],
    /// In place: where `Input` starts inside `user` (bytes).
    input_off: usize,
    /// Where `Output` starts inside `user` (bytes).
    output_off: usize,
    scratch: Vec<u8>,
    send_parts: Vec<&'a [u8]>,
    recv_parts: Vec<&'a mut [u8]>,
    dtype: DataType,
    op: RedOp,
    nranks: usize,
}

impl<'a> Buffers<'a> {
    /// Out of place: `input` and `output` are separate.
    pub fn separate(
        input: &'a [u8],
        output: &'a mut [u8],
        dtype: DataType,
        op: RedOp,
        nranks: usize,
    ) -> Self {
        Self {
            input: Some(input),
            user: output,
            input_off: 0,
            output_off: 0,
            scratch: Vec::new(),
            send_parts: Vec::new(),
            recv_parts: Vec::new(),
            dtype,
            op,
            nranks,
        }
    }
    /// In place: one buffer, with the input and output starting at these element offsets.
    pub fn in_place(
        buf: &'a mut [u8],
        input_elem: usize,
        output_elem: usize,
        dtype: DataType,
        op: RedOp,
        nranks: usize,
    ) -> Self {
        let es = dtype.size();
        Self {
            input: None,
            user: buf,
            input_off: input_elem * es,
            output_off: output_elem * es,
            scratch: Vec::new(),
            send_parts: Vec::new(),
            recv_parts: Vec::new(),
            dtype,
            op,
            nranks,
        }
    }
    /// A point-to-point group's buffers, in bytes: [`Buf::SendPart`] `i` is `sends[i]`,
    /// [`Buf::RecvPart`] `i` is `recvs[i]`.
    pub fn parts(sends: Vec<&'a [u8]>, recvs: Vec<&'a mut [u8]>, nranks: usize) -> Self {
        Self {
            input: None,
            user: &mut [],
            input_off: 0,
            output_off: 0,
            scratch: Vec::new(),
            send_parts: sends,
            recv_parts: recvs,
            dtype: DataType::U8,
            op: RedOp::Sum,
            nranks,
        }
    }
    /// Uses `v` as scratch space (a buffer kept from an earlier call; its contents do not
    /// matter).
    pub fn with_scratch(mut self, v: Vec<u8>) -> Self {
        self.scratch = v;
        self
    }
    /// Hands the scratch space back, for the next call.
    pub fn take_scratch(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.scratch)
    }
    /// Makes room for `elems` scratch elements.
    pub fn reserve_scratch(&mut self, elems: usize) {
        let need = elems * self.dtype.size();
        if self.scratch.len() < need {
            self.scratch.resize(need, 0);
        }
    }
    /// Element size in bytes.
    pub fn elem(&self) -> usize {
        self.dtype.size()
    }
    /// The reduction (`combine` form: avg accumulates as sum).
    pub fn op(&self) -> RedOp {
        self.op.combine()
    }
    /// The data type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    fn locate(&self, s: Span) -> Result<(Mem, Range<usize>)> {
        let es = self.dtype.size();
        let (mem, base, limit) = match (s.buf, self.input) {
            (Buf::Input, Some(i)) => (Mem::In, 0, i.len()),
            (Buf::Input, None) => (Mem::User, self.input_off, self.user.len()),
            (Buf::Output, _) => (Mem::User, self.output_off, self.user.len()),
            (Buf::Scratch, _) => (Mem::Scratch, 0, self.scratch.len()),
            (Buf::SendPart(i), _) => {
                let i = usize::from(i);
                let len = self.send_parts.get(i).map(|p| p.len());
                (Mem::SendPart(i), 0, len.ok_or_else(|| no_part(s))?)
            }
            (Buf::RecvPart(i), _) => {
                let i = usize::from(i);
                let len = self.recv_parts.get(i).map(|p| p.len());
                (Mem::RecvPart(i), 0, len.ok_or_else(|| no_part(s))?)
            }
        };
        let start = base + s.off * es;
        let end = start + s.len * es;
        if end > limit {
            return Err(SchedError::internal(format!(
                "{s:?} is outside its buffer ({limit} bytes)"
            )));
        }
        Ok((mem, start..end))
    }

    /// The bytes of `s`.
    pub fn bytes(&self, s: Span) -> Result<&[u8]> {
        let (m, r) = self.locate(s)?;
        Ok(match m {
            Mem::In => &self.input.expect("located")[r],
            Mem::User => &self.user[r],
            Mem::Scratch => &self.scratch[r],
            Mem::SendPart(i) => &self.send_parts[i][r],
            Mem::RecvPart(i) => &self.recv_parts[i][r],
        })
    }

    /// The bytes of `s`, writable (never the separate input).
    pub fn bytes_mut(&mut self, s: Span) -> Result<&mut [u8]> {
        let (m, r) = self.locate(s)?;
        match m {
            Mem::In | Mem::SendPart(_) => Err(SchedError::internal(
                "a schedule writes to the read-only input",
            )),
            Mem::User => Ok(&mut self.user[r]),
            Mem::Scratch => Ok(&mut self.scratch[r]),
            Mem::RecvPart(i) => Ok(&mut self.recv_parts[i][r]),
        }
    }

    /// Runs `f(src, dst)` on two spans; the same memory twice is a no-op, overlapping memory
    /// a schedule bug.
    fn pair(&mut self, src: Span, dst: Span, f: impl FnOnce(&[u8], &mut [u8])) -> Result<()> {
        let (sm, sr) = self.locate(src)?;
        let (dm, dr) = self.locate(dst)?;
        if sr.len() != dr.len() {
            return Err(SchedError::internal("spans of different lengths"));
        }
        if sm == dm {
            if sr == dr {
                return Ok(());
            }
            if sr.start < dr.end && dr.start < sr.end {
                return Err(SchedError::internal("overlapping local operation"));
            }
            let buf: &mut [u8] = match dm {
                Mem::User => self.user,
                Mem::Scratch => &mut self.scratch,
                Mem::RecvPart(i) => self.recv_parts[i],
                Mem::In | Mem::SendPart(_) => {
                    return Err(SchedError::internal(
                        "a schedule writes to the read-only input",
                    ));
                }
            };
            if sr.start < dr.start {
                let (a, b) = buf.split_at_mut(dr.start);
                f(&a[sr], &mut b[..dr.len()]);
            } else {
                let (a, b) = buf.split_at_mut(sr.start);
                f(&b[..sr.len()], &mut a[dr]);
            }
            return Ok(());
        }
        // Different memories: borrow them separately.
        match (sm, dm) {
            (Mem::In, Mem::User) => f(&self.input.expect("located")[sr], &mut self.user[dr]),
            (Mem::In, Mem::Scratch) => f(&self.input.expect("located")[sr], &mut self.scratch[dr]),
            (Mem::User, Mem::Scratch) => f(&self.user[sr], &mut self.scratch[dr]),
            (Mem::Scratch, Mem::User) => f(&self.scratch[sr], &mut self.user[dr]),
            (Mem::SendPart(i), Mem::RecvPart(j)) => {
                f(&self.send_parts[i][sr], &mut self.recv_parts[j][dr]);
            }
            _ => {
                return Err(SchedError::internal(
                    "a schedule writes to the read-only input",
                ));
            }
        }
        Ok(())
    }

    /// `dst = src`.
    pub fn copy(&mut self, src: Span, dst: Span) -> Result<()> {
        self.pair(src, dst, |s, d| copy(d, s))
    }
    /// `dst = dst op src`.
    pub fn reduce(&mut self, src: Span, dst: Span) -> Result<()> {
        let (t, op) = (self.dtype, self.op());
        self.pair(src, dst, |s, d| reduce_into(d, s, t, op))
    }
    /// `dst /= nranks`.
    pub fn divide(&mut self, dst: Span) -> Result<()> {
        let (t, n) = (self.dtype, self.nranks);
        divide(self.bytes_mut(dst)?, t, n);
        Ok(())
    }
    /// `dst = acc op incoming` (`acc` may be `dst`).
    pub fn land_onto(&mut self, acc: Span, dst: Span, incoming: &[u8]) -> Result<()> {
        if acc.len * self.dtype.size() != incoming.len() {
            return Err(SchedError::internal("message of the wrong length"));
        }
        if self.locate(acc)? == self.locate(dst)? {
            return self.land(dst, incoming, true);
        }
        let (t, op) = (self.dtype, self.op());
        self.pair(acc, dst, |a, d| reduce_to(d, a, incoming, t, op))
    }
    /// `dst = dst op incoming` (or a copy).
    pub fn land(&mut self, dst: Span, incoming: &[u8], reduce: bool) -> Result<()> {
        let (t, op) = (self.dtype, self.op());
        let d = self.bytes_mut(dst)?;
        if d.len() != incoming.len() {
            return Err(SchedError::internal("message of the wrong length"));
        }
        if reduce {
            reduce_into(d, incoming, t, op);
        } else {
            copy(d, incoming);
        }
        Ok(())
    }
}

fn no_part(s: Span) -> SchedError {
    SchedError::internal(format!("{s:?}: no such part in this group"))
}
