//! How the engine touches memory: through [`MemoryAccess`], which the verbs layer implements
//! over its registered regions. The engine never owns user memory.
//!
//! Every access names a key: local keys for the requester's scatter/gather lists and for
//! receive buffers, remote keys for what a peer asks. The implementation checks the key, the
//! bounds and the access flags on every call and touches nothing when a check fails.
//! Atomic targets are 64-bit little-endian words.

use core::fmt;
use core::ops::{BitAnd, BitOr};

use monel_wire::{LKey, RKey};

/// Memory region access flags (`ibv_access_flags`, same bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(pub u32);

#[allow(missing_docs)]
impl AccessFlags {
    pub const NONE: Self = Self(0);
    pub const LOCAL_WRITE: Self = Self(1);
    pub const REMOTE_WRITE: Self = Self(2);
    pub const REMOTE_READ: Self = Self(4);
    pub const REMOTE_ATOMIC: Self = Self(8);
    pub const ALL: Self = Self(15);

    /// True if every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}
impl BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, o: Self) -> Self {
        Self(self.0 | o.0)
    }
}
impl BitAnd for AccessFlags {
    type Output = Self;
    fn bitand(self, o: Self) -> Self {
        Self(self.0 & o.0)
    }
}
impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            "LOCAL_WRITE",
            "REMOTE_WRITE",
            "REMOTE_READ",
            "REMOTE_ATOMIC",
        ];
        let set: Vec<&str> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&set.join(" | "))
        }
    }
}

/// A key as the engine presents it to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// The requester's own SGEs or a receive buffer.
    Local(LKey),
    /// An access a peer asked for.
    Remote(RKey),
}

/// The kind of access being made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Local read (always allowed on a valid local key).
    LocalRead,
    /// Local write (needs LOCAL_WRITE).
    LocalWrite,
    /// Remote read (needs REMOTE_READ).
    RemoteRead,
    /// Remote write (needs REMOTE_WRITE).
    RemoteWrite,
    /// Remote atomic (needs REMOTE_ATOMIC).
    RemoteAtomic,
}

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemError {
    /// No valid region has this key.
    InvalidKey,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not allow this access.
    AccessDenied,
    /// The region is not in a state that allows this (e.g. invalidating a local-only key).
    InvalidState,
}

