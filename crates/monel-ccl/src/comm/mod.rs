//! The communicator: the collectives API (NCCL's argument order, bytes plus a data type),
//! algorithm choice and the dispatch of each call, split, abort.
//!
//! ```text
//!  mod.rs      Communicator, the NCCL-shaped calls, collective(): window, tiny or schedule
//!  init        rendezvous, mesh, a transport per pair (crate::transport), core sharing
//!  config      CommConfig and the MONEL_* variables
//!  tuning      cost-model agreement across ranks
//!  hosts       which ranks share a host; ring and tree order
//!  windows     symmetric memory windows and the direct path on them
//!  fast_path   the two-rank tiny AllReduce
//!  group       send, recv, groups
//!  status      the status endpoint that names missing ranks
//!  signature   schedule cache keys; a call's signature in words
//! ```

mod config;
mod fast_path;
mod group;
#[cfg(test)]
mod harness;
mod hosts;
mod init;
mod matching;
mod monitored;
mod signature;
mod status;
mod tuning;
mod typed;
mod windows;

pub use config::{CommConfig, Transports};
use fast_path::TINY;
pub use group::GroupOp;
use hosts::host_key;
pub(crate) use hosts::{host_order, per_host};
pub use matching::STASH_MAX;
pub use monitored::MONITORED_BARRIER_TAG;
use signature::{Fnv, SchedKey, describe_sig};
use status::{Status, query_status, serve_status};
pub use typed::Element;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::bootstrap::{PeerAddrs, UniqueId};
use crate::error::{CclError, ErrorKind, Result};
use crate::exec::{self, Ctx, Links, Name, P2pSeqs, Pool};
use crate::frame::Signature;
use crate::liveness::{Liveness, PeerState};
use crate::window::Windows;
use monel_sched::buffers::Buffers;
use monel_sched::dtype::{DataType, RedOp};
use monel_sched::plan::{self, Algorithm, Call, Collective};
use monel_sched::schedule::Schedule;
use monel_sched::tune::{self};

/// Buffers for one call: separate send and receive buffers, or one buffer in place (NCCL's
/// conventions: see [`Collective::in_place_layout`]).
pub enum Io<'a> {
    /// Out of place.
    Separate {
        /// `sendbuff`.
        send: &'a [u8],
        /// `recvbuff`.
        recv: &'a mut [u8],
    },
    /// In place.
    InPlace(&'a mut [u8]),
}

/// A communicator (`ncclComm_t`) for CPU memory.
pub struct Communicator {
    rank: usize,
    nranks: usize,
    cfg: CommConfig,
    links: Links,
    table: Vec<PeerAddrs>,
    seq: u64,
    status: Arc<Mutex<Status>>,
    stop: Arc<AtomicBool>,
    failed: Option<CclError>,
    paths: Vec<String>,
    /// Schedules built before, by call shape.
    schedules: HashMap<SchedKey, Arc<Schedule>, BuildHasherDefault<Fnv>>,
    /// The cost model's choices for recent call shapes (collective code, bytes), direct
    /// mapped: a repeated call skips pricing every algorithm. Emptied when the model changes.
    choices: [Option<(u8, usize, Algorithm)>; CHOICES],
    /// Executor state and scratch kept between calls.
    pool: Pool,
    scratch: Vec<u8>,
    /// Point-to-point messages sent to and received from each peer so far.
    p2p_sent: Vec<u64>,
    p2p_received: Vec<u64>,
    /// Messages received ahead of the tagged receives that want them.
    stash: matching::Stash,
    /// See [`exec::Ctx::yield_every`].
    yield_every: u32,
    /// Ranks on this machine and the cores they can use together ([`Self::core_share`]).
    core_share: (usize, usize),
    /// The cost model's constants for this communicator's links.
    costs: tune::Costs,
    /// The ranks' places in rings and trees ([`host_order`]).
    order: Vec<usize>,
    /// Ranks on each host when every host has as many, else 0 ([`per_host`]).
    per_host: usize,
    /// The hosts' layout and link costs, where the ranks sit on several hosts of several
    /// ranks each (the hierarchical AllReduce's cost model).
    hosts: Option<tune::Hosts>,
    /// Symmetric memory windows and their meeting point.
    windows: Windows,
    /// Each rank's status endpoint, by rank (for the liveness check).
    status_addrs: Vec<SocketAddr>,
    /// The job key, which status queries prove.
    key: monel_peer::auth::Key,
    /// How the last collective ran: an algorithm's name, or `window`.
    last_path: &'static str,
    /// Calls the two-rank tiny path finished without the executor.
    tiny_done: u64,
}

