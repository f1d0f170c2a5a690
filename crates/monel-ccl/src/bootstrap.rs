//! Bootstrap: a unique id (the root's address and a random token, passed out of band) or the
//! environment of torchrun, Slurm or mpirun; a TCP rendezvous at the root that hands every
//! rank the table of everyone's addresses; then a full mesh of links.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::error::{CclError, Result};
use monel_verbs::greeter::Greeter;

const MAGIC_BOOT: &[u8; 4] = b"MNL2";
const MAGIC_HELLO: &[u8; 4] = b"MNLH";

/// Where the rendezvous is and the token every rank must present (NCCL's `ncclUniqueId`).
/// Printed as `monel1:<ip>:<port>:<32 hex digits>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueId {
    /// The root's rendezvous address.
    pub root: SocketAddr,
    /// 16 random bytes: a rank with another id is refused.
    pub token: [u8; 16],
}

impl UniqueId {
    /// Starts a rendezvous on `bind` (port 0 picks one) in a background thread that serves
    /// one communicator, and returns its id.
    pub fn create(bind: SocketAddr) -> Result<Self> {
        let l = TcpListener::bind(bind)
            .map_err(|e| CclError::io(format!("bind rendezvous {bind}"), e))?;
        let root = l
            .local_addr()
            .map_err(|e| CclError::io("rendezvous address", e))?;
        let mut token = [0u8; 16];
        getrandom::getrandom(&mut token)
            .map_err(|e| CclError::bootstrap(format!("random token: {e}")))?;
        let id = Self { root, token };
        serve_root(l, token);
        Ok(id)
    }

    /// The id a launcher's variables imply: every rank computes the same token from them.
    pub fn from_parts(root: SocketAddr, job: &str) -> Self {
        // FNV-1a over the job identity, twice with different seeds.
        let mut token = [0u8; 16];
        for (half, seed) in [
            (0usize, 0xcbf2_9ce4_8422_2325u64),
            (8, 0x8422_2325_cbf2_9ce4),
        ] {
            let mut h = seed;
            for b in job.bytes().chain(root.to_string().bytes()) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
            token[half..half + 8].copy_from_slice(&h.to_le_bytes());
        }
        Self { root, token }
    }
}

impl std::fmt::Display for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "monel1:{}:", self.root)?;
        for b in self.token {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for UniqueId {
    type Err = CclError;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            CclError::bootstrap(format!(
                "not a Monel unique id: {s:?} (want monel1:<ip>:<port>:<32 hex digits>)"
            ))
        };
        let rest = s.strip_prefix("monel1:").ok_or_else(bad)?;
        let (addr, hex) = rest.rsplit_once(':').ok_or_else(bad)?;
        let root: SocketAddr = addr.parse().map_err(|_| bad())?;
        if hex.len() != 32 {
            return Err(bad());
        }
        let mut token = [0u8; 16];
        for (i, t) in token.iter_mut().enumerate() {
            *t = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self { root, token })
    }
}

/// Where this rank's bootstrap came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launch {
    /// This rank.
    pub rank: usize,
    /// Ranks in all.
    pub nranks: usize,
    /// Rank on this host.
    pub local_rank: usize,
    /// The rendezvous.
    pub id: UniqueId,
    /// Which launcher's variables were read (`torchrun`, `slurm`, `mpirun`, `unique id`).
    pub source: &'static str,
}

fn var(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| env(n))
}

fn num(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Result<Option<usize>> {
    match var(env, names) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| CclError::bootstrap(format!("{} is not a number: {v:?}", names[0]))),
    }
}

