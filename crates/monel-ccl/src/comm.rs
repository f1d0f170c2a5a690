//! The communicator: bootstrap, the collectives API (NCCL's argument order, bytes plus a
//! data type), algorithm choice, timeouts that name the missing ranks, abort.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::bootstrap::{Launch, PeerAddrs, UniqueId, launch_from, mesh, rendezvous};
use crate::error::{CclError, ErrorKind, Result};
use crate::exec::{self, Ctx, Links, Name, P2pSeqs, Pool};
use crate::link::{FRAME_DATA, HEADER_LEN, Header, Link, Signature, TcpLink};
use crate::rdma::{self, RdmaConfig, Via};
use crate::shm::{ShmConfig, Upgrade, upgrade};
use crate::window::{self, Loc, Region, Window, Windows};
use monel_sched::buffers::Buffers;
use monel_sched::dtype::{DataType, RedOp};
use monel_sched::plan::{self, Algorithm, Collective, CollectiveKind};
use monel_sched::reduce;
use monel_sched::schedule::{Buf, Op, Schedule, Span, Step};
use monel_sched::tune;

/// Settings (each has a `MONEL_*` variable; see [`CommConfig::from_env`]).
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Every blocking call gives up after this long (`MONEL_TIMEOUT`, seconds; default 300).
    pub timeout: Duration,
    /// Force an algorithm (`MONEL_ALGO`: ring, direct, deterministic).
    pub algo: Option<Algorithm>,
    /// Pipelining slice of chains, bytes (`MONEL_CHUNK`; default 512 KiB).
    pub chunk: usize,
    /// Same bits for the same inputs whatever the size or algorithm (`MONEL_DETERMINISTIC=1`).
    pub deterministic: bool,
    /// Log connection paths and algorithm choices to stderr (`MONEL_DEBUG=INFO`).
    pub debug: bool,
    /// Transports a pair may use (`MONEL_TRANSPORT`).
    pub transports: Transports,
    /// How long a rank polls without sleeping when nothing moves (`MONEL_SPIN_US`,
    /// microseconds; default 50). Sleeping costs a wake-up (several microseconds here).
    pub spin: Duration,
    /// Shared-memory ring size per direction (`MONEL_SHM_RING`, bytes) and this rank's host
    /// identity (`MONEL_HOST`: ranks naming different hosts never share memory).
    pub shm: ShmConfig,
    /// The soft RNIC for pairs on different hosts (`MONEL_RDMA_DEV`, `MONEL_RDMA_RING`,
    /// `MONEL_RDMA_GSO`).
    pub rdma: RdmaConfig,
    /// Congestion controls TCP links ask for, first accepted wins; empty keeps the
    /// system's (`MONEL_TCP_CONGESTION`: a comma list, or `system`; default `cubic,reno`).
    /// Neither paces its sends, which BBR (a common system default) does with a timer per
    /// burst: a collective's bursts then wait for it, and on a VM every timer costs a trap.
    pub tcp_congestion: Vec<String>,
}

/// Which transports pairs may use. Each pair takes the best allowed one that works:
/// shared memory, then the soft RNIC (RoCEv2), then TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transports {
    /// Shared memory (same host).
    pub shm: bool,
    /// The soft RNIC: RDMA WRITE with immediate over RoCEv2 (any two hosts).
    pub rdma: bool,
    /// TCP (any two hosts; the fallback).
    pub tcp: bool,
}

impl Default for Transports {
    fn default() -> Self {
        Self {
            shm: true,
            rdma: true,
            tcp: true,
        }
    }
}

impl Transports {
    /// `shm,rdma,tcp` (only these) or `^shm` (all but these); `roce` names `rdma` too.
    pub fn parse(v: &str) -> Option<Self> {
        let (negate, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut named = Self {
            shm: false,
            rdma: false,
            tcp: false,
        };
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match t.to_ascii_lowercase().as_str() {
                "shm" => named.shm = true,
                "rdma" | "roce" => named.rdma = true,
                "tcp" => named.tcp = true,
                _ => return None,
            }
        }
        Some(if negate {
            Self {
                shm: !named.shm,
                rdma: !named.rdma,
                tcp: !named.tcp,
            }
        } else {
            named
        })
    }
}

impl Default for CommConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(300),
            algo: None,
            chunk: 512 << 10,
            deterministic: false,
            debug: false,
            transports: Transports::default(),
            spin: Duration::from_micros(50),
            shm: ShmConfig::default(),
            rdma: RdmaConfig::default(),
            tcp_congestion: vec!["cubic".into(), "reno".into()],
        }
    }
}

impl CommConfig {
    /// Defaults overlaid with the `MONEL_*` variables; a malformed value is an error naming it.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(&|k| std::env::var(k).ok())
    }
    /// As [`Self::from_env`], reading variables through `env`.
    pub fn from_vars(env: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Self::default();
        if let Some(v) = env("MONEL_TIMEOUT") {
            let s: f64 = v
                .parse()
                .ok()
                .filter(|s: &f64| *s > 0.0 && s.is_finite())
                .ok_or_else(|| {
                    CclError::invalid(format!("MONEL_TIMEOUT={v:?}: want seconds > 0"))
                })?;
            c.timeout = Duration::from_secs_f64(s);
        }
        if let Some(v) = env("MONEL_ALGO") {
            c.algo = Some(Algorithm::parse(&v).ok_or_else(|| {
                CclError::invalid(format!(
                    "MONEL_ALGO={v:?}: want ring, direct, doubling, halving, tree, hier or deterministic"
                ))
            })?);
        }
        if let Some(v) = env("MONEL_CHUNK") {
            c.chunk =
                v.parse().ok().filter(|&n: &usize| n >= 64).ok_or_else(|| {
                    CclError::invalid(format!("MONEL_CHUNK={v:?}: want bytes >= 64"))
                })?;
        }
        if let Some(v) = env("MONEL_DETERMINISTIC") {
            c.deterministic = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = env("MONEL_TRANSPORT") {
            c.transports = Transports::parse(&v)
                .filter(|t| t.shm || t.rdma || t.tcp)
                .ok_or_else(|| {
                    CclError::invalid(format!(
                        "MONEL_TRANSPORT={v:?}: want a list of shm, rdma, tcp (or ^ and the ones to leave out)"
                    ))
                })?;
        }
        if let Some(v) = env("MONEL_SPIN_US") {
            let us: u64 = v.parse().map_err(|_| {
                CclError::invalid(format!("MONEL_SPIN_US={v:?}: want microseconds"))
            })?;
            c.spin = Duration::from_micros(us);
        }
        if let Some(v) = env("MONEL_SHM_RING") {
            c.shm.ring = v
                .parse()
                .ok()
                .filter(|&n: &usize| n.is_power_of_two() && (4096..=1 << 30).contains(&n))
                .ok_or_else(|| {
                    CclError::invalid(format!(
                        "MONEL_SHM_RING={v:?}: want a power of two from 4096 to 2^30"
                    ))
                })?;
        }
        c.shm.host = env("MONEL_HOST").filter(|h| !h.is_empty());
        c.rdma.device = env("MONEL_RDMA_DEV").filter(|d| !d.is_empty());
        if let Some(v) = env("MONEL_RDMA_RING") {
            c.rdma.ring = v
                .parse()
                .ok()
                .filter(|&n: &usize| (4096..=1 << 30).contains(&n))
                .ok_or_else(|| {
                    CclError::invalid(format!(
                        "MONEL_RDMA_RING={v:?}: want bytes from 4096 to 2^30"
                    ))
                })?;
        }
        if let Some(v) = env("MONEL_RDMA_GSO") {
            c.rdma.gso = match v.as_str() {
                "1" => true,
                "0" => false,
                _ => {
                    return Err(CclError::invalid(format!(
                        "MONEL_RDMA_GSO={v:?}: want 0 or 1"
                    )));
                }
            };
        }
        if let Some(v) = env("MONEL_TCP_CONGESTION") {
            c.tcp_congestion = parse_congestion(&v).ok_or_else(|| {
                CclError::invalid(format!(
                    "MONEL_TCP_CONGESTION={v:?}: want `system` or a comma list of congestion \
                     controls (names of up to 15 letters, digits or _)"
                ))
            })?;
        }
        if let Some(v) = env("MONEL_DEBUG") {
            c.debug = v.eq_ignore_ascii_case("INFO") || v.eq_ignore_ascii_case("TRACE");
        }
        Ok(c)
    }
}

