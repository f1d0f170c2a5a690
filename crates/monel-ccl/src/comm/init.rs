//! Joining a communicator: rendezvous, the mesh of connections, a transport per pair,
//! and how the ranks on this host share its cores.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use monel_sched::tune::{self, TransportKind};

use super::{
    CHOICES, CommConfig, Communicator, Status, host_key, host_order, per_host, serve_status,
};
use crate::bootstrap::{Launch, PeerAddrs, UniqueId, launch_from, mesh, rendezvous};
use crate::error::{CclError, Result};
use crate::exec::{Links, Pool};
use crate::transport::{self};
use crate::window::Windows;

impl Communicator {
    /// Joins from the launcher's environment (torchrun, Slurm, mpirun or `MONEL_*`), with
    /// the configuration from `MONEL_*` variables.
    pub fn from_env() -> Result<Self> {
        let l: Launch = launch_from(&|k| std::env::var(k).ok())?;
        let cfg = CommConfig::from_env()?;
        // The launcher names no rendezvous process: rank 0 serves it.
        if l.rank == 0 && std::env::var_os("MONEL_UNIQUE_ID").is_none() {
            serve_env_root(&l, &cfg)?;
        }
        if l.public_token && cfg.secret.is_none() {
            crate::log::unauthenticated(l.source);
        }
        Self::init_rank(l.nranks, l.rank, &l.id, cfg)
    }