/// Most schedules kept (a training loop uses a handful of shapes).
const SCHEDULE_CACHE: usize = 256;

impl Communicator {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The ranks in the order rings and trees take them: grouped by host (see the
    /// `MONEL_DEBUG=INFO` log); the identity when ranks are already placed host by host.
    pub fn rank_order(&self) -> &[usize] {
        &self.order
    }
    /// Ranks in all.
    pub fn size(&self) -> usize {
        self.nranks
    }
    /// One line per connection: the path it took and why.
    pub fn paths(&self) -> &[String] {
        &self.paths
    }
    /// The configuration.
    pub fn config(&self) -> &CommConfig {
        &self.cfg
    }

    /// Forces an algorithm for the collectives that have it (as `MONEL_ALGO`), or lets the
    /// cost model choose again (`None`).
    pub fn set_algorithm(&mut self, algo: Option<Algorithm>) {
        self.cfg.algo = algo;
    }

    /// [`Self::algorithm_for`], remembering the cost model's answer for the call's shape.
    fn choose_cached(&mut self, call: Call) -> Algorithm {
        let coll = call.coll;
        if let Some(a) = self.forced(coll) {
            return a;
        }
        let (code, bytes) = (coll.code(), call.bytes());
        let slot = (bytes.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58 ^ usize::from(code)) % CHOICES;
        match self.choices[slot] {
            Some((c, b, a)) if c == code && b == bytes => a,
            _ => {
                let a = self.priced(coll, bytes);
                self.choices[slot] = Some((code, bytes, a));
                a
            }
        }
    }

    /// The algorithm a call would use.
    pub fn algorithm_for(&self, coll: Collective, dtype: DataType, count: usize) -> Algorithm {
        self.forced(coll)
            .unwrap_or_else(|| self.priced(coll, count * dtype.size()))
    }

    /// The algorithm the settings force on `coll`, if any: the deterministic AllReduce, or
    /// `MONEL_ALGO` / [`Self::set_algorithm`] where `coll` has it.
    fn forced(&self, coll: Collective) -> Option<Algorithm> {
        if self.cfg.deterministic && matches!(coll, Collective::AllReduce(_)) {
            return Some(Algorithm::Deterministic);
        }
        self.cfg.algo.filter(|a| coll.algorithms().contains(a))
    }

    /// The cost model's choice for `bytes` per rank.
    fn priced(&self, coll: Collective, bytes: usize) -> Algorithm {
        tune::choose_on(
            coll,
            self.nranks,
            bytes,
            self.cfg.chunk,
            &self.costs,
            self.hosts.as_ref(),
        )
    }

    /// Runs a collective on raw bytes. Validation errors leave the communicator usable;
    /// failures during communication abort it (later calls return [`ErrorKind::Aborted`]).
    pub fn collective(&mut self, call: Call, io: Io<'_>) -> Result<()> {
        let Call { coll, dtype, count } = call;
        if let Some(e) = &self.failed {
            return Err(CclError::new(
                ErrorKind::Aborted,
                format!("communicator failed earlier: {e}"),
            ));
        }
        let (n, r, es) = (self.nranks, self.rank, dtype.size());
        if let Some(root) = coll.root() {
            if root >= n {
                return Err(CclError::invalid(format!(
                    "{}: root {root} is not a rank (0..{n})",
                    coll.name()
                )));
            }
        }
        let (need_in, need_out) = coll.sizes(n, r, count);
        let in_place = matches!(io, Io::InPlace(_));
        let op = coll.op().unwrap_or(RedOp::Sum);
        let mut bufs = match io {
            Io::Separate { send, recv } => {
                if send.len() < need_in * es {
                    return Err(CclError::invalid(format!(
                        "{}: sendbuff has {} bytes, {need_in} {dtype} elements need {}",
                        coll.name(),
                        send.len(),
                        need_in * es
                    )));
                }
                if recv.len() < need_out * es {
                    return Err(CclError::invalid(format!(
                        "{}: recvbuff has {} bytes, {need_out} {dtype} elements need {}",
                        coll.name(),
                        recv.len(),
                        need_out * es
                    )));
                }
                let (sp, rp) = (send.as_ptr(), recv.as_mut_ptr());
                if let Some(res) = self.try_window(call, sp, rp) {
                    return res;
                }
                Buffers::separate(
                    &send[..need_in * es],
                    &mut recv[..need_out * es],
                    dtype,
                    op,
                    n,
                )
            }
            Io::InPlace(buf) => {
                let (len, io_, oo) = coll.in_place_layout(n, r, count).ok_or_else(|| {
                    CclError::invalid(format!("{} has no in-place form", coll.name()))
                })?;
                if buf.len() < len * es {
                    return Err(CclError::invalid(format!(
                        "{} in place: buffer has {} bytes, needs {}",
                        coll.name(),
                        buf.len(),
                        len * es
                    )));
                }
                let base = buf.as_mut_ptr();
                // SAFETY: io_ + need_in and oo + need_out are within the layout's `len`
                // elements, which the buffer holds (checked above).
                #[allow(unsafe_code)]
                let (sp, rp) = unsafe { (base.add(io_ * es).cast_const(), base.add(oo * es)) };
                if let Some(res) = self.try_window(call, sp, rp) {
                    return res;
                }
                Buffers::in_place(&mut buf[..len * es], io_, oo, dtype, op, n)
            }
        };
        let algo = self.choose_cached(call);
        let mut begun = None;
        if algo == Algorithm::Direct
            && n == 2
            && matches!(coll, Collective::AllReduce(_))
            && count > 0
            && count * es <= TINY
        {
            let sig = self.begin(call, Some(algo));
            if let Some(res) = self.tiny_pair(sig, op, count, &mut bufs) {
                self.last_path = algo.name();
                let res = match res {
                    Err(e) if e.kind == ErrorKind::Timeout => {
                        Err(self.name_missing(&describe_sig(&sig), e))
                    }
                    r => r,
                };
                return self.conclude(sig, res);
            }
            begun = Some(sig);
        }
        let slice = (self.cfg.chunk / es).max(1);
        let key = SchedKey {
            coll: coll.code(),
            op: op.code(),
            root: coll.root().unwrap_or(0),
            algo,
            count,
            slice,
            in_place,
        };
        let sched = match self.schedules.get(&key) {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(
                    plan::ScheduleRequest {
                        coll,
                        algo,
                        ranks: n,
                        rank: r,
                        count,
                        slice,
                        in_place,
                        order: &self.order,
                        per_host: self.per_host,
                    }
                    .build()?,
                );
                if self.schedules.len() >= SCHEDULE_CACHE {
                    self.schedules.clear();
                }
                self.schedules.insert(key, s.clone());
                s
            }
        };
        let mut bufs = bufs.with_scratch(std::mem::take(&mut self.scratch));
        let sig = match begun {
            Some(sig) => sig,
            None => self.begin(call, Some(algo)),
        };
        tracing::info!(
            target: "monel::coll",
            "rank {r}: {} via {} ({} steps)",
            describe_sig(&sig),
            algo.name(),
            sched.steps.len()
        );
        self.last_path = algo.name();
        let res = self.execute(sig, &sched, &mut bufs, None);
        self.scratch = bufs.take_scratch();
        let res = match res {
            Err(e) if e.kind == ErrorKind::Timeout => {
                Err(self.name_missing(&describe_sig(&sig), e))
            }
            r => r,
        };
        self.conclude(sig, res)
    }

