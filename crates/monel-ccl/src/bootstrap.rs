//! Bootstrap: a unique id (the root's address and a random token, passed out of band) or the
//! environment of torchrun, Slurm or mpirun; a TCP rendezvous at the root that hands every
//! rank the table of everyone's addresses; then a full mesh of links.
//!
//! Every connection is a mutual challenge-response under the job key (see
//! [`UniqueId::job_key`]): the side that accepts sends a fresh nonce, the side that dials
//! answers with its own nonce and an HMAC over both, its rank, the rank count and what it
//! sends; the acceptor answers with an HMAC of its own over the same. A rank is trusted only
//! once it proved the key, and each mesh link gets a key of its own from both nonces.
//!
//! ```text
//! rendezvous  root -> rank  "MNL3" nonce_r
//!             rank -> root  "MNL3" n r addrs[5] nonce_c proof("register", nonce_r, nonce_c, n, r, addrs)
//!             root -> rank  "MNL3" 0 len table proof("table", nonce_c, nonce_r, r, table)
//!                           (or "MNL3" 1 reason: refused)
//! mesh        i -> j        "MNLH" nonce_i
//!             j -> i        "MNLH" j nonce_j proof("hello", nonce_i, nonce_j, j, i)
//!             i -> j        "MNLH" proof("welcome", nonce_j, nonce_i, i, j)
//! link key    derive("link", nonce_i, nonce_j, i, j)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::error::{CclError, Result};
use monel_peer::auth::{Key, Nonce, Proof, nonce};
use monel_peer::greeter::Greeter;

const MAGIC_BOOT: &[u8; 4] = b"MNL3";
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
    /// one communicator, and returns its id. Ranks must hold the secret of
    /// `MONEL_SECRET_FILE` or `MONEL_SECRET` when one is set here (see [`Self::create_with`]).
    pub fn create(bind: SocketAddr) -> Result<Self> {
        Self::create_with(bind, secret_from_env()?.as_ref())
    }

    /// As [`Self::create`], for ranks that hold `secret` ([`crate::CommConfig::secret`]).
    pub fn create_with(bind: SocketAddr, secret: Option<&Key>) -> Result<Self> {
        let l = TcpListener::bind(bind)
            .map_err(|e| CclError::io(format!("bind rendezvous {bind}"), e))?;
        let root = l
            .local_addr()
            .map_err(|e| CclError::io("rendezvous address", e))?;
        let mut token = [0u8; 16];
        getrandom::getrandom(&mut token)
            .map_err(|e| CclError::bootstrap(format!("random token: {e}")))?;
        let id = Self { root, token };
        serve_root(l, id.job_key(secret));
        Ok(id)
    }

    /// The key every rank of this job proves it holds: derived from `secret` and the token
    /// when a secret is configured, from the token alone otherwise (then only as secret as
    /// the id itself: a random id passed privately, or a launcher's, which anyone can compute).
    pub fn job_key(&self, secret: Option<&Key>) -> Key {
        match secret {
            Some(k) => k.derive("job", &[&self.token]),
            None => Key::from_secret(&self.token).derive("job", &[]),
        }
    }

    /// The id a launcher's variables imply: every rank computes the same token from them
    /// (and so can anyone else: only a configured secret authenticates such a job).
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

/// The job secret from `MONEL_SECRET_FILE` (its bytes, a trailing newline ignored) or
/// `MONEL_SECRET`; `None` when neither is set. An empty or unreadable one is an error.
pub(crate) fn secret_from(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Key>> {
    let bytes = if let Some(p) = env("MONEL_SECRET_FILE").filter(|p| !p.is_empty()) {
        monel_peer::auth::secret_from_file(p.as_ref()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                CclError::invalid(format!("MONEL_SECRET_FILE={p:?} is empty"))
            } else {
                CclError::invalid(format!("MONEL_SECRET_FILE={p:?}: cannot read it ({e})"))
            }
        })?
    } else if let Some(v) = env("MONEL_SECRET") {
        if v.is_empty() {
            return Err(CclError::invalid("MONEL_SECRET is set but empty"));
        }
        v.into_bytes()
    } else {
        return Ok(None);
    };
    Ok(Some(Key::from_secret(&bytes)))
}

