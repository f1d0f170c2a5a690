//! The rendezvous: the root collects every rank's registration (with its proof of the job
//! key) and hands each the table of everyone's addresses.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{CclError, Result};
use monel_peer::auth::{Key, Nonce, Proof, nonce};
use monel_peer::greeter::Greeter;

use super::UniqueId;
use super::codec::*;

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
pub(super) const MAX_GROUPS: usize = 8;

/// How long a connection may take to send its registration.
pub(super) const REGISTRATION_TIME: Duration = Duration::from_secs(5);

/// One rank's registration: rank count, rank, its five address strings, its nonce and proof.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub(crate) nranks: u32,
    pub(crate) rank: u32,
    pub(crate) addrs: [String; 5],
    pub(crate) nonce: Nonce,
    pub(crate) proof: Proof,
}

pub(super) fn addr_bytes(addrs: &[String]) -> Vec<u8> {
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

pub(super) fn refuse(s: &mut TcpStream, why: &str) {
    let mut out = MAGIC_BOOT.to_vec();
    out.push(1);
    put_str(&mut out, why);
    let _ = s.write_all(&out);
}

/// The root's side of one connection: its challenge, then a registration that proves the
/// job key (refused with a message otherwise). Returns the registration and the challenge.
pub(super) fn greet_rank(s: &mut TcpStream, key: &Key) -> std::io::Result<(Registration, Nonce)> {
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
pub(super) struct Waiting {
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
pub(super) fn serve_root(l: TcpListener, key: Key) {
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
pub(super) const MAX_TABLE_PER_RANK: u64 = 5 * (2 + u16::MAX as u64);

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
                ))
                .with_source(e));
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
                .with_source(e)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