/// A 64-bit atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Store `swap` if the value equals `compare`.
    CompareSwap {
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Add `add` (wrapping).
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

impl AtomicOp {
    /// Applies the operation to an 8-byte little-endian word; returns the old value.
    ///
    /// # Panics
    /// If `word` is not 8 bytes long (callers check bounds first).
    pub fn apply(self, word: &mut [u8]) -> u64 {
        let old = u64::from_le_bytes(word.try_into().expect("an 8-byte word"));
        let new = match self {
            Self::CompareSwap { compare, swap } if old == compare => swap,
            Self::CompareSwap { .. } => old,
            Self::FetchAdd { add } => old.wrapping_add(add),
        };
        word.copy_from_slice(&new.to_le_bytes());
        old
    }
}

/// Memory as the engine sees it. Every method checks key, bounds and access before touching
/// anything.
pub trait MemoryAccess {
    /// Checks that `[addr, addr + len)` may be accessed with `key` for `access`.
    fn check(&self, key: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError>;
    /// Copies `out.len()` bytes at `addr` into `out` (access `LocalRead` or `RemoteRead`).
    fn read(&self, key: Key, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError>;
    /// Zero-copy sends: offers to lend the `len` bytes at `addr` (a local key) for bytes
    /// `at..at + len` of the payload of the packet being built, instead of copying them into
    /// it. An implementation that sends straight from registered memory checks the access
    /// as [`read`](Self::read) does, notes the range and returns `Ok(true)`, leaving those
    /// payload bytes of the packet buffer unwritten; the default declines (`Ok(false)`) and
    /// the bytes are copied.
    fn lend(&self, key: Key, addr: u64, len: usize, at: usize) -> Result<bool, MemError> {
        let _ = (key, addr, len, at);
        Ok(false)
    }
    /// Copies `data` to `addr` (access `LocalWrite` or `RemoteWrite`).
    fn write(&mut self, key: Key, addr: u64, data: &[u8], access: Access) -> Result<(), MemError>;
    /// Executes an atomic on the 8-byte little-endian word at `addr`; returns the old value.
    fn atomic(&mut self, rkey: RKey, addr: u64, op: AtomicOp) -> Result<u64, MemError>;
    /// Invalidates a remote key (SEND with invalidate).
    fn invalidate(&mut self, rkey: RKey) -> Result<(), MemError>;
}

/// A memory region of [`VecMemory`].
#[derive(Debug, Clone)]
pub struct Region {
    /// First address.
    pub addr: u64,
    /// Bytes.
    pub data: Vec<u8>,
    /// Local key.
    pub lkey: LKey,
    /// Remote key.
    pub rkey: RKey,
    /// Access flags.
    pub access: AccessFlags,
    /// False once invalidated.
    pub valid: bool,
}

/// Memory made of owned regions: what tests and the simulator use.
#[derive(Debug, Clone, Default)]
pub struct VecMemory {
    regions: Vec<Region>,
    next_addr: u64,
}

impl VecMemory {
    /// No regions.
    pub fn new() -> Self {
        Self {
            regions: Vec::new(),
            next_addr: 0x1000,
        }
    }
    /// Registers a zeroed region of `len` bytes with the given keys; returns its address.
    pub fn register(&mut self, len: usize, lkey: LKey, rkey: RKey, access: AccessFlags) -> u64 {
        let addr = self.next_addr;
        self.next_addr += (len as u64 + 0xfff) & !0xfff;
        self.next_addr += 0x1000; // a guard gap
        self.regions.push(Region {
            addr,
            data: vec![0; len],
            lkey,
            rkey,
            access,
            valid: true,
        });
        addr
    }
    /// The region holding `addr`.
    pub fn region(&self, addr: u64) -> Option<&Region> {
        self.regions
            .iter()
            .find(|r| addr >= r.addr && addr - r.addr < r.data.len() as u64)
    }
    /// Bytes at `addr`, bypassing keys (for tests and setup).
    pub fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let r = self.region(addr).expect("address in a region");
        let off = (addr - r.addr) as usize;
        &r.data[off..off + len]
    }
    /// Writable bytes at `addr`, bypassing keys (for tests and setup).
    pub fn bytes_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let r = self
            .regions
            .iter_mut()
            .find(|r| addr >= r.addr && addr - r.addr < r.data.len() as u64)
            .expect("address in a region");
        let off = (addr - r.addr) as usize;
        &mut r.data[off..off + len]
    }

    fn find(&self, key: Key) -> Option<usize> {
        self.regions.iter().position(|r| match key {
            Key::Local(k) => r.lkey == k,
            Key::Remote(k) => r.rkey == k && r.valid,
        })
    }

    fn locate(
        &self,
        key: Key,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(usize, usize), MemError> {
        let i = self.find(key).ok_or(MemError::InvalidKey)?;
        let r = &self.regions[i];
        let needed = match access {
            Access::LocalRead => AccessFlags::NONE,
            Access::LocalWrite => AccessFlags::LOCAL_WRITE,
            Access::RemoteRead => AccessFlags::REMOTE_READ,
            Access::RemoteWrite => AccessFlags::REMOTE_WRITE,
            Access::RemoteAtomic => AccessFlags::REMOTE_ATOMIC,
        };
        let remote = matches!(key, Key::Remote(_));
        let remote_access = matches!(
            access,
            Access::RemoteRead | Access::RemoteWrite | Access::RemoteAtomic
        );
        if remote != remote_access || !r.access.contains(needed) {
            return Err(MemError::AccessDenied);
        }
        let end = addr.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if addr < r.addr || end > r.addr + r.data.len() as u64 {
            return Err(MemError::OutOfBounds);
        }
        Ok((i, (addr - r.addr) as usize))
    }
}

impl MemoryAccess for VecMemory {
    fn check(&self, key: Key, addr: u64, len: u64, access: Access) -> Result<(), MemError> {
        self.locate(key, addr, len, access).map(|_| ())
    }
    fn read(&self, key: Key, addr: u64, out: &mut [u8], access: Access) -> Result<(), MemError> {
        let (i, off) = self.locate(key, addr, out.len() as u64, access)?;
        out.copy_from_slice(&self.regions[i].data[off..off + out.len()]);
        Ok(())
    }
    fn write(&mut self, key: Key, addr: u64, data: &[u8], access: Access) -> Result<(), MemError> {
        let (i, off) = self.locate(key, addr, data.len() as u64, access)?;
        self.regions[i].data[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn atomic(&mut self, rkey: RKey, addr: u64, op: AtomicOp) -> Result<u64, MemError> {
        let (i, off) = self.locate(Key::Remote(rkey), addr, 8, Access::RemoteAtomic)?;
        Ok(op.apply(&mut self.regions[i].data[off..off + 8]))
    }
    fn invalidate(&mut self, rkey: RKey) -> Result<(), MemError> {
        let i = self.find(Key::Remote(rkey)).ok_or(MemError::InvalidKey)?;
        self.regions[i].valid = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_keys_bounds_and_flags() {
        let mut m = VecMemory::new();
        let a = m.register(
            64,
            LKey(1),
            RKey(0x100),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        );
        assert_eq!(
            m.check(Key::Remote(RKey(0x100)), a, 64, Access::RemoteRead),
            Ok(())
        );
        assert_eq!(
            m.check(Key::Remote(RKey(0x100)), a, 65, Access::RemoteRead),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.check(Key::Remote(RKey(0x100)), a - 1, 1, Access::RemoteRead),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.check(Key::Remote(RKey(0x100)), u64::MAX, 2, Access::RemoteRead),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.write(Key::Remote(RKey(0x100)), a, &[1], Access::RemoteWrite),
            Err(MemError::AccessDenied)
        );
        assert_eq!(
            m.check(Key::Remote(RKey(0x101)), a, 1, Access::RemoteRead),
            Err(MemError::InvalidKey)
        );
        // A local key is not a remote key.
        assert_eq!(
            m.check(Key::Local(LKey(1)), a, 1, Access::RemoteRead),
            Err(MemError::AccessDenied)
        );
        assert_eq!(m.bytes(a, 4), &[0, 0, 0, 0]);
        m.invalidate(RKey(0x100)).unwrap();
        assert_eq!(
            m.check(Key::Remote(RKey(0x100)), a, 1, Access::RemoteRead),
            Err(MemError::InvalidKey)
        );
    }

    #[test]
    fn atomics_are_little_endian_words() {
        let mut m = VecMemory::new();
        let a = m.register(16, LKey(1), RKey(2), AccessFlags::REMOTE_ATOMIC);
        assert_eq!(m.atomic(RKey(2), a, AtomicOp::FetchAdd { add: 5 }), Ok(0));
        assert_eq!(
            m.atomic(
                RKey(2),
                a,
                AtomicOp::CompareSwap {
                    compare: 5,
                    swap: 9
                }
            ),
            Ok(5)
        );
        assert_eq!(
            m.atomic(
                RKey(2),
                a,
                AtomicOp::CompareSwap {
                    compare: 5,
                    swap: 1
                }
            ),
            Ok(9)
        );
        assert_eq!(m.bytes(a, 8), &9u64.to_le_bytes());
    }
}
