//! The communicator's settings and the `MONEL_*` variables that set them.

use std::time::Duration;

use monel_sched::plan::Algorithm;

use crate::error::{CclError, Result};
use crate::transport::{RdmaConfig, ShmConfig};

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
    /// A peer a call waits on that stops answering its status endpoint for this long is
    /// named, long before the timeout (`MONEL_LIVENESS`, seconds; default 10; 0: off).
    pub liveness: Duration,
    /// Transports a pair may use (`MONEL_TRANSPORT`).
    pub transports: Transports,
    /// How long a rank polls without sleeping when nothing moves (`MONEL_SPIN_US`,
    /// microseconds; default 50). Sleeping costs a wake-up (several microseconds here).
    pub spin: Duration,
    /// Shared-memory ring size per direction (`MONEL_SHM_RING`, bytes) and this rank's host
    /// identity (`MONEL_HOST`: ranks naming different hosts never share memory).
    pub shm: ShmConfig,
    /// The soft RNIC for pairs on different hosts (`MONEL_RDMA_DEV`, `MONEL_RDMA_RING`,
    /// `MONEL_RDMA_GSO`, `MONEL_RDMA_AUTH`, and the GID choice: `MONEL_IB_GID_INDEX`, ...).
    pub rdma: RdmaConfig,
    /// Congestion controls TCP links ask for, first accepted wins; empty keeps the
    /// system's (`MONEL_TCP_CONGESTION`: a comma list, or `system`; default `cubic,reno`).
    /// Neither paces its sends, which BBR (a common system default) does with a timer per
    /// burst: a collective's bursts then wait for it, and on a VM every timer costs a trap.
    pub tcp_congestion: Vec<String>,
    /// The job's shared secret (`MONEL_SECRET_FILE`, else `MONEL_SECRET`): every rank must
    /// prove it holds it before it is trusted. Without one, ranks prove only the unique id.
    pub secret: Option<monel_peer::auth::Key>,
    /// Run the doctor's brief checks at init (`MONEL_DOCTOR=1`): providers, locked memory
    /// and /dev/shm against what this communicator registers and maps, each logged; a
    /// failing one fails init with its fix.
    pub doctor: bool,
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
            liveness: Duration::from_secs(10),
            transports: Transports::default(),
            spin: Duration::from_micros(50),
            shm: ShmConfig::default(),
            rdma: RdmaConfig::default(),
            tcp_congestion: vec!["cubic".into(), "reno".into()],
            secret: None,
            doctor: false,
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
        if let Some(v) = env("MONEL_LIVENESS") {
            c.liveness = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e6)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    CclError::invalid(format!("MONEL_LIVENESS={v:?}: want seconds >= 0"))
                })?;
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
        if let Some(v) = env("MONEL_DOCTOR") {
            c.doctor = match v.trim() {
                "1" | "true" | "yes" => true,
                "" | "0" | "false" | "no" => false,
                _ => {
                    return Err(CclError::invalid(format!(
                        "MONEL_DOCTOR={v:?}: want 1 or 0"
                    )));
                }
            };
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
        let (gid, aliases) =
            monel_peer::hca::GidPolicy::from_vars(env).map_err(CclError::invalid)?;
        for a in aliases {
            tracing::info!(target: "monel::init", "{a}");
        }
        c.rdma.gid = gid;
        if let Some((v, from)) = monel_peer::hca::lookup(env, "IB_HCA") {
            if from == "NCCL" {
                tracing::info!(target: "monel::init", "NCCL_IB_HCA={v} read as MONEL_IB_HCA");
            }
            c.rdma.hca = Some(
                monel_peer::hca::HcaFilter::parse(&v)
                    .map_err(|e| CclError::invalid(format!("{from}_IB_HCA: {e}")))?,
            );
        }
        if let Some(v) = env("MONEL_RDMA_AUTH") {
            c.rdma.auth = monel_verbs::protect::PacketAuth::parse(&v).ok_or_else(|| {
                CclError::invalid(format!("MONEL_RDMA_AUTH={v:?}: want none, mac or encrypt"))
            })?;
        }
        if let Some(v) = env("MONEL_TCP_CONGESTION") {
            c.tcp_congestion = parse_congestion(&v).ok_or_else(|| {
                CclError::invalid(format!(
                    "MONEL_TCP_CONGESTION={v:?}: want `system` or a comma list of congestion \
                     controls (names of up to 15 letters, digits or _)"
                ))
            })?;
        }
        c.secret = crate::bootstrap::secret_from(env)?;
        // Logging is the subscriber's business (see `crate::log`); a malformed setting is
        // still an error here, with the others.
        crate::log::filter_from(
            env("MONEL_DEBUG").as_deref(),
            env("MONEL_DEBUG_SUBSYS").as_deref(),
        )?;
        Ok(c)
    }
}

/// `system` (keep the kernel's default: an empty list) or a comma list of algorithm names.
pub(super) fn parse_congestion(v: &str) -> Option<Vec<String>> {
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

/// A configuration from the given variables only (for tests).
#[cfg(test)]
pub(super) fn with(vars: &[(&str, &str)]) -> Result<CommConfig> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    CommConfig::from_vars(&move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn gid_settings_and_their_nccl_aliases_reach_the_rdma_config() {
        let c = CommConfig::from_vars(&|k| (k == "NCCL_IB_GID_INDEX").then(|| "3".into())).unwrap();
        assert_eq!(c.rdma.gid.index, Some(3));
        let e = CommConfig::from_vars(&|k| (k == "MONEL_IB_ADDR_FAMILY").then(|| "x".into()))
            .unwrap_err();
        assert!(e.message.contains("MONEL_IB_ADDR_FAMILY"), "{e}");
    }
}
