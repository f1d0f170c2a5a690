//! Symmetric memory windows: their allocation, and collectives that run directly
//! between the ranks' windows.

use std::sync::Arc;
use std::time::Instant;

use monel_sched::dtype::{DataType, RedOp};
use monel_sched::plan::Call;
use monel_sched::tune::TransportKind;

use super::{Communicator, describe_sig};
use crate::error::{CclError, ErrorKind, Result};
use crate::transport::{self};
use crate::window::{self, Loc, Region, Window};

impl Communicator {
    /// Runs the call directly ([`Self::run_direct`]) when its send and receive bytes (as
    /// many as the collective needs from `send` and `recv`, lengths checked by the caller)
    /// lie in this rank's shared windows and the direct path may run: no algorithm forced,
    /// and at least [`window::MIN_BYTES`] per rank (`count` elements: the same on every
    /// rank, so all ranks choose alike; below it two meetings cost more than the ordinary
    /// path). `None`: take the ordinary path.
    pub(super) fn try_window(
        &mut self,
        call: Call,
        send: *const u8,
        recv: *mut u8,
    ) -> Option<Result<()>> {
        let Call { coll, dtype, count } = call;
        let es = dtype.size();
        if !self.windows.ready() || self.cfg.algo.is_some() || count * es < window::MIN_BYTES {
            return None;
        }
        let (need_in, need_out) = coll.sizes(self.nranks, self.rank, count);
        let (send_len, recv_len) = (need_in * es, need_out * es);
        let s = self.windows.locate(send, send_len)?;
        let r = self.windows.locate(recv.cast_const(), recv_len)?;
        // Empty buffers lie nowhere: a call with no bytes in a window stays on the ordinary
        // path.
        if s.is_none() && r.is_none() {
            return None;
        }
        Some(self.run_direct(call, (send, s, send_len), (recv, r, recv_len)))
    }

    /// Runs a collective directly on window buffers ([`window::run`]).
    pub(super) fn run_direct(
        &mut self,
        call: Call,
        send: (*const u8, Loc, usize),
        recv: (*mut u8, Loc, usize),
    ) -> Result<()> {
        let Call { coll, dtype, count } = call;
        let sig = self.begin(call, None);
        tracing::info!(
            target: "monel::coll",
            "rank {}: {} via window (loads and stores between the ranks' \
             shared buffers)",
            self.rank,
            describe_sig(&sig)
        );
        self.last_path = "window";
        let call = window::DirectCall {
            coll,
            coll_code: coll.code(),
            dtype,
            count,
            seq: self.seq,
            rank: self.rank,
            nranks: self.nranks,
            send,
            recv,
            deadline: Instant::now() + self.cfg.timeout,
            yield_often: self.yield_every == 1,
            scratch: &mut self.scratch,
        };
        let res = match window::run(&mut self.windows, call) {
            Err(e) if e.kind == ErrorKind::Timeout => {
                let why = e.message.clone();
                let mut named = self.name_missing(&describe_sig(&sig), e);
                if !named.message.contains(&why) {
                    named.message = format!("{} ({why})", named.message);
                }
                Err(named)
            }
            r => r,
        };
        self.conclude(sig, res)
    }

