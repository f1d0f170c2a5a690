//! Protection domains and memory regions on an rdma-core device.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use monel_rc::AccessFlags;
use monel_wire::{LKey, RKey};

use super::ah::HwAh;
use super::ffi;
use super::qp::HwQp;
use super::raw::{RawCtx, RawPd};
use super::srq::HwSrq;
use crate::attr::{AhAttr, SrqAttr};
use crate::config::ContextConfig;
use crate::device::Device;
use crate::error::{ErrorKind, Result, VerbsError};
use crate::provider::{AhOps, MrOps, PdOps, QpInit, QpOps, SrqOps};

/// A protection domain on an rdma-core device.
#[derive(Debug)]
pub(crate) struct HwPd {
    raw: Arc<RawPd>,
    device: Device,
    config: ContextConfig,
}

impl HwPd {
    /// Allocates a PD; a failure (which the trait cannot return) leaves a null PD whose
    /// every verb then fails with the reason.
    pub(crate) fn alloc(ctx: &Arc<RawCtx>, device: &Device, config: &ContextConfig) -> Self {
        // SAFETY: the context is open.
        let pd = unsafe { (ctx.lib.alloc_pd)(ctx.ctx) };
        if pd.is_null() {
            tracing::warn!(
                "ibv_alloc_pd on {}: {}",
                device.name,
                std::io::Error::last_os_error()
            );
        }
        Self {
            raw: Arc::new(RawPd {
                ctx: ctx.clone(),
                pd,
            }),
            device: device.clone(),
            config: config.clone(),
        }
    }

    fn live(&self, verb: &'static str) -> Result<()> {
        if self.raw.pd.is_null() {
            return Err(VerbsError::new(
                verb,
                ErrorKind::Busy(format!(
                    "{}: the PD could not be allocated",
                    self.device.name
                )),
            ));
        }
        Ok(())
    }

    fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
        owned: Option<Mutex<Box<[u8]>>>,
    ) -> Result<Box<dyn MrOps>> {
        const V: &str = "ibv_reg_mr";
        self.live(V)?;
        if len == 0 {
            return Err(VerbsError::invalid(V, "a zero-length region"));
        }
        let lib = self.raw.ctx.lib;
        // SAFETY: the PD is live; `[ptr, ptr + len)` is the caller's valid memory (owned
        // buffers: a boxed slice this region keeps; raw: `reg_mr_raw`'s contract), pinned
        // by the kernel until `ibv_dereg_mr`.
        let mr = unsafe { (lib.reg_mr)(self.raw.pd, ptr.cast(), len, access.0 as i32) };
        if mr.is_null() {
            return Err(reg_error(len));
        }
        Ok(Box::new(HwMr {
            pd: self.raw.clone(),
            mr,
            addr: ptr as u64,
            len,
            access,
            owned,
        }))
    }
}

/// Why `ibv_reg_mr` of `len` bytes failed, naming the locked-memory limit when it is the
/// likely cause.
fn reg_error(len: usize) -> VerbsError {
    let e = std::io::Error::last_os_error();
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .map(|(soft, _)| soft)
        .unwrap_or(u64::MAX);
    if matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM))
        && limit != libc::RLIM_INFINITY
    {
        return VerbsError::new(
            "ibv_reg_mr",
            ErrorKind::InvalidArgument(format!(
                "registering {len} bytes failed ({e}): the locked-memory limit is {limit} \
                 bytes (ulimit -l); raise it (memlock in /etc/security/limits.conf, \
                 LimitMEMLOCK= for services, --ulimit memlock=-1 for containers)"
            )),
        );
    }
    VerbsError::io("ibv_reg_mr", e)
}

impl PdOps for HwPd {
    fn id(&self) -> u32 {
        if self.raw.pd.is_null() {
            return u32::MAX;
        }
        // SAFETY: a live PD.
        unsafe { (*self.raw.pd).handle }
    }

    fn reg_mr(&self, buf: Vec<u8>, access: AccessFlags) -> Result<Box<dyn MrOps>> {
        let mut buf = buf.into_boxed_slice();
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // The heap block does not move when the box moves into the mutex.
        self.register(ptr, len, access, Some(Mutex::new(buf)))
    }

    unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>> {
        self.register(ptr, len, access, None)
    }

    fn create_qp(&self, init: &QpInit<'_>) -> Result<Box<dyn QpOps>> {
        self.live("ibv_create_qp")?;
        Ok(Box::new(HwQp::create(
            &self.raw,
            &self.device,
            &self.config,
            init,
        )?))
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<Box<dyn SrqOps>> {
        self.live("ibv_create_srq")?;
        Ok(Box::new(HwSrq::create(&self.raw, attr)?))
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AhOps>> {
        self.live("ibv_create_ah")?;
        Ok(Arc::new(HwAh::create(
            &self.raw,
            attr,
            self.config.traffic_class(),
        )?))
    }
}

/// A memory region registered with the NIC.
pub(crate) struct HwMr {
    pd: Arc<RawPd>,
    mr: *mut ffi::ibv_mr,
    addr: u64,
    len: usize,
    access: AccessFlags,
    /// The buffer, for regions that own theirs.
    owned: Option<Mutex<Box<[u8]>>>,
}

impl std::fmt::Debug for HwMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HwMr({:#x}, {})", self.addr, self.len)
    }
}

// SAFETY: see `RawCtx`; the owned buffer is behind a mutex.
unsafe impl Send for HwMr {}
// SAFETY: as above.
unsafe impl Sync for HwMr {}

impl Drop for HwMr {
    fn drop(&mut self) {
        // SAFETY: registered by `HwPd::register`, deregistered once, before the owned buffer
        // (a field dropped after this runs) is freed.
        unsafe { (self.pd.ctx.lib.dereg_mr)(self.mr) };
    }
}

impl MrOps for HwMr {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> LKey {
        // SAFETY: a registered region.
        LKey(unsafe { (*self.mr).lkey })
    }
    fn rkey(&self) -> RKey {
        // SAFETY: a registered region.
        RKey(unsafe { (*self.mr).rkey })
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
    fn with(&self, f: &mut dyn FnMut(&mut [u8])) {
        match &self.owned {
            Some(m) => f(&mut m.lock().unwrap_or_else(PoisonError::into_inner)),
            None => {
                // SAFETY: `reg_mr_raw`'s contract: the memory stays valid and writable while
                // the region lives, and the caller does not race RDMA operations on it.
                let s = unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) };
                f(s)
            }
        }
    }
    fn lock(&self) -> Option<MutexGuard<'_, Box<[u8]>>> {
        self.owned
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
