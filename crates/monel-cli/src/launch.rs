//! `monel launch -n N -- CMD ...`: runs N local ranks of CMD with torchrun's variables
//! (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE). If a rank
//! fails, the others are stopped; the exit status is the first failure's. Unless
//! `MONEL_SECRET_FILE` or `MONEL_SECRET` is set already, the ranks share a fresh random job
//! secret (`MONEL_SECRET` in their environment, which only this user can read), so no other
//! process can join their job.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct LaunchArgs {
    /// Ranks to start.
    #[arg(short = 'n', long, default_value_t = 2)]
    nranks: usize,
    /// Rendezvous port (default: a free one).
    #[arg(long)]
    port: Option<u16>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

pub(crate) fn run(a: &LaunchArgs) -> anyhow::Result<()> {
    let code = spawn_ranks(a.nranks, a.port, &a.cmd, &|_| Vec::new())?;
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// Runs `nranks` local ranks of `cmd` with torchrun's variables plus `extra(rank)`; when a
/// rank fails, the others get a moment to report, then are stopped. Returns the first
/// failure's exit status (0 if none).
pub(crate) fn spawn_ranks(
    nranks: usize,
    port: Option<u16>,
    cmd: &[String],
    extra: &dyn Fn(usize) -> Vec<(String, String)>,
) -> anyhow::Result<i32> {
    if nranks == 0 {
        bail!("-n must be at least 1");
    }
    let port = match port {
        Some(p) => p,
        None => std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port(),
    };
    let secret = (std::env::var_os("MONEL_SECRET_FILE").is_none()
        && std::env::var_os("MONEL_SECRET").is_none())
    .then(|| {
        monel_peer::auth::nonce()
            .iter()
            .chain(&monel_peer::auth::nonce())
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    });
    let mut kids: Vec<Child> = Vec::new();
    for r in 0..nranks {
        let c = Command::new(&cmd[0])
            .args(&cmd[1..])
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", nranks.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", nranks.to_string())
            .envs(secret.iter().map(|s| ("MONEL_SECRET", s)))
            .envs(extra(r))
            .spawn()
            .with_context(|| format!("start rank {r}: {}", cmd[0]))?;
        kids.push(c);
    }
    let mut status: Vec<Option<i32>> = vec![None; kids.len()];
    let mut failed_at: Option<Instant> = None;
    loop {
        for (r, k) in kids.iter_mut().enumerate() {
            if status[r].is_none() {
                if let Some(s) = k.try_wait()? {
                    let code = s.code().unwrap_or(128 + 9);
                    if code != 0 {
                        eprintln!("monel launch: rank {r} exited with status {code}");
                        failed_at.get_or_insert_with(Instant::now);
                    }
                    status[r] = Some(code);
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        // A failed rank: give the others a moment to report their own errors, then stop them.
        if failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            for (r, k) in kids.iter_mut().enumerate() {
                if status[r].is_none() {
                    eprintln!("monel launch: stopping rank {r}");
                    let _ = k.kill();
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(status
        .iter()
        .flatten()
        .copied()
        .find(|&c| c != 0)
        .unwrap_or(0))
}
