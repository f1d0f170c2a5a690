//! A batch of one-sided transfers (Mooncake's BatchTransfer, NIXL's transfer request), sans
//! IO: each descriptor checked against this agent's segments and the peer's, cut into slices
//! of at most [`Plan::slice`] bytes spread round-robin over [`Plan::lanes`] lanes (queue
//! pairs or paths), neighbouring small descriptors merged into one slice; completions
//! gathered per descriptor; and the batch's notification released once every descriptor's
//! data is in place (never after a failure: the consumer is told only of data that
//! arrived).
//!
//! The transport takes slices lane by lane ([`Batch::take`]), posts them, and reports each
//! one's end ([`Batch::complete`]) or a lane's failure ([`Batch::fail_lane`]). A descriptor
//! that fails keeps the others going; its slices not yet taken are never posted.

use std::collections::VecDeque;
use std::ops::Range;

use crate::error::{Result, XferError};
use crate::segment::SegmentTable;

/// Most descriptors in one batch.
pub const MAX_DESCS: usize = 1 << 16;
/// Most slices one batch is cut into.
pub const MAX_SLICES: usize = 1 << 20;
/// Largest notification payload, in bytes.
pub const MAX_NOTIFICATION: usize = 64 << 10;

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// From the peer's segment into this agent's.
    Read,
    /// From this agent's segment into the peer's.
    Write,
}

/// One transfer: `len` bytes between `local` at `local_offset` and the peer's `remote` at
/// `remote_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc<'a> {
    /// READ or WRITE.
    pub op: Op,
    /// This agent's segment.
    pub local: &'a str,
    /// Offset in it.
    pub local_offset: u64,
    /// The peer's segment.
    pub remote: &'a str,
    /// Offset in it.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// How a batch is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Most bytes in one slice (one work request); 1 to 1 GiB.
    pub slice: u64,
    /// Lanes the slices are spread over; at least 1.
    pub lanes: usize,
    /// The lane the first slice goes on (taken modulo `lanes`). An agent turns it per peer
    /// from batch to batch, so that small batches of one slice each spread over the lanes
    /// too rather than all taking the first.
    pub first_lane: usize,
}

impl Default for Plan {
    fn default() -> Self {
        // Mooncake slices at 64 KiB; a larger slice costs a soft RNIC fewer work requests
        // and a hardware NIC nothing.
        Self {
            slice: 1 << 20,
            lanes: 1,
            first_lane: 0,
        }
    }
}

/// One work request's worth of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// Its number in the batch (what [`Batch::complete`] takes).
    pub id: usize,
    /// The descriptors it carries bytes of (several when small neighbours merged).
    pub descs: Range<usize>,
    /// READ or WRITE.
    pub op: Op,
    /// The lane it goes on.
    pub lane: usize,
    /// Local address and key.
    pub local_addr: u64,
    /// The local buffer's key.
    pub local_key: u32,
    /// Remote address and key.
    pub remote_addr: u64,
    /// The remote buffer's key.
    pub remote_key: u32,
    /// Bytes (at most [`Plan::slice`]).
    pub len: u32,
}

