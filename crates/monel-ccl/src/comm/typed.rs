//! Collectives over typed slices: the element type names the [`DataType`] and the slices'
//! lengths the count, so no caller turns its numbers into bytes by hand.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let (n, rank) = (2, 0);
//! use monel_ccl::{CommConfig, Communicator, RedOp, UniqueId};
//! let id = UniqueId::create("127.0.0.1:0".parse()?)?;
//! let mut comm = Communicator::init_rank(n, rank, &id, CommConfig::default())?;
//! let send = [1.0f32, 2.0, 3.0];
//! let mut recv = [0.0f32; 3];
//! comm.all_reduce_slice(&send, &mut recv, RedOp::Sum)?;
//! # Ok(()) }
//! ```

use bytemuck::Pod;
use half::{bf16, f16};

use super::Communicator;
use crate::error::{CclError, Result};
use monel_sched::{DataType, RedOp};

mod sealed {
    pub trait Sealed {}
}

/// A Rust type Monel's collectives carry and reduce, with the [`DataType`] it stands for
/// (the FP8 types have no Rust type: use the byte API with [`DataType::F8E4M3`] and
/// [`DataType::F8E5M2`]).
pub trait Element: Pod + sealed::Sealed {
    /// The data type of this element type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}

element!(
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    f16 => F16, bf16 => Bf16, f32 => F32, f64 => F64,
);

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// `count` when `len` is `ranks` times it, else an error naming `what`.
fn per_rank(len: usize, ranks: usize, what: &str) -> Result<usize> {
    if ranks == 0 || len % ranks != 0 {
        return Err(CclError::invalid(format!(
            "{what} has {len} elements, not a multiple of the {ranks} ranks"
        )));
    }
    Ok(len / ranks)
}

impl Communicator {
    /// AllReduce of `send` into `recv` (the same length).
    pub fn all_reduce_slice<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
    ) -> Result<()> {
        let count = send.len();
        self.all_reduce(bytes(send), bytes_mut(recv), count, T::DTYPE, op)
    }

    /// AllReduce in place.
    pub fn all_reduce_slice_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: RedOp,
    ) -> Result<()> {
        let count = buf.len();
        self.all_reduce_in_place(bytes_mut(buf), count, T::DTYPE, op)
    }

    /// Broadcast of the root's `buf` to every rank's, in place.
    pub fn broadcast_slice<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let count = buf.len();
        self.broadcast_in_place(bytes_mut(buf), count, T::DTYPE, root)
    }

    /// Reduce of every rank's `send` into the root's `recv` (read at the root only).
    pub fn reduce_slice<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        let count = send.len();
        self.reduce(bytes(send), bytes_mut(recv), count, T::DTYPE, op, root)
    }

    /// AllGather: every rank's `send`, in rank order, into `recv` (ranks x `send.len()`).
    pub fn all_gather_slice<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = send.len();
        self.all_gather(bytes(send), bytes_mut(recv), count, T::DTYPE)
    }

    /// ReduceScatter: `send` (ranks x `recv.len()`) reduced, each rank keeping its part.
    pub fn reduce_scatter_slice<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
    ) -> Result<()> {
        let count = recv.len();
        self.reduce_scatter(bytes(send), bytes_mut(recv), count, T::DTYPE, op)
    }

    /// AlltoAll: `send`'s `j`-th part (of ranks equal parts) goes to rank `j`, and rank
    /// `j`'s part for this rank lands in `recv`'s `j`-th.
    pub fn all_to_all_slice<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = per_rank(send.len(), self.size(), "all_to_all's send")?;
        self.all_to_all(bytes(send), bytes_mut(recv), count, T::DTYPE)
    }
}
