//! Where a rank learns its place: the job secret (a file or the environment) and the
//! launchers' variables (torchrun, Slurm, mpirun).

use std::net::ToSocketAddrs;

use crate::error::{CclError, Result};
use monel_peer::auth::Key;

use super::UniqueId;

/// The job secret from `MONEL_SECRET_FILE` (its bytes, a trailing newline ignored) or
/// `MONEL_SECRET`; `None` when neither is set. An empty or unreadable one is an error.
pub(crate) fn secret_from(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Key>> {
    let bytes = if let Some(p) = env("MONEL_SECRET_FILE").filter(|p| !p.is_empty()) {
        monel_peer::auth::secret_from_file(p.as_ref()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                CclError::invalid(format!("MONEL_SECRET_FILE={p:?} is empty"))
            } else {
                CclError::invalid(format!("MONEL_SECRET_FILE={p:?}: cannot read it ({e})"))
                    .with_source(e)
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

pub(super) fn var(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| env(n))
}

pub(super) fn num(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Result<Option<usize>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