/// Reads the launch from environment variables (`env` looks one up): `MONEL_UNIQUE_ID`
/// with `MONEL_RANK`/`MONEL_NRANKS`; torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `MASTER_ADDR`, `MASTER_PORT`; Slurm's `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`;
/// Open MPI's `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`.
/// Slurm and mpirun need `MASTER_ADDR` and `MASTER_PORT` too (they name no rendezvous).
pub(crate) fn launch_from(env: &dyn Fn(&str) -> Option<String>) -> Result<Launch> {
    let (rank, nranks, local, source) = if let Some(r) = num(env, &["MONEL_RANK"])? {
        let n = num(env, &["MONEL_NRANKS"])?
            .ok_or_else(|| CclError::bootstrap("MONEL_RANK is set but MONEL_NRANKS is not"))?;
        (r, n, num(env, &["MONEL_LOCAL_RANK"])?.unwrap_or(r), "monel")
    } else if let (Some(r), Some(n)) = (num(env, &["RANK"])?, num(env, &["WORLD_SIZE"])?) {
        (r, n, num(env, &["LOCAL_RANK"])?.unwrap_or(0), "torchrun")
    } else if let (Some(r), Some(n)) = (
        num(env, &["OMPI_COMM_WORLD_RANK"])?,
        num(env, &["OMPI_COMM_WORLD_SIZE"])?,
    ) {
        (
            r,
            n,
            num(env, &["OMPI_COMM_WORLD_LOCAL_RANK"])?.unwrap_or(0),
            "mpirun",
        )
    } else if let (Some(r), Some(n)) = (num(env, &["SLURM_PROCID"])?, num(env, &["SLURM_NTASKS"])?)
    {
        (r, n, num(env, &["SLURM_LOCALID"])?.unwrap_or(0), "slurm")
    } else {
        return Err(CclError::bootstrap(
            "no launcher found: set MONEL_UNIQUE_ID with MONEL_RANK and MONEL_NRANKS, or run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Slurm or mpirun (with MASTER_ADDR and MASTER_PORT)",
        ));
    };
    if nranks == 0 || rank >= nranks {
        return Err(CclError::bootstrap(format!(
            "rank {rank} is not below the rank count {nranks}"
        )));
    }
    let id = if let Some(s) = var(env, &["MONEL_UNIQUE_ID"]) {
        s.parse()?
    } else {
        let addr = var(env, &["MASTER_ADDR"]).ok_or_else(|| {
            CclError::bootstrap(format!("{source} launch: MASTER_ADDR is not set"))
        })?;
        let port = num(env, &["MASTER_PORT"])?.ok_or_else(|| {
            CclError::bootstrap(format!("{source} launch: MASTER_PORT is not set"))
        })?;
        let port = u16::try_from(port)
            .map_err(|_| CclError::bootstrap(format!("MASTER_PORT {port} is not a port")))?;
        let root = (addr.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| CclError::bootstrap(format!("MASTER_ADDR {addr:?} does not resolve")))?;
        let job = var(
            env,
            &[
                "TORCHELASTIC_RUN_ID",
                "SLURM_JOB_ID",
                "OMPI_MCA_ess_base_jobid",
            ],
        )
        .unwrap_or_default();
        UniqueId::from_parts(root, &format!("{job}/{nranks}"))
    };
    Ok(Launch {
        rank,
        nranks,
        local_rank: local,
        id,
        source,
    })
}

/// What each rank tells the root and the root tells everyone.
#[derive(Debug, Clone)]
pub(crate) struct PeerAddrs {
    pub(crate) data: SocketAddr,
    pub(crate) status: SocketAddr,
    /// The running kernel's identity ([`this_machine`]): ranks that share it share the
    /// machine's cores, whatever their addresses or namespaces (empty when unknown).
    pub(crate) machine: String,
    /// The host this rank names itself part of (`MONEL_HOST`; empty when unset): ranks on
    /// one machine that name different hosts stand in for separate hosts.
    pub(crate) host: String,
    /// The cores this rank may run on (`crate::cpus`): its affinity mask and its own count.
    pub(crate) cpus: String,
}

/// This kernel's boot id, which network namespaces and containers on one machine share:
/// ranks with the same one compete for the same cores. Empty when it cannot be read.
pub(crate) fn this_machine() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().chars().take(64).collect())
        .unwrap_or_default()
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u16).to_le_bytes());
    out.extend(s.as_bytes());
}

fn get_str(s: &mut impl Read) -> std::io::Result<String> {
    let mut l = [0u8; 2];
    s.read_exact(&mut l)?;
    let mut b = vec![0u8; u16::from_le_bytes(l) as usize];
    s.read_exact(&mut b)?;
    String::from_utf8(b).map_err(|_| std::io::ErrorKind::InvalidData.into())
}

