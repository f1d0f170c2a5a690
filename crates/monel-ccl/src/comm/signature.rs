//! A call's identity: the schedule cache key, and the signature in words for errors and
//! logs.

use std::hash::Hasher;

use monel_sched::dtype::{DataType, RedOp};
use monel_sched::plan::{Algorithm, CollectiveKind};

use crate::exec;
use crate::frame::Signature;

/// A call's shape: everything its schedule depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct SchedKey {
    pub(super) coll: u8,
    pub(super) op: u8,
    pub(super) root: usize,
    pub(super) algo: Algorithm,
    pub(super) count: usize,
    pub(super) slice: usize,
    pub(super) in_place: bool,
}

/// FNV-1a: the schedule cache's keys are a few small integers, hashed on every call.
#[derive(Default)]
pub(super) struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        if self.0 == 0 {
            self.0 = 0xcbf2_9ce4_8422_2325;
        }
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x100_0000_01b3).rotate_left(23);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
}

pub(super) fn describe_sig(s: &Signature) -> String {
    let kind = CollectiveKind::from_code(s.coll);
    if kind.is_none() && s.coll == exec::P2P_CODE {
        return if s.seq == 0 {
            format!("a send/recv group ({} bytes)", s.count)
        } else {
            format!(
                "send/recv message #{} of {} bytes, tag {}",
                s.seq,
                s.count,
                s.tag()
            )
        };
    }
    let coll = kind.map_or("an unknown operation", CollectiveKind::name);
    let dt = DataType::ALL
        .into_iter()
        .find(|t| t.code() == s.dtype)
        .map_or("?", DataType::name);
    let op = RedOp::ALL
        .into_iter()
        .find(|o| o.code() == s.op)
        .map_or("?", RedOp::name);
    let mut out = format!("{coll} #{} count {} {dt}", s.seq, s.count);
    if kind.is_some_and(CollectiveKind::has_op) {
        out += &format!(" op {op}");
    }
    if kind.is_some_and(CollectiveKind::has_root) {
        out += &format!(" root {}", s.root);
    }
    out
}
