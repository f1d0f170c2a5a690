//! The handles of libibverbs objects every provider object shares: the open context and the
//! protection domain, each freed after the last object made from it; and how libibverbs
//! reports errors.
#![allow(unsafe_code)]

use std::sync::Arc;

use super::ffi;
use super::loader::Libibverbs;
use crate::error::VerbsError;

/// An error of `verb` from a libibverbs return code: a positive errno, or -1 with errno set.
pub(crate) fn os_error(verb: &'static str, rc: i32) -> VerbsError {
    let e = if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        std::io::Error::last_os_error()
    };
    VerbsError::io(verb, e)
}

/// The context pointer, closed when the last object made from it is gone.
#[derive(Debug)]
pub(crate) struct RawCtx {
    pub(crate) lib: &'static Libibverbs,
    pub(crate) ctx: *mut ffi::ibv_context,
    pub(crate) port: u8,
}

// SAFETY: libibverbs contexts and every object made from them may be used from any thread
// (rdma-core's providers lock what they share); Monel never hands out the raw pointer.
unsafe impl Send for RawCtx {}
// SAFETY: as above.
unsafe impl Sync for RawCtx {}

impl Drop for RawCtx {
    fn drop(&mut self) {
        // SAFETY: opened by `HwContext::open`, closed once, after every object made from it
        // (each holds an `Arc<RawCtx>`).
        unsafe { (self.lib.close_device)(self.ctx) };
    }
}

/// The PD pointer, deallocated after every object made in it.
#[derive(Debug)]
pub(crate) struct RawPd {
    pub(crate) ctx: Arc<RawCtx>,
    pub(crate) pd: *mut ffi::ibv_pd,
}

// SAFETY: see `RawCtx`: libibverbs objects may be used from any thread.
unsafe impl Send for RawPd {}
// SAFETY: as above.
unsafe impl Sync for RawPd {}

impl Drop for RawPd {
    fn drop(&mut self) {
        if !self.pd.is_null() {
            // SAFETY: allocated by `HwPd::alloc`, freed once, after every object made in it.
            unsafe { (self.ctx.lib.dealloc_pd)(self.pd) };
        }
    }
}

/// Sets `O_NONBLOCK` on a file descriptor libibverbs owns.
pub(crate) fn set_nonblocking(fd: i32) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor the context keeps open for its whole life.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