/// Where a descriptor stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescState {
    /// Slices of it are still to complete.
    Pending,
    /// Its bytes are in place.
    Done,
    /// It failed; nothing more of it is posted.
    Failed(XferError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SliceState {
    Queued,
    Posted,
    Ended,
}

/// A planned batch.
#[derive(Debug)]
pub struct Batch {
    descs: Vec<DescState>,
    /// Slices still to end, per descriptor.
    left: Vec<u32>,
    slices: Vec<Slice>,
    state: Vec<SliceState>,
    queues: Vec<VecDeque<usize>>,
    in_flight: usize,
    notification: Option<Vec<u8>>,
}

impl Batch {
    /// Checks `descs` against this agent's `local` segments and the peer's `remote` ones and
    /// cuts the valid ones into slices. A bad descriptor fails alone (its state says why); an
    /// error here concerns the whole batch: too many descriptors or slices, a notification
    /// over [`MAX_NOTIFICATION`], or a bad plan.
    pub fn plan(
        descs: &[Desc<'_>],
        local: &SegmentTable,
        remote: &SegmentTable,
        plan: Plan,
        notification: Option<Vec<u8>>,
    ) -> Result<Self> {
        if descs.len() > MAX_DESCS {
            return Err(XferError::TooLarge(format!(
                "{} descriptors in one batch (at most {MAX_DESCS})",
                descs.len()
            )));
        }
        if notification
            .as_ref()
            .is_some_and(|n| n.len() > MAX_NOTIFICATION)
        {
            return Err(XferError::TooLarge(format!(
                "a notification over {MAX_NOTIFICATION} bytes"
            )));
        }
        if !(1..=1 << 30).contains(&plan.slice) || plan.lanes == 0 {
            return Err(XferError::TooLarge(format!(
                "plan: slices of {} bytes over {} lanes (1 B to 1 GiB, at least one lane)",
                plan.slice, plan.lanes
            )));
        }
        let mut b = Self {
            descs: vec![DescState::Pending; descs.len()],
            left: vec![0; descs.len()],
            slices: Vec::new(),
            state: Vec::new(),
            queues: vec![VecDeque::new(); plan.lanes],
            in_flight: 0,
            notification,
        };
        let first = plan.first_lane % plan.lanes;
        for (i, d) in descs.iter().enumerate() {
            let located = local
                .locate(d.local, d.local_offset, d.len)
                .and_then(|l| Ok((l, remote.locate(d.remote, d.remote_offset, d.len)?)));
            let (l, r) = match located {
                Ok(x) => x,
                Err(e) => {
                    b.descs[i] = DescState::Failed(e);
                    continue;
                }
            };
            if d.len == 0 {
                b.descs[i] = DescState::Done;
                continue;
            }
            // A small neighbour of the last slice (same way, both ranges continuing it, the
            // same buffers) joins it.
            if let Some(last) = b.slices.last_mut() {
                let joins = last.descs.end == i
                    && last.op == d.op
                    && last.local_key == l.key
                    && last.remote_key == r.key
                    && last.local_addr + u64::from(last.len) == l.addr
                    && last.remote_addr + u64::from(last.len) == r.addr
                    && u64::from(last.len) + d.len <= plan.slice;
                if joins {
                    last.len += d.len as u32;
                    last.descs.end = i + 1;
                    b.left[i] = 1;
                    continue;
                }
            }
            let mut off = 0u64;
            while off < d.len {
                if b.slices.len() >= MAX_SLICES {
                    return Err(XferError::TooLarge(format!(
                        "a batch cut into more than {MAX_SLICES} slices: use larger slices"
                    )));
                }
                let len = (d.len - off).min(plan.slice);
                let id = b.slices.len();
                b.slices.push(Slice {
                    id,
                    descs: i..i + 1,
                    op: d.op,
                    lane: (first + id) % plan.lanes,
                    local_addr: l.addr + off,
                    local_key: l.key,
                    remote_addr: r.addr + off,
                    remote_key: r.key,
                    len: len as u32,
                });
                b.left[i] += 1;
                off += len;
            }
        }
        b.state = vec![SliceState::Queued; b.slices.len()];
        for s in &b.slices {
            b.queues[s.lane].push_back(s.id);
        }
        Ok(b)
    }

    /// How many lanes its slices are spread over.
    pub fn lanes(&self) -> usize {
        self.queues.len()
    }

    /// The next slice to post on `lane`, if any (slices of failed descriptors are dropped).
    pub fn take(&mut self, lane: usize) -> Option<Slice> {
        while let Some(id) = self.queues.get_mut(lane)?.pop_front() {
            // A descriptor that failed sends no more; a small one merged with it into this
            // slice fails with it (its bytes would not move either).
            let failed = self.slices[id]
                .descs
                .clone()
                .find_map(|i| match &self.descs[i] {
                    DescState::Failed(e) => Some(e.clone()),
                    _ => None,
                });
            if let Some(e) = failed {
                self.end(id, Some(e));
                continue;
            }
            self.state[id] = SliceState::Posted;
            self.in_flight += 1;
            return Some(self.slices[id].clone());
        }
        None
    }

    /// Slice `id` ended: its bytes are in place, or the transport says why not. A slice not
    /// posted, or ended before, is ignored (a transport's late or repeated word).
    pub fn complete(&mut self, id: usize, result: Result<()>) {
        if self.state.get(id) != Some(&SliceState::Posted) {
            return;
        }
        self.in_flight -= 1;
        self.end(id, result.err());
    }

    /// Lane `lane` failed: its posted and queued slices end with `err`.
    pub fn fail_lane(&mut self, lane: usize, err: &XferError) {
        let Some(q) = self.queues.get_mut(lane) else {
            return;
        };
        let queued: Vec<usize> = q.drain(..).collect();
        for id in queued {
            self.end(id, Some(err.clone()));
        }
        let posted: Vec<usize> = (0..self.slices.len())
            .filter(|&id| self.slices[id].lane == lane && self.state[id] == SliceState::Posted)
            .collect();
        for id in posted {
            self.in_flight -= 1;
            self.end(id, Some(err.clone()));
        }
    }

    fn end(&mut self, id: usize, err: Option<XferError>) {
        self.state[id] = SliceState::Ended;
        for i in self.slices[id].descs.clone() {
            self.left[i] -= 1;
            match (&self.descs[i], &err) {
                (DescState::Pending, Some(e)) => self.descs[i] = DescState::Failed(e.clone()),
                (DescState::Pending, None) if self.left[i] == 0 => self.descs[i] = DescState::Done,
                _ => {}
            }
        }
    }

    /// How many descriptors.
    pub fn len(&self) -> usize {
        self.descs.len()
    }

    /// True for a batch of no descriptors.
    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }

    /// Slices posted and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// True when every slice has ended (or was dropped): every descriptor is done or failed.
    pub fn is_finished(&self) -> bool {
        self.descs.iter().all(|d| *d != DescState::Pending)
    }

    /// Descriptor `i`'s state.
    pub fn state(&self, i: usize) -> Option<&DescState> {
        self.descs.get(i)
    }

    /// Every descriptor's state, in order.
    pub fn states(&self) -> &[DescState] {
        &self.descs
    }

    /// The failed descriptors, with why.
    pub fn failures(&self) -> impl Iterator<Item = (usize, &XferError)> {
        self.descs.iter().enumerate().filter_map(|(i, d)| match d {
            DescState::Failed(e) => Some((i, e)),
            _ => None,
        })
    }

    /// The slices the batch was cut into.
    pub fn slices(&self) -> &[Slice] {
        &self.slices
    }

    /// The notification to send, once: when every descriptor is done and none failed.
    pub fn take_notification(&mut self) -> Option<Vec<u8>> {
        if self.is_finished() && self.failures().next().is_none() {
            self.notification.take()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{Buffer, Segment};

    fn table(name: &str, key: u32, lens: &[u64]) -> SegmentTable {
        let mut addr = 0x10_0000;
        let bufs = lens
            .iter()
            .map(|&len| {
                let b = Buffer { addr, len, key };
                addr += len + 0x1000;
                b
            })
            .collect();
        SegmentTable::from_segments(vec![Segment::new(name, bufs).unwrap()]).unwrap()
    }

    fn w(lo: u64, ro: u64, len: u64) -> Desc<'static> {
        Desc {
            op: Op::Write,
            local: "src",
            local_offset: lo,
            remote: "dst",
            remote_offset: ro,
            len,
        }
    }

    /// Runs the batch to the end on every lane, completing each slice with `ok(slice)`.
    fn drain(b: &mut Batch, lanes: usize, ok: impl Fn(&Slice) -> Result<()>) {
        loop {
            let mut any = false;
            for lane in 0..lanes {
                while let Some(s) = b.take(lane) {
                    any = true;
                    b.complete(s.id, ok(&s));
                }
            }
            if !any {
                break;
            }
        }
    }

    #[test]
    fn large_descriptors_are_sliced_over_the_lanes_and_small_neighbours_merge() {
        let (l, r) = (table("src", 1, &[1 << 20]), table("dst", 2, &[1 << 20]));
        let plan = Plan {
            slice: 64 << 10,
            lanes: 3,
            first_lane: 0,
        };
        // One 256 KiB descriptor, then 16 contiguous 1 KiB ones, then one elsewhere.
        let mut descs = vec![w(0, 0, 256 << 10)];
        descs.extend((0..16).map(|k| w((256 << 10) + k * 1024, (256 << 10) + k * 1024, 1024)));
        descs.push(w(900 << 10, 0, 10));
        let mut b = Batch::plan(&descs, &l, &r, plan, Some(b"blocks 0-16".to_vec())).unwrap();
        let s = b.slices();
        assert_eq!(s.len(), 4 + 1 + 1, "{s:?}");
        assert!(
            s[..4]
                .iter()
                .all(|x| x.len == 64 << 10 && x.descs == (0..1))
        );
        assert_eq!((s[4].descs.clone(), s[4].len), (1..17, 16 * 1024));
        assert_eq!(s[5].remote_addr, 0x10_0000);
        assert_eq!(
            s.iter().map(|x| x.lane).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        assert_eq!(s[1].local_addr, 0x10_0000 + (64 << 10));
        assert_eq!((s[0].local_key, s[0].remote_key), (1, 2));
        // No notification before the end.
        assert_eq!(b.take_notification(), None);
        drain(&mut b, 3, |_| Ok(()));
        assert!(b.is_finished());
        assert!((0..descs.len()).all(|i| b.state(i) == Some(&DescState::Done)));
        assert_eq!(b.take_notification(), Some(b"blocks 0-16".to_vec()));
        assert_eq!(b.take_notification(), None, "once");
    }

    #[test]
    fn bad_descriptors_fail_alone_and_hold_back_the_notification() {
        let (l, r) = (table("src", 1, &[4096]), table("dst", 2, &[4096, 4096]));
        let descs = [
            w(0, 0, 4096),
            Desc {
                remote: "nope",
                ..w(0, 0, 8)
            },
            w(4000, 0, 200),
            w(0, 4000, 200),
            w(0, 4096, 4096),
            w(0, 0, 0),
        ];
        let mut b = Batch::plan(&descs, &l, &r, Plan::default(), Some(vec![1])).unwrap();
        assert_eq!(
            b.state(1),
            Some(&DescState::Failed(XferError::UnknownSegment("nope".into())))
        );
        assert!(matches!(
            b.state(2),
            Some(DescState::Failed(XferError::OutOfRange { .. }))
        ));
        // Across the peer's two buffers: refused.
        assert!(matches!(
            b.state(3),
            Some(DescState::Failed(XferError::OutOfRange { .. }))
        ));
        assert_eq!(b.state(5), Some(&DescState::Done));
        drain(&mut b, 1, |_| Ok(()));
        assert_eq!(b.state(0), Some(&DescState::Done));
        assert_eq!(b.state(4), Some(&DescState::Done));
        assert_eq!(b.failures().map(|f| f.0).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(b.take_notification(), None);
    }

    #[test]
    fn the_first_slice_goes_on_the_lane_the_plan_names() {
        let (l, r) = (table("src", 1, &[1 << 20]), table("dst", 2, &[1 << 20]));
        let lanes_of = |first_lane: usize, len: u64| {
            let plan = Plan {
                slice: 4096,
                lanes: 3,
                first_lane,
            };
            let b = Batch::plan(&[w(0, 0, len)], &l, &r, plan, None).unwrap();
            b.slices().iter().map(|x| x.lane).collect::<Vec<_>>()
        };
        assert_eq!(lanes_of(0, 4096), [0]);
        assert_eq!(lanes_of(2, 4096), [2]);
        assert_eq!(lanes_of(1, 4 * 4096), [1, 2, 0, 1]);
        assert_eq!(lanes_of(7, 2 * 4096), [1, 2], "taken modulo the lanes");
    }

    #[test]
    fn a_failed_lane_fails_its_slices_and_no_more_of_their_descriptors_is_posted() {
        let (l, r) = (table("src", 1, &[1 << 20]), table("dst", 2, &[1 << 20]));
        let plan = Plan {
            slice: 4096,
            lanes: 2,
            first_lane: 0,
        };
        // Descriptor 0 in slices 0-6 (lanes 0, 1, 0, ...), descriptor 1 in slice 7 (lane 1).
        let mut b = Batch::plan(&[w(0, 0, 7 * 4096), w(0, 0, 4096)], &l, &r, plan, None).unwrap();
        assert_eq!(b.slices()[7].lane, 1);
        // Lane 0 posts one slice of descriptor 0, then dies.
        let s = b.take(0).unwrap();
        assert_eq!(b.in_flight(), 1);
        let lost = XferError::PeerLost("retry count exceeded".into());
        b.fail_lane(0, &lost);
        assert_eq!(b.in_flight(), 0);
        b.complete(s.id, Ok(()));
        assert_eq!(b.state(0), Some(&DescState::Failed(lost)));
        // Lane 1 has descriptor 0's slices (dropped, never posted) and descriptor 1's.
        let mut posted = Vec::new();
        while let Some(s) = b.take(1) {
            posted.push(s.descs.clone());
            b.complete(s.id, Ok(()));
        }
        assert!(posted.iter().all(|d| *d == (1..2)), "{posted:?}");
        assert!(b.is_finished());
        assert_eq!(b.state(1), Some(&DescState::Done));
    }

    #[test]
    fn batch_bounds() {
        let (l, r) = (table("src", 1, &[1 << 30]), table("dst", 2, &[1 << 30]));
        let tiny = Plan {
            slice: 1,
            ..Plan::default()
        };
        assert!(matches!(
            Batch::plan(&[w(0, 0, 2 << 20)], &l, &r, tiny, None),
            Err(XferError::TooLarge(_))
        ));
        let big = vec![0u8; MAX_NOTIFICATION + 1];
        assert!(Batch::plan(&[], &l, &r, Plan::default(), Some(big)).is_err());
        let zero = Plan {
            slice: 4096,
            lanes: 0,
            first_lane: 0,
        };
        assert!(Batch::plan(&[], &l, &r, zero, None).is_err());
        // An empty batch is finished at once, and its notification goes.
        let mut b = Batch::plan(&[], &l, &r, Plan::default(), Some(vec![9])).unwrap();
        assert_eq!(b.take_notification(), Some(vec![9]));
    }
}
