//! The mesh: every pair of ranks connects once, each side proving the job key, and the link
//! gets a key of its own from both sides' nonces.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{CclError, Result};
use monel_peer::auth::{Key, Nonce, Proof, nonce};
use monel_peer::greeter::Greeter;

use super::codec::*;
use super::rendezvous::PeerAddrs;

/// How long a connection to the mesh listener may take to say who it is.
pub(super) const HELLO_TIME: Duration = Duration::from_secs(5);

/// A mesh connection's hello: the dialer's rank, its nonce and its proof.
pub(crate) fn read_hello(s: &mut impl Read) -> std::io::Result<(u32, Nonce, Proof)> {
    expect_magic(s, MAGIC_HELLO, "hello")?;
    let j = u32::from_le_bytes(read_array(s)?);
    Ok((j, read_array(s)?, read_array(s)?))
}

/// The key of the link between `acceptor` and `dialer`, from both nonces.
pub(super) fn link_key(key: &Key, acceptor: usize, dialer: usize, na: &Nonce, nd: &Nonce) -> Key {
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
pub(super) fn greet_peer(
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
pub(super) fn dial_peer(
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
}
