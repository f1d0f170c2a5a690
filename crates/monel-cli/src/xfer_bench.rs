//! `monel xfer-bench`: the transfer engine driven as Mooncake's `transfer_engine_bench` and
//! NIXL's nixlbench drive theirs: a target agent registers a buffer; an initiator's threads
//! each submit batches of `--batch-size` blocks of `--block-size` bytes (READ or WRITE) for
//! `--duration` seconds, and the initiator prints the throughput. Every block is checked at
//! the end of the run: WRITEs by reading them back (then the target's pattern is put back),
//! READs against the target's pattern.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use monel_verbs::Device;
use monel_xfer::{Agent, AgentConfig, Desc, DescState, Op, Transport};

use crate::connect::{self, ConnArgs};

/// Arguments of `monel xfer-bench`.
#[derive(Debug, Args)]
pub(crate) struct XferBenchArgs {
    /// The target agent's address (`IP:PORT`, as the target prints it); without it, be the
    /// target.
    target: Option<String>,
    #[command(flatten)]
    conn: ConnArgs,
    /// read or write.
    #[arg(long, default_value = "write")]
    operation: String,
    /// Bytes per block (descriptor).
    #[arg(long = "block-size", default_value_t = 65536)]
    block_size: u64,
    /// Blocks per batch.
    #[arg(long = "batch-size", default_value_t = 128)]
    batch_size: u64,
    /// Threads submitting batches.
    #[arg(long, default_value_t = 1)]
    threads: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Bytes each side registers (the target's, and each initiator thread's share of the
    /// initiator's).
    #[arg(long = "buffer-size", default_value_t = 256 << 20)]
    buffer_size: u64,
    /// The target serves this many seconds (0: until killed).
    #[arg(long, default_value_t = 0)]
    serve: u64,
    /// The link to the peer: auto (shared memory on one host, else RDMA where it works, else
    /// TCP), shm, rdma or tcp. A target given one accepts only that.
    #[arg(long, default_value = "auto")]
    transport: String,
}

/// The byte at `offset` of the target's buffer.
fn pattern(offset: u64) -> u8 {
    (offset.wrapping_mul(0x9e37_79b9) >> 13) as u8
}

pub(crate) fn run(a: &XferBenchArgs) -> anyhow::Result<()> {
    let op = match a.operation.as_str() {
        "read" => Op::Read,
        "write" => Op::Write,
        o => bail!("--operation {o}: read or write"),
    };
    let dev = Device::from_arg(&a.conn.device)?;
    let ip = dev
        .ipv4_gid_index()
        .and_then(|i| dev.gids.get(usize::from(i)))
        .or(dev.gids.first())
        .map(|g| g.gid.to_ip())
        .context("the device has no address")?;
    let secret = connect::secret(&a.conn)?;
    let listen = SocketAddr::new(ip, if a.target.is_some() { 0 } else { a.conn.port });
    let role = if a.target.is_some() {
        "initiator"
    } else {
        "target"
    };
    let mut cfg = AgentConfig::new(role, dev, listen, secret);
    cfg.udp_port = a.conn.udp_port;
    cfg.transport = match a.transport.as_str() {
        "auto" => Transport::Auto,
        "rdma" => Transport::Rdma,
        "tcp" => Transport::Tcp,
        "shm" => Transport::Shm,
        t => bail!("--transport {t}: auto, shm, rdma or tcp"),
    };
    let agent = Agent::new(cfg)?;
    if a.target.is_none() {
        let len = usize::try_from(a.buffer_size)?;
        agent.register("buffer", len)?;
        let fill: Vec<u8> = (0..a.buffer_size).map(pattern).collect();
        agent.write_local("buffer", 0, &fill)?;
        println!("# xfer-bench target at {} ({} bytes)", agent.address(), len);
        if a.serve == 0 {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        std::thread::sleep(Duration::from_secs(a.serve));
        return Ok(());
    }
    initiator(a, op, agent)
}

fn initiator(a: &XferBenchArgs, op: Op, agent: Agent) -> anyhow::Result<()> {
    let target: SocketAddr = a
        .target
        .as_deref()
        .unwrap_or_default()
        .parse()
        .context("the target: IP:PORT")?;
    if a.block_size == 0 || a.batch_size == 0 || a.threads == 0 {
        bail!("--block-size, --batch-size and --threads must be positive");
    }
    let per_batch = a.block_size.saturating_mul(a.batch_size);
    if per_batch.saturating_mul(a.threads) > a.buffer_size {
        bail!(
            "{} threads x {} blocks x {} bytes do not fit --buffer-size {}",
            a.threads,
            a.batch_size,
            a.block_size,
            a.buffer_size
        );
    }
    agent.register("buffer", usize::try_from(per_batch * a.threads)?)?;
    let peer = agent.connect(target)?;
    let link = agent.transport(&peer)?.setting();
    let remote = agent.remote_segments(&peer)?;
    let size = remote
        .iter()
        .find(|s| s.name == "buffer")
        .map(|s| s.len())
        .context("the target publishes no segment named buffer")?;
    if per_batch * a.threads > size {
        bail!("the target's buffer ({size} bytes) is smaller than one round of batches");
    }
    if op == Op::Write {
        // WRITEs carry a pattern of their own, checked on the target afterwards.
        let fill: Vec<u8> = (0..per_batch * a.threads)
            .map(|o| pattern(o) ^ 0xa5)
            .collect();
        agent.write_local("buffer", 0, &fill)?;
    }
    let agent = Arc::new(agent);
    let batches = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(a.duration);
    let start = Instant::now();
    let workers: Vec<_> = (0..a.threads)
        .map(|t| {
            let (agent, batches, peer) = (agent.clone(), batches.clone(), peer.clone());
            let (bs, n) = (a.block_size, a.batch_size);
            std::thread::spawn(move || -> anyhow::Result<()> {
                let base = t * bs * n;
                let descs: Vec<Desc<'_>> = (0..n)
                    .map(|k| Desc {
                        op,
                        local: "buffer",
                        local_offset: base + k * bs,
                        remote: "buffer",
                        remote_offset: base + k * bs,
                        len: bs,
                    })
                    .collect();
                while Instant::now() < until {
                    let id = agent.transfer(&peer, &descs, None)?;
                    let states = agent.wait(id, Duration::from_secs(30))?;
                    if let Some(bad) = states.iter().find(|s| **s != DescState::Done) {
                        bail!("a block did not arrive: {bad:?}");
                    }
                    batches.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a worker panicked"))??;
    }
    let secs = start.elapsed().as_secs_f64();
    let done = batches.load(Ordering::Relaxed);
    let moved = done * per_batch;
    verify(&agent, &peer, op, a, per_batch)?;
    println!(
        "# xfer-bench {} over {link} block {} batch {} threads {}: {} batches, {:.3} GB/s ({:.1} Gb/s), {:.0} batches/s, every block checked",
        a.operation,
        a.block_size,
        a.batch_size,
        a.threads,
        done,
        moved as f64 / secs / 1e9,
        moved as f64 * 8.0 / secs / 1e9,
        done as f64 / secs
    );
    Ok(())
}

/// Checks every block: a READ's landed bytes against the target's pattern; a WRITE's by
/// reading the target's blocks back into a scratch segment.
fn verify(
    agent: &Agent,
    peer: &str,
    op: Op,
    a: &XferBenchArgs,
    per_batch: u64,
) -> anyhow::Result<()> {
    let total = per_batch * a.threads;
    if op == Op::Write {
        agent.register("check", usize::try_from(total)?)?;
        let back = Desc {
            op: Op::Read,
            local: "check",
            local_offset: 0,
            remote: "buffer",
            remote_offset: 0,
            len: total,
        };
        let id = agent.transfer(peer, &[back], None)?;
        let s = agent.wait(id, Duration::from_secs(30))?;
        if s != [DescState::Done] {
            bail!("reading the written blocks back failed: {s:?}");
        }
    }
    let seg = if op == Op::Write { "check" } else { "buffer" };
    let mut got = vec![0u8; usize::try_from(total)?];
    agent.read_local(seg, 0, &mut got)?;
    let flip = if op == Op::Write { 0xa5 } else { 0 };
    if let Some(o) = (0..total).find(|&o| got[o as usize] != pattern(o) ^ flip) {
        bail!("byte {o} of the blocks is wrong after the run");
    }
    if op == Op::Write {
        // The target's own pattern back, so it serves any number of runs.
        let fill: Vec<u8> = (0..total).map(pattern).collect();
        agent.write_local("check", 0, &fill)?;
        let put = Desc {
            op: Op::Write,
            local: "check",
            local_offset: 0,
            remote: "buffer",
            remote_offset: 0,
            len: total,
        };
        let id = agent.transfer(peer, &[put], None)?;
        if agent.wait(id, Duration::from_secs(30))? != [DescState::Done] {
            bail!("restoring the target's pattern failed");
        }
    }
    Ok(())
}