fn get_u32(s: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Serves a rendezvous at `addr` with `token` (rank 0 of a launcher-started job).
pub(crate) fn serve_at(addr: SocketAddr, token: [u8; 16]) -> Result<()> {
    let l = TcpListener::bind(addr).map_err(|e| {
        CclError::io(
            format!("rank 0: serve the rendezvous at {addr} (MASTER_ADDR:MASTER_PORT)"),
            e,
        )
    })?;
    serve_root(l, token);
    Ok(())
}

/// Most ranks a communicator may have (frame headers carry a root in 24 bits).
pub(crate) const MAX_RANKS: usize = 1 << 24;

/// Different rank counts the root keeps registrations for at once (a real job has one; each
/// forged count gets a group of its own, which never fills).
const MAX_GROUPS: usize = 8;

/// How long a connection may take to send its registration.
const REGISTRATION_TIME: Duration = Duration::from_secs(5);

/// One rank's registration: token, rank count, rank, and its five address strings.
type Registration = ([u8; 16], u32, u32, [String; 5]);

pub(crate) fn read_registration(s: &mut impl Read) -> std::io::Result<Registration> {
    let mut m = [0u8; 4];
    s.read_exact(&mut m)?;
    if &m != MAGIC_BOOT {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a Monel registration",
        ));
    }
    let mut t = [0u8; 16];
    s.read_exact(&mut t)?;
    let n = get_u32(s)?;
    let r = get_u32(s)?;
    let addrs = [
        get_str(s)?,
        get_str(s)?,
        get_str(s)?,
        get_str(s)?,
        get_str(s)?,
    ];
    Ok((t, n, r, addrs))
}

fn refuse(mut s: TcpStream, why: &str) {
    let mut out = MAGIC_BOOT.to_vec();
    out.push(1);
    put_str(&mut out, why);
    let _ = s.write_all(&out);
}

/// The root: collects one registration per rank, then sends everyone the table.
///
/// Every connection is read on its own ([`crate::accept`]), so silent ones delay nobody.
/// Registrations are kept by the rank count they claim, and the first count whose ranks all
/// registered forms the communicator: a registration claiming another count (or an absurd
/// one) cannot lock the real ranks out or make the root allocate for it. A wrong token, a
/// rank out of range or a rank already taken is refused with a message.
fn serve_root(l: TcpListener, token: [u8; 16]) {
    std::thread::Builder::new()
        .name("monel-root".into())
        .spawn(move || {
            let Ok(mut greeter) = Greeter::new(
                l,
                |s: &mut TcpStream| read_registration(s),
                REGISTRATION_TIME,
                "rendezvous",
            ) else {
                return;
            };
            let mut groups: HashMap<usize, BTreeMap<usize, (TcpStream, [String; 5])>> =
                HashMap::new();
            let formed = loop {
                let Ok(next) = greeter.next(Duration::from_secs(1)) else {
                    return;
                };
                let Some((s, peer, (t, n, r, addrs))) = next else {
                    continue;
                };
                let (n, r) = (n as usize, r as usize);
                let why = if t != token {
                    Some("wrong unique id: this rendezvous serves another communicator".into())
                } else if n == 0 || n > MAX_RANKS {
                    Some(format!("rank count {n} is not in 1..={MAX_RANKS}"))
                } else if r >= n {
                    Some(format!("rank {r} is out of range for {n} ranks"))
                } else if !groups.contains_key(&n) && groups.len() >= MAX_GROUPS {
                    Some(format!(
                        "too many different rank counts claimed; {n} refused"
                    ))
                } else if groups.get(&n).is_some_and(|g| g.contains_key(&r)) {
                    Some(format!("rank {r} is already taken"))
                } else {
                    None
                };
                if let Some(why) = why {
                    greeter.drop_one(peer, &why);
                    refuse(s, &why);
                    continue;
                }
                let group = groups.entry(n).or_default();
                group.insert(r, (s, addrs));
                if group.len() == n {
                    break n;
                }
            };
            let ranks = groups.remove(&formed).unwrap_or_default();
            let mut table = MAGIC_BOOT.to_vec();
            table.push(0);
            for (_, addrs) in ranks.values() {
                for a in addrs {
                    put_str(&mut table, a);
                }
            }
            for (_, (mut s, _)) in ranks {
                let _ = s.write_all(&table);
            }
            for (n, group) in groups {
                for (_, (s, _)) in group {
                    refuse(
                        s,
                        &format!("a communicator of {formed} ranks formed, not one of {n}"),
                    );
                }
            }
        })
        .expect("spawn rendezvous thread");
}

