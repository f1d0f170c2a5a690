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
mod ffi;
mod loader;
mod pd;
mod qp;
mod raw;
mod srq;
pub mod sysfs;

pub(crate) use context::HwContext;

/// Whether rdma-core's libibverbs loads (`Err`: why not) and, when it does, the devices it
/// lists (or why listing them failed), for `monel doctor`.
pub fn library_devices() -> Result<Result<Vec<String>, String>, String> {
    loader::Libibverbs::load().map(|l| l.device_names())
}