    /// Allocates a symmetric memory window of `len` bytes (`ncclMemAlloc` and
    /// `ncclCommWindowRegister` in one). Collective: every rank calls it, in the same order
    /// as its other collectives. When all ranks share this host's memory (shared-memory
    /// links between every pair), each rank maps every rank's window, and collectives whose
    /// buffers lie in windows on every rank run directly between them
    /// ([`Communicator::last_path`] says `window`); otherwise the window is private memory
    /// and collectives on it take the ordinary path. The memory starts zeroed.
    pub fn alloc_window(&mut self, len: usize) -> Result<Window> {
        if !self.windows.ready() {
            if let Some(ctl) = self.share_region(usize::MAX, window::CTL_LEN)? {
                self.windows.set_ctl(ctl);
            }
        }
        let id = self.windows.next_id();
        let shared = if self.windows.ready() {
            self.share_region(id, len)?
        } else {
            None
        };
        let mut region = match shared {
            Some(r) => r,
            None => Region::new(
                id,
                len,
                transport::segment::Segment::anonymous(window::HEADER + len)
                    .map_err(|e| CclError::io("window memory", e))?,
                Vec::new(),
            ),
        };
        // Every RDMA link of a communicator shares one NIC: one registration serves them all.
        let mut on_nic = false;
        for link in self.links.all().flatten() {
            if region
                .register_with(link)
                .map_err(|e| CclError::io("registering the window with the NIC", e))?
            {
                on_nic = true;
                break;
            }
        }
        self.windows.note_registered(on_nic);
        tracing::info!(
            target: "monel::coll",
            "rank {}: window {id} of {len} bytes {}",
            self.rank,
            if region.shared() {
                "shared by every rank (collectives on it run directly)"
            } else if on_nic {
                "private (not every rank shares this host's memory), registered with the \
                 NIC: sends from it go to the NIC without a staging copy"
            } else {
                "private (not every rank shares this host's memory)"
            }
        );
        let region = Arc::new(region);
        self.windows.push(&region);
        Ok(Window::new(region))
    }

    /// Creates this rank's segment of `len` bytes and maps every peer's (see
    /// [`Communicator::alloc_window`]); `None` unless every rank mapped every segment.
    pub(super) fn share_region(&mut self, id: usize, len: usize) -> Result<Option<Region>> {
        const REC: usize = 256;
        let (n, r) = (self.nranks, self.rank);
        let page = 4096;
        let total = window::HEADER + len.div_ceil(page).max(1) * page;
        let eligible = self.cfg.transports.shm
            && self.cfg.shm.enabled
            && (0..n).filter(|&j| j != r).all(|j| {
                self.links
                    .get(j)
                    .is_some_and(|l| l.kind() == TransportKind::Shm)
            });
        let made = eligible
            .then(|| transport::segment::create_sized(&self.cfg.shm.dir, total).ok())
            .flatten();
        let mut rec = [0u8; REC];
        if let Some((name, _, _, nonce)) = &made {
            let p = name.as_bytes();
            if p.len() <= REC - 27 {
                rec[0] = 1;
                rec[1..9].copy_from_slice(&(total as u64).to_le_bytes());
                rec[9..25].copy_from_slice(nonce);
                rec[25..27].copy_from_slice(&(p.len() as u16).to_le_bytes());
                rec[27..27 + p.len()].copy_from_slice(p);
            }
        }
        let mut all = vec![0u8; REC * n];
        let gathered = self.all_gather(&rec, &mut all, REC, DataType::U8);
        let mut peers: Vec<Option<transport::segment::Segment>> = (0..n).map(|_| None).collect();
        let mut ok = gathered.is_ok() && rec[0] == 1;
        for j in (0..n).filter(|&j| j != r) {
            let f = &all[j * REC..(j + 1) * REC];
            let plen = usize::from(u16::from_le_bytes([f[25], f[26]]));
            if !ok || f[0] != 1 || plen > REC - 27 {
                ok = false;
                break;
            }
            let size = u64::from_le_bytes(f[1..9].try_into().expect("8 bytes")) as usize;
            // The peer names its segment; the path is this rank's own directory and a name
            // that passes the same checks as a ring's (see `transport::segment::open_named`).
            let name = &f[27..27 + plen];
            match transport::segment::open_named(&self.cfg.shm.dir, name, size, &f[9..25]) {
                Ok(seg) => peers[j] = Some(seg),
                Err(_) => ok = false,
            }
        }
        let mut flag = [u8::from(ok)];
        let agreed = gathered
            .and_then(|()| self.all_reduce_in_place(&mut flag, 1, DataType::U8, RedOp::Min));
        // Every rank has mapped what it could (it voted after): the names can go.
        if let Some((_, path, ..)) = &made {
            let _ = std::fs::remove_file(path);
        }
        agreed?;
        match made {
            Some((_, _, seg, _)) if flag[0] == 1 => Ok(Some(Region::new(id, len, seg, peers))),
            _ => Ok(None),
        }
    }
}
