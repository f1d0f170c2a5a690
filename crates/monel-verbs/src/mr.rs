//! Memory regions (`ibv_mr`): registered memory with its keys, and byte access to it.

use std::sync::MutexGuard;

use monel_rc::AccessFlags;
use monel_wire::{LKey, RKey};

use crate::error::{Result, VerbsError};
use crate::provider::MrOps;

/// A registered memory region (`ibv_mr`); dropping it deregisters it (`ibv_dereg_mr`):
/// once dropped, no packet can touch it and requests naming its keys fail with an access
/// error. Owned regions hold their buffer; read and write it with [`read`](Self::read),
/// [`write`](Self::write) or [`lock`](Self::lock).
#[derive(Debug)]
pub struct MemoryRegion {
    pub(crate) ops: Box<dyn MrOps>,
}

impl MemoryRegion {
    /// Start address (what SGEs and remote peers name).
    pub fn addr(&self) -> u64 {
        self.ops.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local key.
    pub fn lkey(&self) -> LKey {
        self.ops.lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> RKey {
        self.ops.rkey()
    }
    /// Access flags.
    pub fn access(&self) -> AccessFlags {
        self.ops.access()
    }
    /// An SGE covering `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> monel_rc::Sge {
        monel_rc::Sge {
            addr: self.addr() + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        }
    }
    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.bounds("mr_write", offset, data.len())?;
        self.with(|b| b[offset..offset + data.len()].copy_from_slice(data));
        Ok(())
    }
    /// Copies bytes at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.bounds("mr_read", offset, out.len())?;
        self.with(|b| out.copy_from_slice(&b[offset..offset + out.len()]));
        Ok(())
    }
    /// Runs `f` on the whole buffer. Do not call verbs from inside `f`: the progress engine
    /// may be waiting for this region.
    pub fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut f = Some(f);
        let mut out = None;
        self.ops.with(&mut |b| {
            if let Some(f) = f.take() {
                out = Some(f(b));
            }
        });
        out.expect("the provider runs the closure once")
    }
    /// The owned buffer, locked (None for raw registrations).
    pub fn lock(&self) -> Option<MutexGuard<'_, Box<[u8]>>> {
        self.ops.lock()
    }
    fn bounds(&self, verb: &'static str, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(VerbsError::invalid(
                verb,
                format!(
                    "{len} bytes at offset {offset} exceed the {}-byte region",
                    self.len()
                ),
            ));
        }
        Ok(())
    }
}
