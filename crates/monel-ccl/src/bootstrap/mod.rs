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
//!
//! `launch` reads the launchers' environments, `rendezvous` runs the root's table and each
//! rank's registration, `mesh` forms the links, `codec` has the length-prefixed fields both
//! speak.

mod codec;
mod launch;
mod mesh;
mod rendezvous;

use rendezvous::serve_root;

pub(crate) use launch::{Launch, launch_from, secret_from, secret_from_env};
pub(crate) use mesh::{Peer, mesh, read_hello};
pub(crate) use rendezvous::{
    PeerAddrs, read_registration, read_table, rendezvous, serve_at, this_machine,
};

use std::net::{SocketAddr, TcpListener};
use std::str::FromStr;

use crate::error::{CclError, Result};
use monel_peer::auth::Key;

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
}