    /// Joins the communicator `id` names as rank `rank` of `nranks` (`ncclCommInitRank`).
    pub fn init_rank(nranks: usize, rank: usize, id: &UniqueId, cfg: CommConfig) -> Result<Self> {
        // A malformed MONEL_DEBUG only costs the logs here; `CommConfig::from_env` refuses it.
        let _ = crate::log::init_from_env();
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
        // Listen on the local address the root is reached from: the route's source (a
        // lookup that sends nothing, so the root sees no stray connection). Retry until the
        // deadline while there is no route yet.
        let local_ip = loop {
            match monel_verbs::route_source(id.root) {
                Ok(ip) => break ip,
                Err(e) if Instant::now() >= deadline => {
                    return Err(CclError::io(
                        format!("rank {rank}: no route to the rendezvous at {}", id.root),
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
        let key = id.job_key(cfg.secret.as_ref());
        serve_status(status_l, status.clone(), stop.clone(), key.clone());
        let table = rendezvous(id, &key, nranks, rank, &mine, deadline)?;
        let streams = mesh(&listener, &table, rank, &key, deadline)?;
        let mut shm_cfg = cfg.shm.clone();
        shm_cfg.enabled &= cfg.transports.shm;
        let mut rdma_cfg = cfg.rdma.clone();
        rdma_cfg.enabled &= cfg.transports.rdma;
        if cfg.doctor {
            let local = (0..nranks)
                .filter(|&j| host_key(&table[j]) == host_key(&table[rank]))
                .count() as u64;
            crate::doctor::at_init(
                rank,
                crate::doctor::Shape {
                    local,
                    remote: nranks as u64 - local,
                    shm_ring: if shm_cfg.enabled {
                        shm_cfg.ring as u64
                    } else {
                        0
                    },
                    rdma_ring: if rdma_cfg.enabled {
                        rdma_cfg.ring as u64
                    } else {
                        0
                    },
                    pins: rdma_cfg.enabled
                        && monel_verbs::rdma_core::device::first_usable(
                            rdma_cfg.hca.as_ref(),
                            &rdma_cfg.gid,
                        )
                        .is_ok(),
                },
            )?;
        }
        let peers: Vec<SocketAddr> = table.iter().map(|t| t.data).collect();
        let (links, paths) = transport::connect(
            streams,
            &transport::Plan {
                rank,
                local_ip,
                peers: &peers,
                shm: &shm_cfg,
                rdma: &rdma_cfg,
                tcp: cfg.transports.tcp,
                tcp_congestion: &cfg.tcp_congestion,
                deadline,
            },
        )?;
        for p in &paths {
            tracing::info!(target: "monel::init","{p}");
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
                    || links[j]
                        .as_ref()
                        .is_some_and(|l| l.kind() == TransportKind::Shm)
                    || table[j].data.ip() == mine.data.ip()
                    || (!mine.machine.is_empty() && table[j].machine == mine.machine)
            })
            .collect();
        let local = sharing.len();
        let cores = crate::cpus::shared_cores(sharing.iter().map(|&j| table[j].cpus.as_str()))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
        let yield_every = if local > cores { 1 } else { 64 };
        tracing::info!(
            target: "monel::init",
            "rank {rank}: {local} ranks share this machine's {cores} cores; \
             waiting ranks {}",
            if yield_every == 1 {
                "hand the core over at every idle round"
            } else {
                "spin before sleeping"
            }
        );
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
        if hosts.is_some() {
            tracing::info!(
                target: "monel::init",
                "rank {rank}: {} hosts of {per_host} ranks; large AllReduces may \
                 go hierarchical (rings inside hosts, a ring between them)",
                nranks / per_host
            );
        }
        if order.iter().enumerate().any(|(k, &x)| k != x) {
            tracing::info!(
                target: "monel::init",
                "rank {rank}: rings and trees take the ranks in the order {order:?} \
                 (ranks of one host next to each other)"
            );
        }
        status.lock().unwrap_or_else(PoisonError::into_inner).state = "idle";
        let status_addrs = table.iter().map(|t| t.status).collect();
        Self::assemble(
            rank,
            cfg,
            links,
            Parts {
                table,
                paths,
                status,
                stop,
                key,
                yield_every,
                core_share: (local, cores),
                costs,
                order,
                per_host,
                hosts,
                status_addrs,
            },
        )
    }

    /// The communicator of `rank` over `links` (by peer; `None` for itself), once the ranks
    /// agree on the cost model.
    fn assemble(
        rank: usize,
        cfg: CommConfig,
        links: Vec<Option<Box<dyn transport::Link>>>,
        p: Parts,
    ) -> Result<Self> {
        let nranks = links.len();
        let mut comm = Self {
            rank,
            nranks,
            cfg,
            links: Links::new(links),
            table: p.table,
            seq: 0,
            status: p.status,
            stop: p.stop,
            failed: None,
            paths: p.paths,
            schedules: HashMap::default(),
            choices: [None; CHOICES],
            pool: Pool::default(),
            scratch: Vec::new(),
            p2p_sent: vec![0; nranks],
            p2p_received: vec![0; nranks],
            stash: Default::default(),
            yield_every: p.yield_every,
            core_share: p.core_share,
            costs: p.costs,
            order: p.order,
            per_host: p.per_host,
            hosts: p.hosts,
            windows: Windows::default(),
            status_addrs: p.status_addrs,
            key: p.key,
            last_path: "",
            tiny_done: 0,
        };
        comm.agree_on_tuning()?;
        Ok(comm)
    }

    /// Rank `rank`'s communicator over `links` made in this process (the in-memory links of
    /// the tests), with no bootstrap, status service or liveness check: every rank is a
    /// thread here, one host with one core per rank.
    #[cfg(test)]
    pub(crate) fn over_links(
        rank: usize,
        links: Vec<Option<Box<dyn transport::Link>>>,
        mut cfg: CommConfig,
    ) -> Result<Self> {
        let n = links.len();
        cfg.liveness = Duration::ZERO;
        let here = || PeerAddrs {
            data: SocketAddr::from(([127, 0, 0, 1], 0)),
            status: SocketAddr::from(([127, 0, 0, 1], 0)),
            machine: String::new(),
            host: String::new(),
            cpus: String::new(),
        };
        let kinds: Vec<TransportKind> = links.iter().flatten().map(|l| l.kind()).collect();
        Self::assemble(
            rank,
            cfg,
            links,
            Parts {
                table: (0..n).map(|_| here()).collect(),
                paths: Vec::new(),
                status: Arc::new(Mutex::new(Status {
                    seq: 0,
                    sig: None,
                    state: "idle",
                })),
                stop: Arc::new(AtomicBool::new(false)),
                key: monel_peer::Key::from_secret(b"in-memory"),
                yield_every: 1,
                core_share: (n, n),
                costs: tune::Costs::of(kinds, 1.0),
                order: (0..n).collect(),
                per_host: n,
                hosts: None,
                status_addrs: (0..n).map(|_| here().status).collect(),
            },
        )
    }
}

/// What a communicator takes from its bootstrap besides the links.
struct Parts {
    table: Vec<PeerAddrs>,
    paths: Vec<String>,
    status: Arc<Mutex<Status>>,
    stop: Arc<AtomicBool>,
    key: monel_peer::Key,
    yield_every: u32,
    core_share: (usize, usize),
    costs: tune::Costs,
    order: Vec<usize>,
    per_host: usize,
    hosts: Option<tune::Hosts>,
    status_addrs: Vec<SocketAddr>,
}

/// Rank 0 of an environment launch serves the rendezvous at the address the launcher gave.
pub(super) fn serve_env_root(l: &Launch, cfg: &CommConfig) -> Result<()> {
    crate::bootstrap::serve_at(l.id.root, l.id.job_key(cfg.secret.as_ref()))
}
