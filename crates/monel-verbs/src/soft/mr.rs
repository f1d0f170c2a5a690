//! The soft RNIC's memory regions and the key table the engine reads and writes through.
//!
//! Keys are random 32-bit values from the OS generator, never sequential and never reused
//! while registered; L_Key and R_Key differ. Every engine access goes through
//! [`PdMemory`], which checks key, protection domain, bounds and access flags first.
//! Deregistration removes the keys under the device lock, so once `dereg` returns no packet
//! can touch the region; later requests naming it fail with an access error.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use monel_rc::AccessFlags;
use monel_rc::memory::{Access, AtomicOp, Key, MemError, MemoryAccess};
use monel_wire::{LKey, RKey};

use super::idmap::IdMap;
use crate::provider::MrOps;

/// Where a region's bytes live.
pub(crate) enum Backing {
    /// A buffer the region owns.
    Owned(Mutex<Box<[u8]>>),
    /// Caller memory registered through [`crate::ProtectionDomain::reg_mr_raw`].
    Raw { ptr: usize, len: usize },
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Owned(_) => f.write_str("Owned"),
            Self::Raw { ptr, len } => write!(f, "Raw({ptr:#x}, {len})"),
        }
    }
}

/// The shared state of one registered region.
#[derive(Debug)]
pub(crate) struct MrShared {
    pub(crate) pd: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: AccessFlags,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) backing: Backing,
}

impl MrShared {
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match &self.backing {
            Backing::Owned(m) => f(&mut m.lock().unwrap_or_else(PoisonError::into_inner)),
            Backing::Raw { ptr, len } => {
                // SAFETY: `reg_mr_raw`'s contract: [ptr, ptr + len) stays valid and writable
                // until the region is deregistered, and the caller does not access it
                // concurrently with RDMA operations on it (as with hardware RDMA). The engine
                // only calls this while the region is in the key table, under the device lock.
                #[allow(unsafe_code)]
                let s = unsafe { std::slice::from_raw_parts_mut(*ptr as *mut u8, *len) };
                f(s)
            }
        }
    }
}

/// A region's bytes, held for reading while a batch of packets is sent straight from them.
pub(crate) enum MrView<'a> {
    Owned(MutexGuard<'a, Box<[u8]>>),
    Raw(&'a [u8]),
}

impl MrView<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Owned(g) => g,
            Self::Raw(s) => s,
        }
    }
}

impl MrShared {
    /// Holds the region's bytes for reading (its lock, for an owned buffer).
    pub(crate) fn view(&self) -> MrView<'_> {
        match &self.backing {
            Backing::Owned(m) => MrView::Owned(m.lock().unwrap_or_else(PoisonError::into_inner)),
            Backing::Raw { ptr, len } => {
                // SAFETY: as in `with`: `reg_mr_raw`'s contract keeps [ptr, ptr + len) valid
                // while the region is registered, and the engine holds views only under the
                // key table's lock, which deregistration needs.
                #[allow(unsafe_code)]
                let s = unsafe { std::slice::from_raw_parts(*ptr as *const u8, *len) };
                MrView::Raw(s)
            }
        }
    }
}

/// Bytes of a region lent to a packet being sent (see [`MemoryAccess::lend`]): `len` bytes
/// at `off` in the region fill bytes `at..at + len` of the packet's payload.
#[derive(Debug, Clone)]
pub(crate) struct Lent {
    pub(crate) mr: Arc<MrShared>,
    pub(crate) off: usize,
    pub(crate) len: usize,
    pub(crate) at: usize,
}

/// Pieces shorter than this are copied into the packet rather than lent: an iovec and a
/// region lock at send time cost more than copying a few hundred bytes.
pub(crate) const LEND_MIN: usize = 512;

/// A registered region of the soft RNIC; deregisters on drop.
#[derive(Debug)]
pub(crate) struct SoftMr {
    pub(crate) shared: Arc<MrShared>,
    pub(crate) table: Arc<Mutex<MrTable>>,
}

impl MrOps for SoftMr {
    fn addr(&self) -> u64 {
        self.shared.addr
    }
    fn len(&self) -> usize {
        self.shared.len as usize
    }
    fn lkey(&self) -> LKey {
        LKey(self.shared.lkey)
    }
    fn rkey(&self) -> RKey {
        RKey(self.shared.rkey)
    }
    fn access(&self) -> AccessFlags {
        self.shared.access
    }
    fn with(&self, f: &mut dyn FnMut(&mut [u8])) {
        self.shared.with(f);
    }
    fn lock(&self) -> Option<MutexGuard<'_, Box<[u8]>>> {
        match &self.shared.backing {
            Backing::Owned(m) => Some(m.lock().unwrap_or_else(PoisonError::into_inner)),
            Backing::Raw { .. } => None,
        }
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(self.shared.lkey, self.shared.rkey);
    }
}