/// [`secret_from`] the process environment.
pub(crate) fn secret_from_env() -> Result<Option<Key>> {
    secret_from(&|k| std::env::var(k).ok())
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
    /// Whether the id's token came from public values (a launcher's variables), so that
    /// only a configured secret authenticates the ranks.
    pub public_token: bool,
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
    let public_token = var(env, &["MONEL_UNIQUE_ID"]).is_none();
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
        public_token,
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

/// Serves a rendezvous at `addr` for the job `key` names (rank 0 of a launcher-started job).
pub(crate) fn serve_at(addr: SocketAddr, key: Key) -> Result<()> {
    let l = TcpListener::bind(addr).map_err(|e| {
        CclError::io(
            format!("rank 0: serve the rendezvous at {addr} (MASTER_ADDR:MASTER_PORT)"),
            e,
        )
    })?;
    serve_root(l, key);
    Ok(())
}

/// Most ranks a communicator may have (frame headers carry a root in 24 bits).
pub(crate) const MAX_RANKS: usize = 1 << 24;

/// Different rank counts the root keeps registrations for at once (a real job has one; each
/// forged count gets a group of its own, which never fills).
const MAX_GROUPS: usize = 8;

/// How long a connection may take to send its registration.
const REGISTRATION_TIME: Duration = Duration::from_secs(5);

/// One rank's registration: rank count, rank, its five address strings, its nonce and proof.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub(crate) nranks: u32,
    pub(crate) rank: u32,
    pub(crate) addrs: [String; 5],
    pub(crate) nonce: Nonce,
    pub(crate) proof: Proof,
}

fn addr_bytes(addrs: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in addrs {
        put_str(&mut out, a);
    }
    out
}

impl Registration {
    /// What the proof covers, given the root's nonce.
    fn proved(&self, key: &Key, root_nonce: &Nonce) -> bool {
        key.verify(
            &[
                b"register",
                root_nonce,
                &self.nonce,
                &self.nranks.to_le_bytes(),
                &self.rank.to_le_bytes(),
                &addr_bytes(&self.addrs),
            ],
            &self.proof,
        )
    }
}

fn read_array<const N: usize>(s: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

fn expect_magic(s: &mut impl Read, magic: &[u8; 4], what: &str) -> std::io::Result<()> {
    if &read_array::<4>(s)? != magic {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a Monel {what}"),
        ));
    }
    Ok(())
}

/// A registration as the root reads it (after its challenge).
pub(crate) fn read_registration(s: &mut impl Read) -> std::io::Result<Registration> {
    expect_magic(s, MAGIC_BOOT, "registration")?;
    let nranks = get_u32(s)?;
    let rank = get_u32(s)?;
    let addrs = [
        get_str(s)?,
        get_str(s)?,
        get_str(s)?,
        get_str(s)?,
        get_str(s)?,
    ];
    Ok(Registration {
        nranks,
        rank,
        addrs,
        nonce: read_array(s)?,
        proof: read_array(s)?,
    })
}

fn refuse(s: &mut TcpStream, why: &str) {
    let mut out = MAGIC_BOOT.to_vec();
    out.push(1);
    put_str(&mut out, why);
    let _ = s.write_all(&out);
}

/// The root's side of one connection: its challenge, then a registration that proves the
/// job key (refused with a message otherwise). Returns the registration and the challenge.
fn greet_rank(s: &mut TcpStream, key: &Key) -> std::io::Result<(Registration, Nonce)> {
    s.set_nodelay(true)?;
    let challenge = nonce();
    let mut hello = MAGIC_BOOT.to_vec();
    hello.extend(challenge);
    s.write_all(&hello)?;
    let reg = read_registration(s)?;
    if !reg.proved(key, &challenge) {
        let why = "could not prove the job key: wrong unique id or secret (MONEL_SECRET_FILE)";
        refuse(s, why);
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            why,
        ));
    }
    Ok((reg, challenge))
}

/// A registered rank, waiting for the table.
struct Waiting {
    s: TcpStream,
    addrs: [String; 5],
    /// Its nonce and the root's challenge, which the table's proof covers.
    nonces: (Nonce, Nonce),
}