    /// Starts a collective: the next sequence number, its signature (with the algorithm
    /// its messages follow, if any), the status "running".
    fn begin(&mut self, call: Call, algo: Option<Algorithm>) -> Signature {
        let Call { coll, dtype, count } = call;
        self.seq += 1;
        let sig = Signature {
            seq: self.seq,
            coll: coll.code(),
            dtype: dtype.code(),
            op: coll.op().unwrap_or(RedOp::Sum).code(),
            root: coll.root().unwrap_or(0) as u32,
            count: count as u64,
            algo: algo.map_or(0, Algorithm::code),
        };
        let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        st.seq = self.seq;
        st.sig = Some(sig);
        st.state = "running";
        sig
    }

    /// How the last collective ran: the algorithm's name (`ring`, `tree`, ...), or `window`
    /// when it ran directly on window buffers.
    pub fn last_path(&self) -> &'static str {
        self.last_path
    }

    /// Tiny AllReduces between two ranks (up to 256 bytes) that finished on the fast path,
    /// without the executor (the peer's frame was there within a short spin): a count for
    /// tests and benchmarks.
    pub fn tiny_calls(&self) -> u64 {
        self.tiny_done
    }

    /// Bytes this rank's links sent straight from windows registered with the NIC, without
    /// a staging copy (RDMA links; see [`Self::alloc_window`]): a count for tests and
    /// benchmarks.
    pub fn zero_copy_bytes(&self) -> u64 {
        self.links
            .all()
            .flatten()
            .map(|l| l.zero_copy_bytes())
            .sum()
    }

    /// The ranks that share this rank's machine (itself included) and the cores they can run
    /// on together: the union of their affinity masks, within a CPU quota. More ranks than
    /// cores makes waiting ranks hand their core over on every idle look instead of
    /// spinning.
    pub fn core_share(&self) -> (usize, usize) {
        self.core_share
    }

    /// Records how a call ended; a failure goes to every peer and fails the communicator.
    fn conclude(&mut self, sig: Signature, res: Result<()>) -> Result<()> {
        let r = self.rank;
        let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        match res {
            Ok(()) => {
                st.state = "done";
                Ok(())
            }
            Err(e) => {
                st.state = "failed";
                drop(st);
                // Peers learn the failure with its kind and culprits, so none of them waits
                // out its timeout or blames this rank for leaving. An abort received from a
                // peer went to every rank already.
                if e.kind != ErrorKind::RemoteAbort && e.kind != ErrorKind::Aborted {
                    exec::send_abort(&mut self.links, sig, r, &e);
                }
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Aborts: tells every peer, closes the links; every later call fails at once.
    pub fn abort(&mut self, reason: &str) {
        let sig = Signature {
            seq: self.seq,
            coll: 0,
            dtype: 0,
            op: 0,
            root: 0,
            count: 0,
            algo: 0,
        };
        let e = CclError::new(
            ErrorKind::RemoteAbort,
            format!("aborted by the application: {reason}"),
        );
        exec::send_abort(&mut self.links, sig, self.rank, &e);
        self.failed = Some(CclError::new(
            ErrorKind::Aborted,
            format!("aborted: {reason}"),
        ));
        self.links.close_all();
    }

    /// AllReduce (`ncclAllReduce`).
    pub fn all_reduce(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::AllReduce(op), dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// AllReduce in place.
    pub fn all_reduce_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::AllReduce(op), dtype, count),
            Io::InPlace(buf),
        )
    }
    /// Broadcast (`ncclBroadcast`); `send` is read at the root only.
    pub fn broadcast(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::Broadcast(root), dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// Broadcast in place (`ncclBcast`).
    pub fn broadcast_in_place(
        &mut self,
        buf: &mut [u8],
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::Broadcast(root), dtype, count),
            Io::InPlace(buf),
        )
    }
    /// Reduce (`ncclReduce`); `recv` is written at the root only.
    pub fn reduce(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::Reduce(op, root), dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// AllGather (`ncclAllGather`): `count` elements per rank.
    pub fn all_gather(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::AllGather, dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// ReduceScatter (`ncclReduceScatter`): `count` elements per rank.
    pub fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: RedOp,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::ReduceScatter(op), dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// AlltoAll (`ncclAlltoAll`): `count` elements per pair.
    pub fn all_to_all(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::AllToAll, dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// Gather (`ncclGather`).
    pub fn gather(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::Gather(root), dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// Scatter (`ncclScatter`).
    pub fn scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.collective(
            Call::new(Collective::Scatter(root), dtype, count),
            Io::Separate { send, recv },
        )
    }
    /// Barrier.
    pub fn barrier(&mut self) -> Result<()> {
        self.collective(
            Call::new(Collective::Barrier, DataType::U8, 0),
            Io::InPlace(&mut []),
        )
    }

    /// Splits into sub-communicators (`ncclCommSplit`): the ranks that pass the same
    /// `color` form one, numbered by `key` (ties by rank here); `None` (`NCCL_SPLIT_NOCOLOR`)
    /// takes part and joins none. Every rank must call it; the new communicator has this
    /// one's configuration and its own connections.
    pub fn split(&mut self, color: Option<u32>, key: i64) -> Result<Option<Self>> {
        let n = self.nranks;
        let mut mine = Vec::with_capacity(16);
        mine.extend(color.map_or(-1, i64::from).to_le_bytes());
        mine.extend(key.to_le_bytes());
        let mut all = vec![0u8; 16 * n];
        self.all_gather(&mine, &mut all, 2, DataType::I64)?;
        let at = |r: usize, i: usize| {
            i64::from_le_bytes(
                all[16 * r + 8 * i..16 * r + 8 * i + 8]
                    .try_into()
                    .expect("8"),
            )
        };
        let Some(c) = color else {
            // Still takes part in the id exchange below.
            let mut ids = vec![0u8; ID_LEN * n];
            self.all_gather(&[0; ID_LEN], &mut ids, ID_LEN, DataType::U8)?;
            return Ok(None);
        };
        let mut members: Vec<usize> = (0..n).filter(|&r| at(r, 0) == i64::from(c)).collect();
        members.sort_by_key(|&r| (at(r, 1), r));
        let new_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .expect("a rank is in its own color");
        // The first member starts the rendezvous; everyone learns every leader's id.
        let mut id_bytes = [0u8; ID_LEN];
        let own_id = if new_rank == 0 {
            let ip = self.table[self.rank].data.ip();
            let id = UniqueId::create_with(SocketAddr::new(ip, 0), self.cfg.secret.as_ref())?;
            let text = id.to_string();
            let b = id_bytes
                .get_mut(..text.len())
                .ok_or_else(|| CclError::internal(format!("unique id {text} too long")))?;
            b.copy_from_slice(text.as_bytes());
            Some(id)
        } else {
            None
        };
        let mut ids = vec![0u8; ID_LEN * n];
        self.all_gather(&id_bytes, &mut ids, ID_LEN, DataType::U8)?;
        let id = match own_id {
            Some(id) => id,
            None => {
                let l = members[0];
                let raw = &ids[ID_LEN * l..ID_LEN * (l + 1)];
                let end = raw.iter().position(|&b| b == 0).unwrap_or(ID_LEN);
                String::from_utf8_lossy(&raw[..end]).parse()?
            }
        };
        Self::init_rank(members.len(), new_rank, &id, self.cfg.clone()).map(Some)
    }

    /// Runs `sched` over the links within the timeout; `p2p`: a point-to-point group, with
    /// its messages numbered per pair and the tags of its sends and receives (by part).
    fn execute(
        &mut self,
        sig: Signature,
        sched: &Schedule,
        bufs: &mut Buffers<'_>,
        p2p: Option<(&[u32], &[u32])>,
    ) -> Result<()> {
        let key = &self.key;
        let probe = |a| {
            query_status(a, key).ok().map(|(seq, text)| PeerState {
                seq,
                failed: text.starts_with("failed"),
            })
        };
        let mut ctx = Ctx {
            links: &mut self.links,
            name: Name {
                sig,
                describe: &describe_sig,
            },
            timeout: self.cfg.timeout,
            deadline: None,
            spin: self.cfg.spin,
            yield_every: self.yield_every,
            p2p: p2p.map(|(send_tags, recv_tags)| P2pSeqs {
                send: &mut self.p2p_sent,
                recv: &mut self.p2p_received,
                send_tags,
                recv_tags,
            }),
            liveness: (!self.cfg.liveness.is_zero())
                .then(|| Liveness::new(&self.status_addrs, self.cfg.liveness, &probe, sig.seq)),
            stable_sends: self.windows.on_nic(),
        };
        exec::run(&mut ctx, sched, bufs, &mut self.pool)
    }
}

/// Entries of [`Communicator`]'s cache of algorithm choices.
const CHOICES: usize = 64;

/// Bytes of a unique id's text in [`Communicator::split`]'s exchange.
const ID_LEN: usize = 128;

/// A group's part index.
fn part(i: usize) -> Result<u16> {
    u16::try_from(i).map_err(|_| CclError::invalid("more than 65535 sends or receives in a group"))
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if tracing::enabled!(target: "monel::net", tracing::Level::INFO) {
            for (j, l) in self.links.all().enumerate() {
                if let Some((c, kind)) = l.and_then(|l| Some((l.counters()?, l.kind()))) {
                    tracing::info!(target: "monel::net", "rank {} -> {j} {kind}: {c}", self.rank);
                }
            }
        }
        if self.failed.is_none() {
            let sig = Signature {
                seq: self.seq,
                coll: 0,
                dtype: 0,
                op: 0,
                root: 0,
                count: 0,
                algo: 0,
            };
            exec::send_close(&mut self.links, sig);
        }
        // The status thread sees the flag within 200 ms.
        self.stop.store(true, Ordering::Release);
    }
}