/// All registered regions of one device, by key.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    by_lkey: IdMap<Arc<MrShared>>,
    by_rkey: IdMap<Arc<MrShared>>,
}

/// Draws a random key that is neither 0 nor in `taken`.
pub(crate) fn random_key(taken: impl Fn(u32) -> bool) -> u32 {
    loop {
        let mut b = [0u8; 4];
        getrandom::getrandom(&mut b).expect("OS random generator");
        let k = u32::from_ne_bytes(b);
        if k != 0 && !taken(k) {
            return k;
        }
    }
}

impl MrTable {
    /// Keys not in use as either an L_Key or an R_Key.
    pub(crate) fn fresh_keys(&self) -> (u32, u32) {
        let used = |k: u32| self.by_lkey.contains_key(&k) || self.by_rkey.contains_key(&k);
        let l = random_key(used);
        let r = random_key(|k| used(k) || k == l);
        (l, r)
    }
    pub(crate) fn insert(&mut self, mr: Arc<MrShared>) {
        self.by_lkey.insert(mr.lkey, mr.clone());
        self.by_rkey.insert(mr.rkey, mr);
    }
    pub(crate) fn remove(&mut self, lkey: u32, rkey: u32) {
        self.by_lkey.remove(&lkey);
        self.by_rkey.remove(&rkey);
    }
    pub(crate) fn len(&self) -> usize {
        self.by_lkey.len()
    }
}

/// The engine's view of memory for a QP: only the regions of its protection domain.
pub(crate) struct PdMemory<'a> {
    pub(crate) table: &'a mut MrTable,
    pub(crate) pd: u32,
    /// Where lent payload ranges are noted; `None`: payloads are copied.
    pub(crate) lends: Option<&'a RefCell<Vec<Lent>>>,
}

impl PdMemory<'_> {
    fn find(
        &self,
        key: Key,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<&Arc<MrShared>, MemError> {
        let mr = match key {
            Key::Local(k) => self.table.by_lkey.get(&k.0),
            Key::Remote(k) => self.table.by_rkey.get(&k.0),
        }
        .filter(|m| m.pd == self.pd)
        .ok_or(MemError::InvalidKey)?;
        let need = match access {
            Access::LocalRead => AccessFlags::NONE,
            Access::LocalWrite => AccessFlags::LOCAL_WRITE,
            Access::RemoteRead => AccessFlags::REMOTE_READ,
            Access::RemoteWrite => AccessFlags::REMOTE_WRITE,
            Access::RemoteAtomic => AccessFlags::REMOTE_ATOMIC,
        };
        let local_key = matches!(key, Key::Local(_));
        let remote_access = !matches!(access, Access::LocalRead | Access::LocalWrite);
        if local_key == remote_access {
            return Err(MemError::AccessDenied);
        }
        if !mr.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let end = addr.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if addr < mr.addr || end > mr.addr + mr.len {
            return Err(MemError::OutOfBounds);
        }
        Ok(mr)
    }
}

impl MemoryAccess for PdMemory<'_> {
    fn check(&self, key: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.find(key, addr, len, access).map(|_| ())
    }
    fn read(&self, key: Key, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        let mr = self.find(key, addr, out.len() as u64, access)?;
        let off = (addr - mr.addr) as usize;
        mr.with(|b| out.copy_from_slice(&b[off..off + out.len()]));
        Ok(())
    }
    fn lend(&self, key: Key, addr: u64, len: usize, at: usize) -> Result<bool, MemError> {
        let Some(lends) = self.lends.filter(|_| len >= LEND_MIN) else {
            return Ok(false);
        };
        let mr = self.find(key, addr, len as u64, Access::LocalRead)?;
        lends.borrow_mut().push(Lent {
            mr: mr.clone(),
            off: (addr - mr.addr) as usize,
            len,
            at,
        });
        Ok(true)
    }
    fn write(&mut self, key: Key, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        let mr = self.find(key, addr, data.len() as u64, access)?;
        let off = (addr - mr.addr) as usize;
        mr.with(|b| b[off..off + data.len()].copy_from_slice(data));
        Ok(())
    }
    fn atomic(&mut self, rkey: RKey, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        let mr = self.find(Key::Remote(rkey), addr, 8, Access::RemoteAtomic)?;
        let off = (addr - mr.addr) as usize;
        Ok(mr.with(|b| op.apply(&mut b[off..off + 8])))
    }
    fn invalidate(&mut self, rkey: RKey) -> Result<(), MemError> {
        // Only memory windows and fast-registered MRs may be remotely invalidated; plain
        // MRs refuse, as on hardware.
        match self.table.by_rkey.get(&rkey.0) {
            Some(m) if m.pd == self.pd => Err(MemError::InvalidState),
            _ => Err(MemError::InvalidKey),
        }
    }
}
