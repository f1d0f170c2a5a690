//! What rdma-core and the kernel offer on this machine: libibverbs loaded at run time, and
//! the kernel's RDMA devices, ports and GID tables. The groundwork of a hardware provider
//! under Monel's verbs API (which today always opens the soft RNIC) and of `monel doctor`.

pub mod loader;
pub mod sysfs;