/// The root: collects one registration per rank, then sends everyone the table.
///
/// Every connection is read on its own ([`Greeter`]), so silent ones delay nobody, and only
/// registrations that prove the job key count. Registrations are kept by the rank count they
/// claim, and the first count whose ranks all registered forms the communicator: a
/// registration claiming another count (or an absurd one) cannot lock the real ranks out or
/// make the root allocate for it. A rank out of range or already taken is refused with a
/// message.
fn serve_root(l: TcpListener, key: Key) {
    std::thread::Builder::new()
        .name("monel-root".into())
        .spawn(move || {
            let k = key.clone();
            let Ok(mut greeter) = Greeter::new(
                l,
                move |s: &mut TcpStream| greet_rank(s, &k),
                REGISTRATION_TIME,
                "rendezvous",
            ) else {
                return;
            };
            let mut groups: HashMap<usize, BTreeMap<usize, Waiting>> = HashMap::new();
            let formed = loop {
                let Ok(next) = greeter.next(Duration::from_secs(1)) else {
                    return;
                };
                let Some((mut s, peer, (reg, challenge))) = next else {
                    continue;
                };
                let (n, r) = (reg.nranks as usize, reg.rank as usize);
                let why = if n == 0 || n > MAX_RANKS {
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
                    refuse(&mut s, &why);
                    continue;
                }
                let group = groups.entry(n).or_default();
                group.insert(
                    r,
                    Waiting {
                        s,
                        addrs: reg.addrs,
                        nonces: (reg.nonce, challenge),
                    },
                );
                if group.len() == n {
                    break n;
                }
            };
            let ranks = groups.remove(&formed).unwrap_or_default();
            let mut table = Vec::new();
            for w in ranks.values() {
                table.extend(addr_bytes(&w.addrs));
            }
            for (r, mut w) in ranks {
                let mut out = MAGIC_BOOT.to_vec();
                out.push(0);
                out.extend((table.len() as u64).to_le_bytes());
                out.extend(&table);
                out.extend(key.prove(&[
                    b"table",
                    &w.nonces.0,
                    &w.nonces.1,
                    &(r as u32).to_le_bytes(),
                    &table,
                ]));
                let _ = w.s.write_all(&out);
            }
            for (n, group) in groups {
                for (_, mut w) in group {
                    refuse(
                        &mut w.s,
                        &format!("a communicator of {formed} ranks formed, not one of {n}"),
                    );
                }
            }
        })
        .expect("spawn rendezvous thread");
}

/// Most bytes of a rendezvous table per rank (five length-prefixed strings).
const MAX_TABLE_PER_RANK: u64 = 5 * (2 + u16::MAX as u64);

