//! The rdma-core provider: kernel RDMA devices (hardware NICs, or Linux rxe) through
//! rdma-core's libibverbs, loaded at run time, behind the same verbs API as the soft RNIC.
//! Also what `monel doctor` reads: the library, and the kernel's devices, ports and GID
//! tables in sysfs.
//!
//! ```text
//!  HwContext / HwPd / HwQp / HwCq / HwSrq / HwMr / HwAh   the provider objects (ops)
//!     |  control path: libibverbs' exported verbs (loader)
//!     |  data path: the provider's ops table in ibv_context (post_send, poll_cq, ...)
//!     v
//!  ffi: the C ABI of <infiniband/verbs.h>, checked against the header by a test
//! ```

mod ah;
mod context;
pub(crate) mod counters;
mod cq;
pub mod device;
pub mod ffi;
pub mod loader;
mod pd;
mod qp;
mod raw;
mod srq;
pub mod sysfs;

pub(crate) use context::HwContext;