/// `system` (keep the kernel's default: an empty list) or a comma list of algorithm names.
fn parse_congestion(v: &str) -> Option<Vec<String>> {
    if v.trim() == "system" {
        return Some(Vec::new());
    }
    let names: Vec<String> = v.split(',').map(|n| n.trim().to_string()).collect();
    names
        .iter()
        .all(|n| {
            (1..16).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
        .then_some(names)
}

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

/// What this rank is doing, for the status endpoint.
struct Status {
    seq: u64,
    /// The current (or last) collective; `None` before the first.
    sig: Option<Signature>,
    state: &'static str,
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
    /// How the last collective ran: an algorithm's name, or `window`.
    last_path: &'static str,
    /// Calls the two-rank tiny path finished without the executor.
    tiny_done: u64,
}

/// The ranks' places in rings and trees: grouped by host (the machine, or the address where
/// the machine is unknown, and `MONEL_HOST`), hosts in the order of their lowest rank, ranks
/// ascending within a host. Every rank computes it from the same rendezvous table, so all
/// agree; ranks placed host by host already (as launchers usually place them) keep their
/// own numbers.
pub(crate) fn host_order(table: &[PeerAddrs]) -> Vec<usize> {
    let mut hosts: Vec<(String, String)> = Vec::new();
    let mut of = Vec::with_capacity(table.len());
    for p in table {
        let k = host_key(p);
        let h = hosts.iter().position(|x| *x == k).unwrap_or_else(|| {
            hosts.push(k);
            hosts.len() - 1
        });
        of.push(h);
    }
    let mut order: Vec<usize> = (0..table.len()).collect();
    order.sort_by_key(|&r| (of[r], r));
    order
}

/// What tells hosts apart: the machine (its address where unknown) and `MONEL_HOST`.
fn host_key(p: &PeerAddrs) -> (String, String) {
    let m = if p.machine.is_empty() {
        p.data.ip().to_string()
    } else {
        p.machine.clone()
    };
    (m, p.host.clone())
}

/// How many ranks each host has, when every host has as many, else 0; `order` is
/// [`host_order`]'s, which puts each host's ranks next to each other.
pub(crate) fn per_host(table: &[PeerAddrs], order: &[usize]) -> usize {
    let mut sizes: Vec<usize> = Vec::new();
    for (k, &r) in order.iter().enumerate() {
        if k > 0 && host_key(&table[order[k - 1]]) == host_key(&table[r]) {
            *sizes.last_mut().expect("a host") += 1;
        } else {
            sizes.push(1);
        }
    }
    match sizes.first() {
        Some(&l) if sizes.iter().all(|&x| x == l) => l,
        _ => 0,
    }
}

/// A call's shape: everything its schedule depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SchedKey {
    coll: u8,
    op: u8,
    root: usize,
    algo: Algorithm,
    count: usize,
    slice: usize,
    in_place: bool,
}

/// FNV-1a: the schedule cache's keys are a few small integers, hashed on every call.
#[derive(Default)]
struct Fnv(u64);

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

/// Most schedules kept (a training loop uses a handful of shapes).
const SCHEDULE_CACHE: usize = 256;

fn describe_sig(s: &Signature) -> String {
    let kind = CollectiveKind::from_code(s.coll);
    if kind.is_none() && s.coll == exec::P2P_CODE {
        return if s.seq == 0 {
            format!("a send/recv group ({} bytes)", s.count)
        } else {
            format!("send/recv message #{} of {} bytes", s.seq, s.count)
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

/// Answers status queries with `seq <n> <state> <what>` until `stop`.
fn serve_status(l: TcpListener, status: Arc<Mutex<Status>>, stop: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new()
        .name("monel-status".into())
        .spawn(move || {
            for c in l.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut s) = c else { continue };
                let line = {
                    let st = status.lock().unwrap_or_else(PoisonError::into_inner);
                    let what = st.sig.as_ref().map_or_else(|| "init".into(), describe_sig);
                    format!("seq {} {} {what}\n", st.seq, st.state)
                };
                let _ = s.write_all(line.as_bytes());
            }
        });
}

fn query_status(addr: SocketAddr) -> std::result::Result<(u64, String), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut line = String::new();
    s.read_to_string(&mut line).map_err(|e| e.to_string())?;
    let rest = line.trim().strip_prefix("seq ").ok_or("garbled status")?;
    let (n, text) = rest.split_once(' ').ok_or("garbled status")?;
    Ok((n.parse().map_err(|_| "garbled status")?, text.to_string()))
}

impl Communicator {
    /// Joins the communicator `id` names as rank `rank` of `nranks` (`ncclCommInitRank`).
    pub fn init_rank(nranks: usize, rank: usize, id: &UniqueId, cfg: CommConfig) -> Result<Self> {
        if nranks == 0 || rank >= nranks {
            return Err(CclError::invalid(format!(
                "rank {rank} of {nranks}: want 0 <= rank < nranks"
            )));
        }
        // Frame headers carry a root in 24 bits.
        if nranks > 1 << 24 {
            return Err(CclError::invalid(format!(
                "{nranks} ranks: at most {} per communicator",
                1 << 24
            )));
        }
        let deadline = Instant::now() + cfg.timeout;
        // Listen on the local address the root is reached from (the root may not be up
        // yet: retry until the deadline).
        let local_ip = loop {
            match TcpStream::connect_timeout(&id.root, Duration::from_secs(1)) {
                Ok(s) => {
                    break s
                        .local_addr()
                        .map_err(|e| CclError::io("rendezvous socket", e))?
                        .ip();
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(CclError::io(
                        format!("rank {rank}: cannot reach the rendezvous at {}", id.root),
                        e,
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let listener =
            TcpListener::bind((local_ip, 0)).map_err(|e| CclError::io("bind data listener", e))?;
        let status_l = TcpListener::bind((local_ip, 0))
            .map_err(|e| CclError::io("bind status listener", e))?;
        let mine = PeerAddrs {
            data: listener
                .local_addr()
                .map_err(|e| CclError::io("listener", e))?,
            status: status_l
                .local_addr()
                .map_err(|e| CclError::io("listener", e))?,
            machine: crate::bootstrap::this_machine(),
            host: cfg.shm.host.clone().unwrap_or_default(),
            cpus: crate::cpus::this_rank(),
        };
        let status = Arc::new(Mutex::new(Status {
            seq: 0,
            sig: None,
            state: "running",
        }));
        let stop = Arc::new(AtomicBool::new(false));
        serve_status(status_l, status.clone(), stop.clone());
        let table = rendezvous(id, nranks, rank, &mine, deadline)?;
        let streams = mesh(&listener, &table, rank, id.token, deadline)?;
        let mut shm_cfg = cfg.shm.clone();
        shm_cfg.enabled &= cfg.transports.shm;
        let ups = upgrade(streams, rank, &shm_cfg, deadline)
            .map_err(|e| CclError::io("shared-memory handshake", e))?;
        // Pairs shared memory did not take try the soft RNIC, then stay on TCP.
        let mut links: Vec<Option<Box<dyn Link>>> = (0..nranks).map(|_| None).collect();
        let mut paths = vec![String::new(); nranks];
        let mut rest: Vec<Option<TcpStream>> = (0..nranks).map(|_| None).collect();
        let mut not_shm: Vec<String> = vec![String::new(); nranks];
        for (j, u) in ups.into_iter().enumerate() {
            match u {
                Some(Upgrade::Shm(l)) => {
                    links[j] = Some(Box::new(l));
                    paths[j] = format!(
                        "rank {rank} -> {j} via SHM (same host: {} KiB rings in {})",
                        shm_cfg.ring.next_power_of_two() >> 10,
                        shm_cfg.dir.display()
                    );
                }
                Some(Upgrade::Tcp(s, why)) => {
                    rest[j] = Some(s);
                    not_shm[j] = why;
                }
                None => {}
            }
        }
        let mut rdma_cfg = cfg.rdma.clone();
        rdma_cfg.enabled &= cfg.transports.rdma;
        let vias = rdma::upgrade(rest, local_ip, &rdma_cfg, deadline)
            .map_err(|e| CclError::io("soft-RNIC handshake", e))?;
        for (j, v) in vias.into_iter().enumerate() {
            match v {
                Some(Via::Rdma(l, desc)) => {
                    links[j] = Some(l);
                    paths[j] = format!(
                        "rank {rank} -> {j} via RoCE soft-RNIC {desc} (not SHM: {})",
                        not_shm[j]
                    );
                }
                Some(Via::Tcp(s, why)) => {
                    if !cfg.transports.tcp {
                        return Err(CclError::bootstrap(format!(
                            "rank {rank} -> {j}: MONEL_TRANSPORT forbids TCP; not SHM: {}; not RDMA: {why}",
                            not_shm[j]
                        )));
                    }
                    let link = TcpLink::new(s).map_err(|e| CclError::io("link", e))?;
                    let cc = link.choose_congestion(&cfg.tcp_congestion);
                    links[j] = Some(Box::new(link));
                    paths[j] = format!(
                        "rank {rank} -> {j} via TCP {} -> {} (congestion {cc}; not SHM: {}; not RDMA: {why})",
                        mine.data.ip(),
                        table[j].data,
                        not_shm[j]
                    );
                }
                None => {}
            }
        }
        paths.retain(|p| !p.is_empty());
        if cfg.debug {
            for p in &paths {
                eprintln!("monel INFO {p}");
            }
        }
        // Ranks sharing this host's cores: more of them than cores, and spinning ranks
        // must hand the core over at every idle round.
        // A peer shares this host's cores when it shares memory, this rank's address, or
        // this kernel (ranks in other network namespaces or containers, or made to look
        // like other hosts with MONEL_HOST, still run on these cores). The cores are those
        // the local ranks' affinity masks name together (a rank bound to one core by its
        // launcher sees only that one; see `cpus`).
        let kinds = || links.iter().flatten().map(|l| l.kind());
        let sharing: Vec<usize> = (0..nranks)
            .filter(|&j| {
                j == rank
                    || links[j].as_ref().is_some_and(|l| l.kind() == "SHM")
                    || table[j].data.ip() == mine.data.ip()
                    || (!mine.machine.is_empty() && table[j].machine == mine.machine)
            })
            .collect();
        let local = sharing.len();
        let cores = crate::cpus::shared_cores(sharing.iter().map(|&j| table[j].cpus.as_str()))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
        let yield_every = if local > cores { 1 } else { 64 };
        if cfg.debug {
            eprintln!(
                "monel INFO rank {rank}: {local} ranks share this machine's {cores} cores; \
                 waiting ranks {}",
                if yield_every == 1 {
                    "hand the core over at every idle round"
                } else {
                    "spin before sleeping"
                }
            );
        }
        let costs = tune::Costs::of(kinds(), local as f64 / cores as f64);
        let order = host_order(&table);
        let per_host = per_host(&table, &order);
        let hosts = (per_host > 1 && per_host < nranks).then(|| {
            let same = |j: usize| host_key(&table[j]) == host_key(&table[rank]);
            let of = |inside: bool| {
                let k = (0..nranks)
                    .filter(|&j| j != rank && same(j) == inside)
                    .filter_map(|j| links[j].as_ref().map(|l| l.kind()));
                tune::Costs::of(k, local as f64 / cores as f64)
            };
            tune::Hosts {
                per_host,
                local: of(true),
                net: of(false),
            }
        });
        if cfg.debug && hosts.is_some() {
            eprintln!(
                "monel INFO rank {rank}: {} hosts of {per_host} ranks; large AllReduces may \
                 go hierarchical (rings inside hosts, a ring between them)",
                nranks / per_host
            );
        }
        if cfg.debug && order.iter().enumerate().any(|(k, &x)| k != x) {
            eprintln!(
                "monel INFO rank {rank}: rings and trees take the ranks in the order {order:?} \
                 (ranks of one host next to each other)"
            );
        }
        status.lock().unwrap_or_else(PoisonError::into_inner).state = "idle";
        let mut comm = Self {
            rank,
            nranks,
            cfg,
            links: Links {
                links,
                closed: vec![false; nranks],
                mid_frame: vec![false; nranks],
            },
            table,
            seq: 0,
            status,
            stop,
            failed: None,
            paths,
            schedules: HashMap::default(),
            choices: [None; CHOICES],
            pool: Pool::default(),
            scratch: Vec::new(),
            p2p_sent: vec![0; nranks],
            p2p_received: vec![0; nranks],
            yield_every,
            core_share: (local, cores),
            costs,
            order,
            per_host,
            hosts,
            windows: Windows::default(),
            last_path: "",
            tiny_done: 0,
        };
        comm.agree_on_tuning()?;
        Ok(comm)
    }

    /// Gives every rank the same cost model, so all of them choose the same algorithm for
    /// a call. A rank prices the links it has, and ranks can see different ones (a pair that
    /// fell back from shared memory to TCP, a host with more ranks than cores); ranks that
    /// run different algorithms fail the call with a mismatch. One all-gather at init
    /// (direct, whatever the settings) of each rank's costs and of the settings that shape
    /// schedules; every rank then takes the slowest links any rank reported, and settings
    /// that differ are a [`ErrorKind::Mismatch`] naming the ranks, on every rank alike.
    fn agree_on_tuning(&mut self) -> Result<()> {
        let n = self.nranks;
        if n == 1 {
            return Ok(());
        }
        let mine = tuning::encode(&self.cfg, &self.costs, self.hosts.as_ref());
        let mut all = vec![0u8; tuning::LEN * n];
        let algo = self.cfg.algo.replace(Algorithm::Direct);
        let deterministic = std::mem::take(&mut self.cfg.deterministic);
        let res = self.all_gather(&mine, &mut all, tuning::LEN, DataType::U8);
        self.cfg.algo = algo;
        self.cfg.deterministic = deterministic;
        res?;
        let records: Vec<tuning::Record> =
            all.chunks_exact(tuning::LEN).map(tuning::decode).collect();
        if let Some(e) = tuning::disagreement(&records) {
            self.failed = Some(e.clone());
            return Err(e);
        }
        let (costs, hosts) = tuning::slowest(&records, self.hosts);
        if self.cfg.debug && (costs != self.costs || hosts != self.hosts) {
            eprintln!(
                "monel INFO rank {}: the cost model takes the slowest links any rank has \
                 ({:.1} us, {:.2} GB/s per step{}), as every rank does",
                self.rank,
                costs.alpha * 1e6,
                costs.beta / 1e9,
                hosts.map_or(String::new(), |h| format!(
                    "; inside hosts {:.1} us, {:.2} GB/s; between {:.1} us, {:.2} GB/s",
                    h.local.alpha * 1e6,
                    h.local.beta / 1e9,
                    h.net.alpha * 1e6,
                    h.net.beta / 1e9
                ))
            );
        }
        self.costs = costs;
        self.hosts = hosts;
        self.choices = [None; CHOICES];
        Ok(())
    }

    /// Joins from the launcher's environment (torchrun, Slurm, mpirun or `MONEL_*`), with
    /// the configuration from `MONEL_*` variables.
    pub fn from_env() -> Result<Self> {
        let l: Launch = launch_from(&|k| std::env::var(k).ok())?;
        let cfg = CommConfig::from_env()?;
        // The launcher names no rendezvous process: rank 0 serves it.
        if l.rank == 0 && std::env::var_os("MONEL_UNIQUE_ID").is_none() {
            serve_env_root(&l)?;
        }
        Self::init_rank(l.nranks, l.rank, &l.id, cfg)
    }

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
    fn choose_cached(&mut self, coll: Collective, dtype: DataType, count: usize) -> Algorithm {
        if let Some(a) = self.forced(coll) {
            return a;
        }
        let (code, bytes) = (coll.code(), count * dtype.size());
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
    pub fn collective(
        &mut self,
        coll: Collective,
        dtype: DataType,
        count: usize,
        io: Io<'_>,
    ) -> Result<()> {
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
                if let Some(res) = self.try_window(coll, dtype, count, sp, rp) {
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
                if let Some(res) = self.try_window(coll, dtype, count, sp, rp) {
                    return res;
                }
                Buffers::in_place(&mut buf[..len * es], io_, oo, dtype, op, n)
            }
        };
        let algo = self.choose_cached(coll, dtype, count);
        let mut begun = None;
        if algo == Algorithm::Direct
            && n == 2
            && matches!(coll, Collective::AllReduce(_))
            && count > 0
            && count * es <= TINY
        {
            let sig = self.begin(coll, dtype, count, Some(algo));
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
                let s = Arc::new(plan::schedule_ordered(
                    coll,
                    algo,
                    n,
                    r,
                    count,
                    slice,
                    in_place,
                    &self.order,
                    self.per_host,
                )?);
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
            None => self.begin(coll, dtype, count, Some(algo)),
        };
        if self.cfg.debug {
            eprintln!(
                "monel INFO rank {r}: {} via {} ({} steps)",
                describe_sig(&sig),
                algo.name(),
                sched.steps.len()
            );
        }
        self.last_path = algo.name();
        let res = self.execute(sig, &sched, &mut bufs, false);
        self.scratch = bufs.take_scratch();
        let res = match res {
            Err(e) if e.kind == ErrorKind::Timeout => {
                Err(self.name_missing(&describe_sig(&sig), e))
            }
            r => r,
        };
        self.conclude(sig, res)
    }

    /// A tiny AllReduce between two ranks by the direct algorithm, without the executor:
    /// the same frame as the schedule's goes out whole, and the peer's, if it is already
    /// there or comes within a short spin, is reduced straight out of the ring. The
    /// executor's general machinery cost more than the exchange itself: an 8-byte AllReduce
    /// went from 0.32 to 0.20 us on the 2-core development VM. Anything else (no frame yet, another frame first, an
    /// abort, a dead peer) goes to the executor with the rest of the schedule, which handles
    /// it as for every call. `None`: not taken and nothing sent (not a ring link, or no
    /// room in it), so the caller runs the whole schedule under the same `sig`.
    fn tiny_pair(
        &mut self,
        sig: Signature,
        op: RedOp,
        count: usize,
        bufs: &mut Buffers<'_>,
    ) -> Option<Result<()>> {
        let peer = 1 - self.rank;
        let (input, output) = (
            Span::of(Buf::Input, 0..count),
            Span::of(Buf::Output, 0..count),
        );
        let dtype = bufs.dtype();
        let mut mine = [0u8; TINY];
        let bytes = {
            let src = bufs.bytes(input).ok()?;
            mine[..src.len()].copy_from_slice(src);
            src.len()
        };
        if self.links.closed[peer] || self.links.mid_frame[peer] {
            return None;
        }
        let link = self.links.links[peer].as_mut()?;
        let hdr = Header {
            kind: FRAME_DATA,
            sig,
            len: bytes as u32,
        };
        if !link
            .write_whole(&hdr.encode(), &mine[..bytes])
            .unwrap_or(false)
        {
            return None;
        }
        // Sent. The peer's frame, reduced where it lies.
        let want = HEADER_LEN + bytes;
        let mut landed = None;
        for round in 0..TINY_SPINS {
            let r = link.read_in_place(want, &mut |b| {
                if b.len() < want
                    || Header::decode(b[..HEADER_LEN].try_into().expect("header")) != Some(hdr)
                {
                    return 0;
                }
                landed = Some(bufs.bytes_mut(output).map(|out| {
                    reduce::reduce_to(out, &mine[..bytes], &b[HEADER_LEN..], dtype, op);
                }));
                want
            });
            match (r, &landed) {
                (Some(Ok(_)), Some(_)) | (None | Some(Err(_)), _) => break,
                _ if self.yield_every == 1 || round % 64 == 63 => std::thread::yield_now(),
                _ => std::hint::spin_loop(),
            }
        }
        if matches!(landed, Some(Ok(()))) {
            self.tiny_done += 1;
        }
        let res = match landed {
            Some(Ok(())) if op == RedOp::Avg => bufs.divide(output).map_err(CclError::from),
            Some(r) => r.map_err(CclError::from),
            None => {
                // The executor takes it from here: the receive, then the average.
                let mut rest = Schedule::default();
                rest.steps.push(Step {
                    ops: vec![Op::RecvReduce {
                        peer,
                        acc: input,
                        dst: output,
                    }],
                });
                if op == RedOp::Avg {
                    rest.steps.push(Step {
                        ops: vec![Op::Divide { dst: output }],
                    });
                }
                self.execute(sig, &rest, bufs, false)
            }
        };
        if self.cfg.debug {
            eprintln!(
                "monel INFO rank {}: {} via direct (two-rank tiny path)",
                self.rank,
                describe_sig(&sig)
            );
        }
        Some(res)
    }

    /// Starts a collective: the next sequence number, its signature (with the algorithm
    /// its messages follow, if any), the status "running".
    fn begin(
        &mut self,
        coll: Collective,
        dtype: DataType,
        count: usize,
        algo: Option<Algorithm>,
    ) -> Signature {
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

    /// Runs the call directly ([`Self::run_direct`]) when its send and receive bytes (as
    /// many as the collective needs from `send` and `recv`, lengths checked by the caller)
    /// lie in this rank's shared windows and the direct path may run: no algorithm forced,
    /// and at least [`window::MIN_BYTES`] per rank (`count` elements: the same on every
    /// rank, so all ranks choose alike; below it two meetings cost more than the ordinary
    /// path). `None`: take the ordinary path.
    fn try_window(
        &mut self,
        coll: Collective,
        dtype: DataType,
        count: usize,
        send: *const u8,
        recv: *mut u8,
    ) -> Option<Result<()>> {
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
        Some(self.run_direct(coll, dtype, count, (send, s, send_len), (recv, r, recv_len)))
    }

    /// Runs a collective directly on window buffers ([`window::run`]).
    fn run_direct(
        &mut self,
        coll: Collective,
        dtype: DataType,
        count: usize,
        send: (*const u8, Loc, usize),
        recv: (*mut u8, Loc, usize),
    ) -> Result<()> {
        let sig = self.begin(coll, dtype, count, None);
        if self.cfg.debug {
            eprintln!(
                "monel INFO rank {}: {} via window (loads and stores between the ranks' \
                 shared buffers)",
                self.rank,
                describe_sig(&sig)
            );
        }
        self.last_path = "window";
        let call = window::Call {
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
        let region = match shared {
            Some(r) => r,
            None => Region::new(
                id,
                len,
                crate::shm::Segment::anonymous(window::HEADER + len)
                    .map_err(|e| CclError::io("window memory", e))?,
                Vec::new(),
            ),
        };
        if self.cfg.debug {
            eprintln!(
                "monel INFO rank {}: window {id} of {len} bytes {}",
                self.rank,
                if region.shared() {
                    "shared by every rank (collectives on it run directly)"
                } else {
                    "private (not every rank shares this host's memory)"
                }
            );
        }
        let region = Arc::new(region);
        self.windows.push(&region);
        Ok(Window::new(region))
    }

    /// Creates this rank's segment of `len` bytes and maps every peer's (see
    /// [`Communicator::alloc_window`]); `None` unless every rank mapped every segment.
    fn share_region(&mut self, id: usize, len: usize) -> Result<Option<Region>> {
        const REC: usize = 256;
        let (n, r) = (self.nranks, self.rank);
        let page = 4096;
        let total = window::HEADER + len.div_ceil(page).max(1) * page;
        let eligible = self.cfg.transports.shm
            && self.cfg.shm.enabled
            && (0..n).filter(|&j| j != r).all(|j| {
                self.links.links[j]
                    .as_ref()
                    .is_some_and(|l| l.kind() == "SHM")
            });
        let made = eligible
            .then(|| crate::shm::create_sized(&self.cfg.shm.dir, total).ok())
            .flatten();
        let mut rec = [0u8; REC];
        if let Some((path, _, nonce)) = &made {
            let p = path.as_os_str().as_encoded_bytes();
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
        let mut peers: Vec<Option<crate::shm::Segment>> = (0..n).map(|_| None).collect();
        let mut ok = gathered.is_ok() && rec[0] == 1;
        for j in (0..n).filter(|&j| j != r) {
            let f = &all[j * REC..(j + 1) * REC];
            let plen = usize::from(u16::from_le_bytes([f[25], f[26]]));
            if !ok || f[0] != 1 || plen > REC - 27 {
                ok = false;
                break;
            }
            let size = u64::from_le_bytes(f[1..9].try_into().expect("8 bytes")) as usize;
            let path =
                std::path::PathBuf::from(String::from_utf8_lossy(&f[27..27 + plen]).into_owned());
            match crate::shm::open_sized(&path, size, &f[9..25]) {
                Ok(seg) => peers[j] = Some(seg),
                Err(_) => ok = false,
            }
        }
        let mut flag = [u8::from(ok)];
        let agreed = gathered
            .and_then(|()| self.all_reduce_in_place(&mut flag, 1, DataType::U8, RedOp::Min));
        // Every rank has mapped what it could (it voted after): the names can go.
        if let Some((path, ..)) = &made {
            let _ = std::fs::remove_file(path);
        }
        agreed?;
        match made {
            Some((_, seg, _)) if flag[0] == 1 => Ok(Some(Region::new(id, len, seg, peers))),
            _ => Ok(None),
        }
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

    /// Turns a timeout into an error naming every rank that is not in this collective, with
    /// the operation it was last seen in (from each rank's status endpoint).
    fn name_missing(&self, what: &str, e: CclError) -> CclError {
        let mut missing = Vec::new();
        let mut notes = Vec::new();
        for (j, p) in self.table.iter().enumerate() {
            if j == self.rank {
                continue;
            }
            match query_status(p.status) {
                Ok((seq, text)) if seq < self.seq => {
                    missing.push(j);
                    let (state, op) = text.split_once(' ').unwrap_or((text.as_str(), ""));
                    notes.push(format!("rank {j} last seen in {op} ({state})"));
                }
                Ok(_) => {}
                // Gone, but it told us it reached this collective and gave up too.
                Err(_) if exec::gave_up_in(&self.links, j, self.seq) => {}
                Err(why) => {
                    missing.push(j);
                    notes.push(format!("rank {j} unreachable ({why}): dead?"));
                }
            }
        }
        if missing.is_empty() {
            return CclError::new(
                ErrorKind::Timeout,
                format!("{}; every rank is in it ({})", e.message, what),
            )
            .with_ranks(e.ranks);
        }
        CclError::new(
            ErrorKind::Timeout,
            format!(
                "{what}: timed out after {:.1} s; ranks {missing:?} never arrived: {}",
                self.cfg.timeout.as_secs_f64(),
                notes.join("; ")
            ),
        )
        .with_ranks(missing)
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
        self.links.links.iter_mut().for_each(|l| *l = None);
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
            Collective::AllReduce(op),
            dtype,
            count,
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
        self.collective(Collective::AllReduce(op), dtype, count, Io::InPlace(buf))
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
            Collective::Broadcast(root),
            dtype,
            count,
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
        self.collective(Collective::Broadcast(root), dtype, count, Io::InPlace(buf))
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
            Collective::Reduce(op, root),
            dtype,
            count,
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
            Collective::AllGather,
            dtype,
            count,
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
            Collective::ReduceScatter(op),
            dtype,
            count,
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
            Collective::AllToAll,
            dtype,
            count,
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
            Collective::Gather(root),
            dtype,
            count,
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
            Collective::Scatter(root),
            dtype,
            count,
            Io::Separate { send, recv },
        )
    }
    /// Barrier.
    pub fn barrier(&mut self) -> Result<()> {
        self.collective(Collective::Barrier, DataType::U8, 0, Io::InPlace(&mut []))
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
            let id = UniqueId::create(SocketAddr::new(ip, 0))?;
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

    /// Sends `count` elements of `buf` to `peer` (`ncclSend`). It returns once the data is
    /// on its way; a large message waits for `peer` to receive it, so two ranks that send to
    /// each other must do it in one [`Self::group`] (as with NCCL).
    pub fn send(&mut self, buf: &[u8], count: usize, dtype: DataType, peer: usize) -> Result<()> {
        self.group(vec![GroupOp::Send {
            buf,
            count,
            dtype,
            peer,
        }])
    }

    /// Receives `count` elements from `peer` into `buf` (`ncclRecv`). Messages between two
    /// ranks match in order; the counts must agree.
    pub fn recv(
        &mut self,
        buf: &mut [u8],
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        self.group(vec![GroupOp::Recv {
            buf,
            count,
            dtype,
            peer,
        }])
    }

    /// Runs operations as one group (`ncclGroupStart` .. `ncclGroupEnd`): every send and
    /// receive progresses at once, so any exchange pattern completes (all-to-all, rings,
    /// sends to self matched with receives from self in order); the collectives then run in
    /// the order given.
    pub fn group(&mut self, ops: Vec<GroupOp<'_>>) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(CclError::new(
                ErrorKind::Aborted,
                format!("communicator failed earlier: {e}"),
            ));
        }
        let n = self.nranks;
        let mut sends: Vec<(usize, &[u8])> = Vec::new();
        let mut recvs: Vec<(usize, &mut [u8])> = Vec::new();
        let mut colls = Vec::new();
        // The message's bytes, once its peer and buffer are checked.
        let bytes_of = |what: &str, peer: usize, count: usize, dtype: DataType, len: usize| {
            if peer >= n {
                return Err(CclError::invalid(format!(
                    "{what}: peer {peer} is not a rank (0..{n})"
                )));
            }
            let bytes = count.saturating_mul(dtype.size());
            if len < bytes {
                return Err(CclError::invalid(format!(
                    "{what}: buffer has {len} bytes, {count} {dtype} elements need {bytes}"
                )));
            }
            Ok(bytes)
        };
        // Empty messages are no-ops on both sides (as in NCCL).
        for op in ops {
            match op {
                GroupOp::Send {
                    buf,
                    count,
                    dtype,
                    peer,
                } => {
                    let b = bytes_of("send", peer, count, dtype, buf.len())?;
                    if b > 0 {
                        sends.push((peer, &buf[..b]));
                    }
                }
                GroupOp::Recv {
                    buf,
                    count,
                    dtype,
                    peer,
                } => {
                    let b = bytes_of("recv", peer, count, dtype, buf.len())?;
                    if b > 0 {
                        recvs.push((peer, &mut buf[..b]));
                    }
                }
                GroupOp::Collective {
                    coll,
                    dtype,
                    count,
                    io,
                } => colls.push((coll, dtype, count, io)),
            }
        }
        if !sends.is_empty() || !recvs.is_empty() {
            self.point_to_point(sends, recvs)?;
        }
        for (coll, dtype, count, io) in colls {
            self.collective(coll, dtype, count, io)?;
        }
        Ok(())
    }

    /// Runs a group's sends and receives as one step.
    fn point_to_point(
        &mut self,
        sends: Vec<(usize, &[u8])>,
        recvs: Vec<(usize, &mut [u8])>,
    ) -> Result<()> {
        let me = self.rank;
        let span = |buf, len| Span { buf, off: 0, len };
        let mut step = Vec::new();
        // Sends to self meet receives from self in order, as local copies.
        let self_recvs: Vec<usize> = (0..recvs.len()).filter(|&j| recvs[j].0 == me).collect();
        let mut self_sends = 0;
        for (i, (peer, b)) in sends.iter().enumerate() {
            let src = span(Buf::SendPart(part(i)?), b.len());
            if *peer != me {
                step.push(Op::Send { peer: *peer, src });
                continue;
            }
            let Some(&j) = self_recvs.get(self_sends) else {
                return Err(CclError::invalid(format!(
                    "send to self (rank {me}) without a matching recv from self in the group"
                )));
            };
            self_sends += 1;
            if recvs[j].1.len() != b.len() {
                return Err(CclError::invalid(format!(
                    "send to self of {} bytes meets a recv from self of {} bytes",
                    b.len(),
                    recvs[j].1.len()
                )));
            }
            step.push(Op::Copy {
                src,
                dst: span(Buf::RecvPart(part(j)?), b.len()),
            });
        }
        if self_sends != self_recvs.len() {
            return Err(CclError::invalid(format!(
                "recv from self (rank {me}) without a matching send to self in the group"
            )));
        }
        for (j, (peer, b)) in recvs.iter().enumerate() {
            if *peer != me {
                step.push(Op::Recv {
                    peer: *peer,
                    dst: span(Buf::RecvPart(part(j)?), b.len()),
                    reduce: false,
                });
            }
        }
        let total: usize = sends.iter().map(|s| s.1.len()).sum::<usize>()
            + recvs.iter().map(|r| r.1.len()).sum::<usize>();
        let sig = Signature {
            seq: 0,
            coll: exec::P2P_CODE,
            dtype: 0,
            op: 0,
            root: 0,
            count: total as u64,
            algo: 0,
        };
        {
            let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            st.sig = Some(sig);
            st.state = "running";
        }
        let sched = Schedule {
            steps: vec![Step { ops: step }],
            scratch: 0,
        };
        let mut bufs = Buffers::parts(
            sends.into_iter().map(|s| s.1).collect(),
            recvs.into_iter().map(|r| r.1).collect(),
            self.nranks,
        );
        let res = self.execute(sig, &sched, &mut bufs, true);
        self.conclude(sig, res)
    }

    /// Runs `sched` over the links within the timeout; `p2p`: with point-to-point numbering.
    fn execute(
        &mut self,
        sig: Signature,
        sched: &Schedule,
        bufs: &mut Buffers<'_>,
        p2p: bool,
    ) -> Result<()> {
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
            p2p: p2p.then_some(P2pSeqs {
                send: &mut self.p2p_sent,
                recv: &mut self.p2p_received,
            }),
        };
        exec::run(&mut ctx, sched, bufs, &mut self.pool)
    }
}

/// Bytes per rank up to which a two-rank direct AllReduce takes
/// [`Communicator::tiny_pair`].
const TINY: usize = 256;
/// Polls of the ring for the peer's frame before [`Communicator::tiny_pair`] hands the
/// call to the executor (tens of microseconds).
const TINY_SPINS: u32 = 2000;

/// Entries of [`Communicator`]'s cache of algorithm choices.
const CHOICES: usize = 64;

/// Bytes of a unique id's text in [`Communicator::split`]'s exchange.
const ID_LEN: usize = 128;

/// A group's part index.
fn part(i: usize) -> Result<u16> {
    u16::try_from(i).map_err(|_| CclError::invalid("more than 65535 sends or receives in a group"))
}

/// One operation of a [`Communicator::group`].
pub enum GroupOp<'a> {
    /// `ncclSend`.
    Send {
        /// The data.
        buf: &'a [u8],
        /// Elements.
        count: usize,
        /// Their type.
        dtype: DataType,
        /// Destination rank.
        peer: usize,
    },
    /// `ncclRecv`.
    Recv {
        /// Where the data lands.
        buf: &'a mut [u8],
        /// Elements.
        count: usize,
        /// Their type.
        dtype: DataType,
        /// Source rank.
        peer: usize,
    },
    /// A collective (as [`Communicator::collective`]), run after the group's sends and
    /// receives.
    Collective {
        /// Which.
        coll: Collective,
        /// Element type.
        dtype: DataType,
        /// Elements.
        count: usize,
        /// Buffers.
        io: Io<'a>,
    },
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.cfg.debug {
            for (j, l) in self.links.links.iter().enumerate() {
                if let Some(c) = l.as_ref().and_then(|l| l.counters()) {
                    eprintln!(
                        "monel INFO rank {} -> {j} {}: {c}",
                        self.rank,
                        l.as_ref().map_or("", |l| l.kind())
                    );
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
        self.stop.store(true, Ordering::Release);
        // Wake the status thread so it sees the flag.
        if let Some(me) = self.table.get(self.rank) {
            let _ = TcpStream::connect_timeout(&me.status, Duration::from_millis(100));
        }
    }
}

/// Rank 0 of an environment launch serves the rendezvous at the address the launcher gave.
fn serve_env_root(l: &Launch) -> Result<()> {
    crate::bootstrap::serve_at(l.id.root, l.id.token)
}

/// What ranks exchange at init to agree on the cost model ([`Communicator::agree_on_tuning`]).
mod tuning {
    use crate::comm::CommConfig;
    use crate::error::{CclError, ErrorKind};
    use monel_sched::plan::Algorithm;
    use monel_sched::tune::{Costs, Hosts};

    /// Bytes per rank: nine little-endian u64s.
    pub(super) const LEN: usize = 72;

    /// One rank's costs and schedule-shaping settings.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub(super) struct Record {
        pub(super) costs: Costs,
        /// Inside and between hosts, where the rank saw a host layout.
        pub(super) hosts: Option<(Costs, Costs)>,
        pub(super) chunk: u64,
        /// 0 when no algorithm is forced, else its [`Algorithm::code`].
        pub(super) algo: u64,
        pub(super) deterministic: u64,
    }

    impl Record {
        /// The settings every rank must share, by variable, as they print.
        fn settings(&self) -> [(&'static str, String); 3] {
            let algo = u8::try_from(self.algo)
                .ok()
                .and_then(Algorithm::from_code)
                .map_or("unset", Algorithm::name);
            [
                ("MONEL_ALGO", algo.to_string()),
                ("MONEL_CHUNK", self.chunk.to_string()),
                ("MONEL_DETERMINISTIC", self.deterministic.to_string()),
            ]
        }
    }

    pub(super) fn encode(cfg: &CommConfig, costs: &Costs, hosts: Option<&Hosts>) -> [u8; LEN] {
        let algo = cfg.algo.map_or(0, |a| u64::from(a.code()));
        // No host layout: NaN where the costs inside and between hosts go.
        let h = |f: fn(&Hosts) -> f64| hosts.map_or(f64::NAN, f).to_bits();
        let words = [
            costs.alpha.to_bits(),
            costs.beta.to_bits(),
            h(|h| h.local.alpha),
            h(|h| h.local.beta),
            h(|h| h.net.alpha),
            h(|h| h.net.beta),
            cfg.chunk as u64,
            algo,
            u64::from(cfg.deterministic),
        ];
        let mut out = [0u8; LEN];
        for (o, w) in out.chunks_exact_mut(8).zip(words) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    pub(super) fn decode(b: &[u8]) -> Record {
        let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let f = |i: usize| f64::from_bits(w(i));
        let costs = |i: usize| Costs {
            alpha: f(i),
            beta: f(i + 1),
        };
        Record {
            costs: costs(0),
            hosts: (!f(2).is_nan()).then(|| (costs(2), costs(4))),
            chunk: w(6),
            algo: w(7),
            deterministic: w(8),
        }
    }

    /// The error every rank reports when ranks were started with different `MONEL_ALGO`,
    /// `MONEL_CHUNK` or `MONEL_DETERMINISTIC`.
    pub(super) fn disagreement(records: &[Record]) -> Option<CclError> {
        let first = records.first()?.settings();
        for (k, (name, want)) in first.iter().enumerate() {
            let differ = |r: &Record| r.settings()[k].1 != *want;
            let odd: Vec<usize> = (0..records.len())
                .filter(|&j| differ(&records[j]))
                .collect();
            if let Some(&j) = odd.first() {
                return Some(
                    CclError::new(
                        ErrorKind::Mismatch,
                        format!(
                            "ranks disagree on {name}: rank 0 has {want}, ranks {odd:?} differ \
                             (rank {j} has {}); every rank needs the same {name}",
                            records[j].settings()[k].1
                        ),
                    )
                    .with_ranks(odd),
                );
            }
        }
        None
    }

    /// The slowest costs any rank reported: the largest latency and the smallest bandwidth,
    /// for the flat links and for the links inside and between hosts.
    pub(super) fn slowest(records: &[Record], hosts: Option<Hosts>) -> (Costs, Option<Hosts>) {
        let worse = |a: Costs, b: Costs| Costs {
            alpha: a.alpha.max(b.alpha),
            beta: a.beta.min(b.beta),
        };
        let flat = records.iter().map(|r| r.costs).reduce(worse);
        let hosts = hosts.map(|mut h| {
            for (local, net) in records.iter().filter_map(|r| r.hosts) {
                h.local = worse(h.local, local);
                h.net = worse(h.net, net);
            }
            h
        });
        (flat.unwrap_or(Costs::SHM), hosts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<CommConfig> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CommConfig::from_vars(&move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn tuning_records_round_trip_and_agree_on_the_slowest_links() {
        let cfg = with(&[("MONEL_ALGO", "tree"), ("MONEL_CHUNK", "65536")]).unwrap();
        let hosts = tune::Hosts {
            per_host: 2,
            local: tune::Costs::SHM,
            net: tune::Costs::ROCE,
        };
        let a = tuning::decode(&tuning::encode(&cfg, &tune::Costs::SHM, Some(&hosts)));
        assert_eq!(a.costs, tune::Costs::SHM);
        assert_eq!(a.hosts, Some((tune::Costs::SHM, tune::Costs::ROCE)));
        assert_eq!((a.chunk, a.deterministic), (65536, 0));
        let b = tuning::decode(&tuning::encode(
            &CommConfig::default(),
            &tune::Costs::TCP,
            None,
        ));
        assert_eq!((b.costs, b.hosts), (tune::Costs::TCP, None));
        // The slowest of each: TCP's latency and bandwidth flat; inside hosts, where only
        // one rank reported, its costs.
        let mut c = a;
        c.hosts = Some((tune::Costs::TCP, tune::Costs::ROCE));
        let (flat, h) = tuning::slowest(&[a, b, c], Some(hosts));
        assert_eq!(flat, tune::Costs::TCP);
        let h = h.unwrap();
        assert_eq!(
            (h.per_host, h.local, h.net),
            (2, tune::Costs::TCP, tune::Costs::ROCE)
        );
        // Settings: the first that differs is named, with the odd ranks.
        let e = tuning::disagreement(&[a, a, b]).unwrap();
        assert_eq!(e.ranks, vec![2]);
        assert!(e.message.contains("MONEL_ALGO: rank 0 has tree"), "{e}");
        assert!(e.message.contains("rank 2 has unset"), "{e}");
        assert!(tuning::disagreement(&[a, c]).is_none());
    }

    #[test]
    fn tcp_congestion_setting_parses_lists_and_system_and_names_bad_values() {
        assert_eq!(
            CommConfig::default().tcp_congestion,
            ["cubic".to_string(), "reno".to_string()]
        );
        let c = with(&[("MONEL_TCP_CONGESTION", "dctcp, reno")]).unwrap();
        assert_eq!(c.tcp_congestion, ["dctcp".to_string(), "reno".to_string()]);
        let c = with(&[("MONEL_TCP_CONGESTION", "system")]).unwrap();
        assert!(c.tcp_congestion.is_empty());
        for bad in ["", "cubic,", "a b", "sixteen_letters_", "bbr;rm"] {
            let e = with(&[("MONEL_TCP_CONGESTION", bad)]).unwrap_err();
            assert!(
                e.to_string().contains("MONEL_TCP_CONGESTION"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn host_order_groups_ranks_by_machine_and_host_and_counts_them() {
        let peer = |ip: &str, machine: &str, host: &str| PeerAddrs {
            data: format!("{ip}:1").parse().unwrap(),
            status: format!("{ip}:2").parse().unwrap(),
            machine: machine.into(),
            host: host.into(),
            cpus: String::new(),
        };
        // Two machines, ranks placed cyclically.
        let t = [
            peer("10.0.0.1", "m1", ""),
            peer("10.0.0.2", "m2", ""),
            peer("10.0.0.1", "m1", ""),
            peer("10.0.0.2", "m2", ""),
        ];
        assert_eq!(host_order(&t), [0, 2, 1, 3]);
        assert_eq!(per_host(&t, &host_order(&t)), 2);
        // One machine standing in for two hosts (MONEL_HOST); hosts in order of their
        // lowest rank.
        let t = [
            peer("10.0.0.1", "m", "b"),
            peer("10.0.0.1", "m", "a"),
            peer("10.0.0.1", "m", "b"),
            peer("10.0.0.1", "m", "a"),
            peer("10.0.0.1", "m", "a"),
        ];
        assert_eq!(host_order(&t), [0, 2, 1, 3, 4]);
        // Hosts of 2 and 3 ranks: no common size.
        assert_eq!(per_host(&t, &host_order(&t)), 0);
        // Unknown machines fall back to the address; placed host by host: the identity.
        let t = [
            peer("10.0.0.1", "", ""),
            peer("10.0.0.1", "", ""),
            peer("10.0.0.2", "", ""),
        ];
        assert_eq!(host_order(&t), [0, 1, 2]);
        assert_eq!(per_host(&t, &host_order(&t)), 0);
        assert_eq!(per_host(&t[..2], &[0, 1]), 2, "one host of two");
        assert_eq!(per_host(&t[1..], &[0, 1]), 1, "two hosts of one");
    }

    #[test]
    fn variables_overlay_defaults_and_bad_values_name_themselves() {
        let d = with(&[]).unwrap();
        assert!(d.rdma.gso && d.rdma.enabled);
        let c = with(&[("MONEL_RDMA_GSO", "0"), ("MONEL_RDMA_RING", "65536")]).unwrap();
        assert!(!c.rdma.gso);
        assert_eq!(c.rdma.ring, 65536);
        for (k, v) in [
            ("MONEL_RDMA_GSO", "yes"),
            ("MONEL_RDMA_RING", "12"),
            ("MONEL_TIMEOUT", "-1"),
        ] {
            let e = with(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }
}