/// Registers with the root and returns everyone's addresses. Retries the connection until
/// `deadline` (the root may start later than this rank).
pub(crate) fn rendezvous(
    id: &UniqueId,
    key: &Key,
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
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(left.min(REGISTRATION_TIME)));
    let io = |e: std::io::Error| {
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
            CclError::bootstrap(format!("rank {rank}: rendezvous at {}: {e}", id.root))
        }
    };
    let not_root = || {
        CclError::bootstrap(format!(
            "rank {rank}: {} is not a Monel rendezvous",
            id.root
        ))
    };
    let mut m = [0u8; 20];
    s.read_exact(&mut m).map_err(io)?;
    if &m[..4] != MAGIC_BOOT {
        return Err(not_root());
    }
    let challenge: Nonce = m[4..].try_into().expect("16 bytes");
    let addrs = [
        mine.data.to_string(),
        mine.status.to_string(),
        mine.machine.clone(),
        mine.host.clone(),
        mine.cpus.clone(),
    ];
    let mut reg = Registration {
        nranks: nranks as u32,
        rank: rank as u32,
        addrs,
        nonce: nonce(),
        proof: [0; 32],
    };
    let body = addr_bytes(&reg.addrs);
    reg.proof = key.prove(&[
        b"register",
        &challenge,
        &reg.nonce,
        &reg.nranks.to_le_bytes(),
        &reg.rank.to_le_bytes(),
        &body,
    ]);
    let mut out = MAGIC_BOOT.to_vec();
    out.extend(reg.nranks.to_le_bytes());
    out.extend(reg.rank.to_le_bytes());
    out.extend(&body);
    out.extend(reg.nonce);
    out.extend(reg.proof);
    s.write_all(&out).map_err(io)?;
    let _ = s.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10)),
    ));
    let mut m = [0u8; 5];
    s.read_exact(&mut m).map_err(io)?;
    if &m[..4] != MAGIC_BOOT {
        return Err(not_root());
    }
    if m[4] != 0 {
        let why = get_str(&mut s).unwrap_or_default();
        return Err(CclError::bootstrap(format!(
            "rank {rank}: the rendezvous refused this rank: {why}"
        )));
    }
    let len = u64::from_le_bytes(read_array(&mut s).map_err(io)?);
    if len > MAX_TABLE_PER_RANK * nranks as u64 {
        return Err(CclError::bootstrap(format!(
            "rank {rank}: a rendezvous table of {len} bytes for {nranks} ranks"
        )));
    }
    // Read as it arrives: the length is not trusted with an allocation.
    let mut table = Vec::new();
    (&mut s).take(len).read_to_end(&mut table).map_err(io)?;
    let proof: Proof = read_array(&mut s).map_err(io)?;
    if table.len() as u64 != len
        || !key.verify(
            &[
                b"table",
                &reg.nonce,
                &challenge,
                &reg.rank.to_le_bytes(),
                &table,
            ],
            &proof,
        )
    {
        return Err(CclError::bootstrap(format!(
            "rank {rank}: the rendezvous at {} could not prove the job key",
            id.root
        )));
    }
    read_table(&mut std::io::Cursor::new(table), nranks, &io)
}

/// The rendezvous table: every rank's addresses, in rank order.
pub(crate) fn read_table<R: Read>(
    s: &mut R,
    nranks: usize,
    io: &dyn Fn(std::io::Error) -> CclError,
) -> Result<Vec<PeerAddrs>> {
    let mut table = Vec::with_capacity(nranks.min(1024));
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

/// A mesh connection's hello: the dialer's rank, its nonce and its proof.
pub(crate) fn read_hello(s: &mut impl Read) -> std::io::Result<(u32, Nonce, Proof)> {
    expect_magic(s, MAGIC_HELLO, "hello")?;
    let j = u32::from_le_bytes(read_array(s)?);
    Ok((j, read_array(s)?, read_array(s)?))
}

/// The key of the link between `acceptor` and `dialer`, from both nonces.
fn link_key(key: &Key, acceptor: usize, dialer: usize, na: &Nonce, nd: &Nonce) -> Key {
    key.derive(
        "link",
        &[
            na,
            nd,
            &(acceptor as u32).to_le_bytes(),
            &(dialer as u32).to_le_bytes(),
        ],
    )
}

/// The acceptor's side of a mesh connection: its challenge, a hello that proves the job
/// key from a rank above this one, and its own proof. Returns the dialer and the link key.
fn greet_peer(
    s: &mut TcpStream,
    key: &Key,
    rank: usize,
    n: usize,
) -> std::io::Result<(usize, Key)> {
    // Small messages both ways: without this, Nagle holds the next one back until the
    // peer's delayed ACK (40 ms).
    s.set_nodelay(true)?;
    let challenge = nonce();
    let mut m = MAGIC_HELLO.to_vec();
    m.extend(challenge);
    s.write_all(&m)?;
    let (j, nd, proof) = read_hello(s)?;
    let fail = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    if !key.verify(
        &[
            b"hello",
            &challenge,
            &nd,
            &j.to_le_bytes(),
            &(rank as u32).to_le_bytes(),
        ],
        &proof,
    ) {
        return Err(fail(
            "could not prove the job key: not a rank of this communicator".into(),
        ));
    }
    let j = j as usize;
    if j <= rank || j >= n {
        return Err(fail(format!("rank {j} is not expected here")));
    }
    let mut m = MAGIC_HELLO.to_vec();
    m.extend(key.prove(&[
        b"welcome",
        &nd,
        &challenge,
        &(rank as u32).to_le_bytes(),
        &(j as u32).to_le_bytes(),
    ]));
    s.write_all(&m)?;
    Ok((j, link_key(key, rank, j, &challenge, &nd)))
}

/// The dialer's side of a mesh connection from `rank` to rank `j`: answers its challenge
/// and checks its proof. Returns the link key.
fn dial_peer(
    s: &mut TcpStream,
    key: &Key,
    (rank, j): (usize, usize),
    deadline: Instant,
) -> std::io::Result<Key> {
    s.set_nodelay(true)?;
    // Rank j answers once it reaches its own mesh, which a loaded host may delay: wait as
    // long as the whole set-up may take.
    s.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(HELLO_TIME),
    ))?;
    let mut m = [0u8; 20];
    s.read_exact(&mut m)?;
    if &m[..4] != MAGIC_HELLO {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a Monel rank",
        ));
    }
    let challenge: Nonce = m[4..].try_into().expect("16 bytes");
    let mine = nonce();
    let mut out = MAGIC_HELLO.to_vec();
    out.extend((rank as u32).to_le_bytes());
    out.extend(mine);
    out.extend(key.prove(&[
        b"hello",
        &challenge,
        &mine,
        &(rank as u32).to_le_bytes(),
        &(j as u32).to_le_bytes(),
    ]));
    s.write_all(&out)?;
    let mut m = [0u8; 36];
    s.read_exact(&mut m)?;
    let proved = &m[..4] == MAGIC_HELLO
        && key.verify(
            &[
                b"welcome",
                &mine,
                &challenge,
                &(j as u32).to_le_bytes(),
                &(rank as u32).to_le_bytes(),
            ],
            &m[4..],
        );
    if !proved {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "it could not prove the job key",
        ));
    }
    s.set_read_timeout(None)?;
    Ok(link_key(key, j, rank, &challenge, &mine))
}