/// Registers with the root and returns everyone's addresses. Retries the connection until
/// `deadline` (the root may start later than this rank).
pub(crate) fn rendezvous(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    mine: &PeerAddrs,
    deadline: Instant,
) -> Result<Vec<PeerAddrs>> {
    let mut s = loop {
        match TcpStream::connect_timeout(&id.root, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(CclError::bootstrap(format!(
                    "rank {rank}: no rendezvous at {} ({e})",
                    id.root
                )));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let mut out = MAGIC_BOOT.to_vec();
    out.extend(id.token);
    out.extend((nranks as u32).to_le_bytes());
    out.extend((rank as u32).to_le_bytes());
    put_str(&mut out, &mine.data.to_string());
    put_str(&mut out, &mine.status.to_string());
    put_str(&mut out, &mine.machine);
    put_str(&mut out, &mine.host);
    put_str(&mut out, &mine.cpus);
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    let _ = s.set_read_timeout(Some(left));
    let io = |e: std::io::Error| {
        CclError::bootstrap(format!("rank {rank}: rendezvous at {}: {e}", id.root))
    };
    s.write_all(&out).map_err(io)?;
    let mut m = [0u8; 5];
    s.read_exact(&mut m).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            CclError::new(
                crate::ErrorKind::Timeout,
                format!(
                    "rank {rank}: not every rank reached the rendezvous at {} in time",
                    id.root
                ),
            )
        } else {
            io(e)
        }
    })?;
    if &m[..4] != MAGIC_BOOT {
        return Err(CclError::bootstrap(format!(
            "rank {rank}: {} is not a Monel rendezvous",
            id.root
        )));
    }
    if m[4] != 0 {
        let why = get_str(&mut s).unwrap_or_default();
        return Err(CclError::bootstrap(format!(
            "rank {rank}: the rendezvous refused this rank: {why}"
        )));
    }
    read_table(&mut s, nranks, &io)
}

/// The rendezvous table: every rank's addresses, in rank order.
pub(crate) fn read_table<R: Read>(
    s: &mut R,
    nranks: usize,
    io: &dyn Fn(std::io::Error) -> CclError,
) -> Result<Vec<PeerAddrs>> {
    let mut table = Vec::with_capacity(nranks.min(MAX_RANKS));
    for _ in 0..nranks {
        let parse = |t: String| {
            t.parse::<SocketAddr>()
                .map_err(|_| CclError::bootstrap("bad address in the rendezvous table"))
        };
        let data = parse(get_str(s).map_err(io)?)?;
        let status = parse(get_str(s).map_err(io)?)?;
        let machine = get_str(s).map_err(io)?;
        let host = get_str(s).map_err(io)?;
        let cpus = get_str(s).map_err(io)?;
        table.push(PeerAddrs {
            data,
            status,
            machine,
            host,
            cpus,
        });
    }
    Ok(table)
}

/// How long a connection to the mesh listener may take to say who it is.
const HELLO_TIME: Duration = Duration::from_secs(5);

/// A mesh connection's hello: the token and the dialer's rank.
pub(crate) fn read_hello(s: &mut impl Read) -> std::io::Result<([u8; 16], u32)> {
    let mut h = [0u8; 24];
    s.read_exact(&mut h)?;
    if &h[..4] != MAGIC_HELLO {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a Monel hello",
        ));
    }
    let t = h[4..20].try_into().expect("16 bytes");
    Ok((
        t,
        u32::from_le_bytes(h[20..24].try_into().expect("4 bytes")),
    ))
}

