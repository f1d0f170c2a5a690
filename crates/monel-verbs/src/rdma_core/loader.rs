//! rdma-core's libibverbs, loaded at run time (`dlopen("libibverbs.so.1")`, as NCCL's
//! ibvwrap does): one binary runs on machines with and without rdma-core, and a machine
//! without it learns why in one line.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};
use std::sync::OnceLock;

use libloading::Library;

use super::ffi;

/// The library's file name (its ABI: rdma-core has kept `.so.1` since 2017).
pub(crate) const LIBIBVERBS: &str = "libibverbs.so.1";

/// Most devices read from one list.
const MAX_DEVICES: usize = 256;

macro_rules! entry_points {
    ($($field:ident: $ty:ident = $sym:literal,)*) => {
        /// libibverbs, loaded, with the entry points Monel uses.
        pub(crate) struct Libibverbs {
            $(pub(crate) $field: ffi::$ty,)*
            // Declared last: the function pointers above point into it.
            _lib: Library,
        }

        impl Libibverbs {
            /// Loads libibverbs; the error says why it could not be (not installed, or a
            /// symbol missing).
            pub(crate) fn load() -> Result<Self, String> {
                // SAFETY: loading libibverbs runs its initialisers, which only set up its
                // own state (rdma-core's library constructors read config files and
                // register providers).
                let lib = unsafe { Library::new(LIBIBVERBS) }.map_err(|e| {
                    format!("{LIBIBVERBS} not loaded ({e}); install rdma-core's libibverbs1")
                })?;
                // SAFETY: each symbol is looked up with the C signature rdma-core's
                // verbs.h gives it (the default version, IBVERBS_1.1), and the pointers
                // are used only while `_lib` lives.
                unsafe {
                    Ok(Self {
                        $($field: *lib
                            .get::<ffi::$ty>($sym)
                            .map_err(|e| format!("{LIBIBVERBS}: {e}"))?,)*
                        _lib: lib,
                    })
                }
            }
        }
    };
}

entry_points! {
    get_device_list: GetDeviceList = b"ibv_get_device_list\0",
    free_device_list: FreeDeviceList = b"ibv_free_device_list\0",
    get_device_name: GetDeviceName = b"ibv_get_device_name\0",
    open_device: OpenDevice = b"ibv_open_device\0",
    close_device: CloseDevice = b"ibv_close_device\0",
    query_port: QueryPort = b"ibv_query_port\0",
    query_gid: QueryGid = b"ibv_query_gid\0",
    alloc_pd: AllocPd = b"ibv_alloc_pd\0",
    dealloc_pd: DeallocPd = b"ibv_dealloc_pd\0",
    reg_mr: RegMr = b"ibv_reg_mr\0",
    dereg_mr: DeregMr = b"ibv_dereg_mr\0",
    create_comp_channel: CreateCompChannel = b"ibv_create_comp_channel\0",
    destroy_comp_channel: DestroyCompChannel = b"ibv_destroy_comp_channel\0",
    create_cq: CreateCq = b"ibv_create_cq\0",
    destroy_cq: DestroyCq = b"ibv_destroy_cq\0",
    get_cq_event: GetCqEvent = b"ibv_get_cq_event\0",
    ack_cq_events: AckCqEvents = b"ibv_ack_cq_events\0",
    create_qp: CreateQp = b"ibv_create_qp\0",
    modify_qp: ModifyQp = b"ibv_modify_qp\0",
    query_qp: QueryQp = b"ibv_query_qp\0",
    destroy_qp: DestroyQp = b"ibv_destroy_qp\0",
    create_srq: CreateSrq = b"ibv_create_srq\0",
    modify_srq: ModifySrq = b"ibv_modify_srq\0",
    query_srq: QuerySrq = b"ibv_query_srq\0",
    destroy_srq: DestroySrq = b"ibv_destroy_srq\0",
    create_ah: CreateAh = b"ibv_create_ah\0",
    destroy_ah: DestroyAh = b"ibv_destroy_ah\0",
    get_async_event: GetAsyncEvent = b"ibv_get_async_event\0",
    ack_async_event: AckAsyncEvent = b"ibv_ack_async_event\0",
}

impl std::fmt::Debug for Libibverbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Libibverbs")
    }
}

impl Libibverbs {
    /// The process's one copy, loaded on first use (the error, why not, is kept too).
    pub(crate) fn shared() -> Result<&'static Self, String> {
        static LIB: OnceLock<Result<Libibverbs, String>> = OnceLock::new();
        LIB.get_or_init(Self::load).as_ref().map_err(Clone::clone)
    }

    /// The names of the devices libibverbs finds (those with a user-space provider); the
    /// error carries the OS error it gave (no kernel support, say).
    pub(crate) fn device_names(&self) -> Result<Vec<String>, String> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below, once, and no device
        // pointer outlives it.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(format!(
                "ibv_get_device_list: {}",
                std::io::Error::last_os_error()
            ));
        }
        let count = usize::try_from(n).unwrap_or(0).min(MAX_DEVICES);
        let mut names = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: the list holds `n` device pointers, then NULL; `i < n`.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: `dev` is a device of the live list; the name is a NUL-terminated
            // string it owns, copied out before the list is freed.
            let name = unsafe { (self.get_device_name)(dev) };
            if !name.is_null() {
                // SAFETY: non-null and NUL-terminated, as above.
                names.push(
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        // SAFETY: the list came from `ibv_get_device_list` and is freed once.
        unsafe { (self.free_device_list)(list) };
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever this machine has: either libibverbs loads and lists devices (none, or an
    /// error saying why, on a kernel without RDMA), or the error names the library.
    #[test]
    fn libibverbs_loads_or_says_why() {
        match Libibverbs::load() {
            Ok(l) => match l.device_names() {
                Ok(names) => assert!(names.iter().all(|n| !n.is_empty())),
                Err(e) => assert!(e.starts_with("ibv_get_device_list: "), "{e}"),
            },
            Err(e) => assert!(e.contains(LIBIBVERBS), "{e}"),
        }
    }
}