/// A mesh connection to a peer that proved the job key, and the link's own key.
pub(crate) type Peer = (TcpStream, Key);

/// Connects the full mesh: dials every lower rank (on a thread of its own) while accepting
/// every higher one. Each connection is a mutual challenge-response under the job key; the
/// listener reads every connection on its own, so a silent or garbled one delays nobody.
pub(crate) fn mesh(
    listener: &TcpListener,
    table: &[PeerAddrs],
    rank: usize,
    key: &Key,
    deadline: Instant,
) -> Result<Vec<Option<Peer>>> {
    let n = table.len();
    let mut out: Vec<Option<Peer>> = (0..n).map(|_| None).collect();
    let listener = listener
        .try_clone()
        .map_err(|e| CclError::io("listener", e))?;
    let k = key.clone();
    let mut greeter = Greeter::new(
        listener,
        move |s: &mut TcpStream| greet_peer(s, &k, rank, n),
        HELLO_TIME,
        "mesh",
    )
    .map_err(|e| CclError::io("listener", e))?;
    std::thread::scope(|scope| {
        let dials = scope.spawn(|| {
            let mut got = Vec::with_capacity(rank);
            for (j, peer) in table.iter().enumerate().take(rank) {
                let mut s = TcpStream::connect_timeout(&peer.data, Duration::from_secs(5))
                    .map_err(|e| {
                        CclError::io(
                            format!("rank {rank}: connect to rank {j} at {}", peer.data),
                            e,
                        )
                    })?;
                let k = dial_peer(&mut s, key, (rank, j), deadline).map_err(|e| {
                    CclError::io(
                        format!("rank {rank}: hello to rank {j} at {}", peer.data),
                        e,
                    )
                })?;
                got.push((s, k));
            }
            Ok::<_, CclError>(got)
        });
        let mut dials = Some(dials);
        let mut lower = None;
        while out.iter().enumerate().any(|(j, s)| j > rank && s.is_none()) {
            // A failed dial ends the wait for the higher ranks.
            if dials.as_ref().is_some_and(|d| d.is_finished()) {
                let d = dials.take().expect("checked");
                lower = Some(d.join().expect("dialing thread")?);
            }
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            match greeter.next(left).map_err(|e| CclError::io("accept", e))? {
                Some((s, peer, (j, k))) => {
                    if out[j].is_some() {
                        greeter.drop_one(peer, &format!("rank {j} is already connected"));
                    } else {
                        let _ = s.set_read_timeout(None);
                        out[j] = Some((s, k));
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
        let lower = match (lower, dials) {
            (Some(l), _) => l,
            (None, Some(d)) => d.join().expect("dialing thread")?,
            (None, None) => unreachable!("joined once"),
        };
        for (j, p) in lower.into_iter().enumerate() {
            out[j] = Some(p);
        }
        Ok(out)
    })
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
                    rendezvous(&id, &id.job_key(None), 2, r, &mine, deadline).unwrap()
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

    /// A silent connection, a hello under the wrong key and a hello replayed from another
    /// connection (it answers another challenge) reach rank 0's mesh listener before rank 1
    /// dials: each is dropped, and the mesh forms with one link key on both sides.
    #[test]
    fn the_mesh_forms_past_silent_forged_and_replayed_hellos() {
        let key = Key::from_secret(b"job key");
        let ls: Vec<TcpListener> = (0..2)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let table: Vec<PeerAddrs> = ls
            .iter()
            .map(|l| PeerAddrs {
                data: l.local_addr().unwrap(),
                status: "127.0.0.1:9".parse().unwrap(),
                machine: String::new(),
                host: String::new(),
                cpus: String::new(),
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let at = table[0].data;
        std::thread::scope(|sc| {
            let (l0, t0, k0) = (&ls[0], &table, &key);
            let zero = sc.spawn(move || mesh(l0, t0, 0, k0, deadline));
            let _silent = TcpStream::connect(at).unwrap();
            let hello = |k: &Key, challenge: &[u8]| {
                let mine = [9u8; 16];
                let mut m = MAGIC_HELLO.to_vec();
                m.extend(1u32.to_le_bytes());
                m.extend(mine);
                m.extend(k.prove(&[
                    b"hello",
                    challenge,
                    &mine,
                    &1u32.to_le_bytes(),
                    &0u32.to_le_bytes(),
                ]));
                m
            };
            let attempt = |m: &dyn Fn(&[u8]) -> Vec<u8>| {
                let mut s = TcpStream::connect(at).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut c = [0u8; 20];
                s.read_exact(&mut c).unwrap();
                s.write_all(&m(&c[4..])).unwrap();
                // Dropped: no welcome, the connection closes.
                let mut w = [0u8; 36];
                assert!(s.read_exact(&mut w).is_err(), "an attacker was welcomed");
            };
            attempt(&|c| hello(&Key::from_secret(b"guess"), c));
            attempt(&|_| hello(&key, &[1u8; 16]));
            let one = mesh(&ls[1], &table, 1, &key, deadline).unwrap();
            let zero = zero.join().unwrap().unwrap();
            let (Some((_, k1)), Some((_, k0))) = (&one[0], &zero[1]) else {
                panic!("the mesh did not form");
            };
            assert_eq!(k0, k1, "both ends derive one link key");
            assert_ne!(k0, &key);
        });
    }

    #[test]
    fn the_job_secret_comes_from_a_file_or_the_environment() {
        let dir = std::env::temp_dir().join(format!("monel-jobsecret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("s");
        std::fs::write(&file, "hunter2\n").unwrap();
        let f = file.to_str().unwrap().to_string();
        let from_file = secret_from(&|k| (k == "MONEL_SECRET_FILE").then(|| f.clone()));
        assert_eq!(from_file.unwrap(), Some(Key::from_secret(b"hunter2")));
        let from_env = secret_from(&|k| (k == "MONEL_SECRET").then(|| "hunter2".into()));
        assert_eq!(from_env.unwrap(), Some(Key::from_secret(b"hunter2")));
        assert_eq!(secret_from(&|_| None).unwrap(), None);
        std::fs::write(&file, "\n").unwrap();
        let e = secret_from(&|k| (k == "MONEL_SECRET_FILE").then(|| f.clone())).unwrap_err();
        assert!(e.message.contains("is empty"), "{e}");
        let gone = dir.join("none").to_str().unwrap().to_string();
        let e = secret_from(&|k| (k == "MONEL_SECRET_FILE").then(|| gone.clone())).unwrap_err();
        assert!(e.message.contains("cannot read it"), "{e}");
        assert!(secret_from(&|k| (k == "MONEL_SECRET").then(String::new)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