/// Connects the full mesh: dials every lower rank, accepts every higher one. Each
/// connection opens with the token and the dialer's rank; the listener reads every
/// connection's hello on its own, so a silent or garbled one delays nobody.
pub(crate) fn mesh(
    listener: &TcpListener,
    table: &[PeerAddrs],
    rank: usize,
    token: [u8; 16],
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let n = table.len();
    let mut out: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    for (j, peer) in table.iter().enumerate().take(rank) {
        let mut s =
            TcpStream::connect_timeout(&peer.data, Duration::from_secs(5)).map_err(|e| {
                CclError::io(
                    format!("rank {rank}: connect to rank {j} at {}", peer.data),
                    e,
                )
            })?;
        let mut hello = MAGIC_HELLO.to_vec();
        hello.extend(token);
        hello.extend((rank as u32).to_le_bytes());
        s.write_all(&hello)
            .map_err(|e| CclError::io(format!("rank {rank}: hello to rank {j}"), e))?;
        out[j] = Some(s);
    }
    let listener = listener
        .try_clone()
        .map_err(|e| CclError::io("listener", e))?;
    let mut greeter = Greeter::new(
        listener,
        |s: &mut TcpStream| read_hello(s),
        HELLO_TIME,
        "mesh",
    )
    .map_err(|e| CclError::io("listener", e))?;
    while out.iter().enumerate().any(|(j, s)| j > rank && s.is_none()) {
        let left = deadline.saturating_duration_since(Instant::now());
        match greeter.next(left).map_err(|e| CclError::io("accept", e))? {
            Some((s, peer, (t, j))) => {
                let j = j as usize;
                if t != token {
                    greeter.drop_one(peer, &"wrong token: not a rank of this communicator");
                } else if j <= rank || j >= n || out[j].is_some() {
                    greeter.drop_one(peer, &format!("rank {j} is not expected here"));
                } else {
                    let _ = s.set_read_timeout(None);
                    out[j] = Some(s);
                }
            }
            None if Instant::now() >= deadline => {
                let missing: Vec<usize> = (rank + 1..n).filter(|&j| out[j].is_none()).collect();
                return Err(CclError::new(
                    crate::ErrorKind::Timeout,
                    format!("rank {rank}: ranks {missing:?} never connected"),
                )
                .with_ranks(missing));
            }
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_and_rejects_garbage() {
        let id = UniqueId {
            root: "127.0.0.1:4242".parse().unwrap(),
            token: [0xab; 16],
        };
        assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        assert!("monel1:127.0.0.1:4242:abc".parse::<UniqueId>().is_err());
        assert!("nccl:1".parse::<UniqueId>().is_err());
    }

    #[test]
    fn launchers_environments() {
        let torch = |k: &str| match k {
            "RANK" => Some("1".into()),
            "WORLD_SIZE" => Some("4".into()),
            "LOCAL_RANK" => Some("1".into()),
            "MASTER_ADDR" => Some("127.0.0.1".into()),
            "MASTER_PORT" => Some("29500".into()),
            _ => None,
        };
        let l = launch_from(&torch).unwrap();
        assert_eq!(
            (l.rank, l.nranks, l.local_rank, l.source),
            (1, 4, 1, "torchrun")
        );
        assert_eq!(l.id.root, "127.0.0.1:29500".parse().unwrap());
        let slurm = |k: &str| match k {
            "SLURM_PROCID" => Some("3".into()),
            "SLURM_NTASKS" => Some("8".into()),
            "SLURM_LOCALID" => Some("1".into()),
            "SLURM_JOB_ID" => Some("77".into()),
            "MASTER_ADDR" => Some("127.0.0.1".into()),
            "MASTER_PORT" => Some("29501".into()),
            _ => None,
        };
        let s = launch_from(&slurm).unwrap();
        assert_eq!(
            (s.rank, s.nranks, s.local_rank, s.source),
            (3, 8, 1, "slurm")
        );
        let ompi = |k: &str| match k {
            "OMPI_COMM_WORLD_RANK" => Some("0".into()),
            "OMPI_COMM_WORLD_SIZE" => Some("2".into()),
            _ => None,
        };
        let e = launch_from(&ompi).unwrap_err();
        assert!(e.message.contains("MASTER_ADDR"), "{e}");
        let bad = |k: &str| match k {
            "RANK" => Some("4".into()),
            "WORLD_SIZE" => Some("4".into()),
            _ => None,
        };
        assert!(launch_from(&bad).unwrap_err().message.contains("not below"));
        assert!(
            launch_from(&|_: &str| None)
                .unwrap_err()
                .message
                .contains("no launcher")
        );
    }

    #[test]
    fn the_table_carries_each_ranks_machine_host_and_cores() {
        let id = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
        let me = this_machine();
        assert!(!me.is_empty(), "a Linux kernel has a boot id");
        assert_eq!(me, this_machine());
        let hs: Vec<_> = ["", "kernel-b"]
            .into_iter()
            .enumerate()
            .map(|(r, m)| {
                let (id, m) = (id.clone(), m.to_string());
                std::thread::spawn(move || {
                    let mine = PeerAddrs {
                        data: format!("127.0.0.1:{}", 1000 + r).parse().unwrap(),
                        status: format!("127.0.0.1:{}", 2000 + r).parse().unwrap(),
                        machine: m,
                        host: format!("h{r}"),
                        cpus: format!("{r}/1"),
                    };
                    let deadline = Instant::now() + Duration::from_secs(10);
                    rendezvous(&id, 2, r, &mine, deadline).unwrap()
                })
            })
            .collect();
        for h in hs {
            let t = h.join().unwrap();
            let got: Vec<_> = t
                .iter()
                .map(|p| {
                    (
                        p.data.port(),
                        p.status.port(),
                        p.machine.as_str(),
                        p.host.as_str(),
                        p.cpus.as_str(),
                    )
                })
                .collect();
            assert_eq!(
                got,
                [
                    (1000, 2000, "", "h0", "0/1"),
                    (1001, 2001, "kernel-b", "h1", "1/1")
                ]
            );
        }
    }
}
