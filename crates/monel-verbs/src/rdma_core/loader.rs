//! rdma-core's libibverbs, loaded at run time (`dlopen("libibverbs.so.1")`, as NCCL's
//! ibvwrap does): one binary runs on machines with and without rdma-core, and a machine
//! without it learns why in one line.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_void};

use libloading::Library;

/// The library's file name (its ABI: rdma-core has kept `.so.1` since 2017).
pub const LIBIBVERBS: &str = "libibverbs.so.1";

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;

/// Most devices read from one list.
const MAX_DEVICES: usize = 256;

/// libibverbs, loaded, with the entry points Monel uses.
#[derive(Debug)]
pub struct Libibverbs {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    // Declared last: the function pointers above point into it.
    _lib: Library,
}

impl Libibverbs {
    /// Loads libibverbs; the error says why it could not be (not installed, or a symbol
    /// missing).
    pub fn load() -> Result<Self, String> {
        // SAFETY: loading libibverbs runs its initialisers, which only set up its own state
        // (rdma-core's library constructors read config files and register providers).
        let lib = unsafe { Library::new(LIBIBVERBS) }.map_err(|e| {
            format!("{LIBIBVERBS} not loaded ({e}); install rdma-core's libibverbs1")
        })?;
        // SAFETY: each symbol is looked up with the C signature rdma-core's verbs.h gives it
        // (stable since IBVERBS_1.1), and the pointers are used only while `_lib` lives.
        unsafe {
            let get_device_list = *lib
                .get::<GetDeviceList>(b"ibv_get_device_list\0")
                .map_err(|e| format!("{LIBIBVERBS}: {e}"))?;
            let free_device_list = *lib
                .get::<FreeDeviceList>(b"ibv_free_device_list\0")
                .map_err(|e| format!("{LIBIBVERBS}: {e}"))?;
            let get_device_name = *lib
                .get::<GetDeviceName>(b"ibv_get_device_name\0")
                .map_err(|e| format!("{LIBIBVERBS}: {e}"))?;
            Ok(Self {
                get_device_list,
                free_device_list,
                get_device_name,
                _lib: lib,
            })
        }
    }

    /// The names of the devices libibverbs finds (those with a user-space provider); the
    /// error carries the OS error it gave (no kernel support, say).
    pub fn device_names(&self) -> Result<Vec<String>, String> {
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
