//! `monel`: the command-line face of Monel. Thin over the libraries.

#![forbid(unsafe_code)]
mod bench;
mod chart;
mod connect;
mod demo;
mod devices;
mod doctor;
mod dump;
mod fabric;
mod launch;
mod perf;
mod perftest;
mod pingpong;
mod sim;
mod switch;
mod tools;
mod transfer;
mod xfer_bench;

use clap::{Parser, Subcommand};

/// Monel: RDMA for AI, in Rust.
#[derive(Debug, Parser)]
#[command(name = "monel", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Monel's main job: N local ranks on simulated hosts, every collective verified through
    /// the full stack, the path each pair took, and an AllReduce sweep.
    Demo(demo::DemoArgs),
    /// Run the RC engine over the simulated lossy network and print a loss-sweep table.
    Sim(sim::SimArgs),
    /// Decode the RoCEv2 packets of a pcap file and check every ICRC.
    Dump(dump::DumpArgs),
    /// List soft RoCE devices, ports and GID tables (like ibv_devinfo).
    Devices(devices::DevicesArgs),
    /// Pre-flight check before a job: RDMA providers and devices, the GID Monel would pick,
    /// locked memory, /dev/shm, the bootstrap interface; the exit status says whether a job
    /// would run (`--json` for tools).
    Doctor(doctor::DoctorArgs),
    /// RC ping-pong, compatible with rdma-core's ibv_rc_pingpong.
    Pingpong(pingpong::PingpongArgs),
    /// perftest-style tests (write-bw, send-bw, read-bw, write-lat, send-lat, read-lat,
    /// atomic-lat) and raw-UDP baselines (udp-bw, udp-lat).
    Perf(perf::PerfArgs),
    /// Software Ethernet switch between veth ends that drops, reorders, delays, duplicates
    /// and ECN-marks UDP (root; for tests across network namespaces).
    Switch(switch::SwitchArgs),
    /// One verified bulk RDMA WRITE (default 1 GiB): goodput, recovery counters, DCQCN.
    Transfer(transfer::TransferArgs),
    /// The transfer engine driven as Mooncake's and NIXL's benchmarks drive theirs: a
    /// target, and an initiator's threads submitting batches of blocks (READ or WRITE) for a
    /// while; throughput, every block checked.
    XferBench(xfer_bench::XferBenchArgs),
    /// Run N local ranks of a command with torchrun's variables (MASTER_ADDR, RANK, ...).
    Launch(launch::LaunchArgs),
    /// nccl-tests-style collective benchmark (run under `monel launch`, torchrun, Slurm or
    /// mpirun): size, count, type, redop, root, time, algbw, busbw, #wrong.
    Bench(bench::BenchArgs),
    /// Fabric planner: predict collectives, training steps and cost on InfiniBand fat-trees,
    /// RoCE leaf-spines and rail-optimized fabrics from a TOML design.
    Fabric(fabric::FabricArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    monel_ccl::log::init_from_env()?;
    match cli.cmd {
        Cmd::Demo(a) => demo::run(&a),
        Cmd::Sim(a) => sim::run(&a),
        Cmd::Dump(a) => dump::run(&a),
        Cmd::Devices(a) => devices::run(&a),
        Cmd::Doctor(a) => doctor::run(&a),
        Cmd::Pingpong(a) => pingpong::run(&a),
        Cmd::Perf(a) => perf::run(&a),
        Cmd::Switch(a) => switch::run(&a),
        Cmd::Transfer(a) => transfer::run(&a),
        Cmd::XferBench(a) => xfer_bench::run(&a),
        Cmd::Launch(a) => launch::run(&a),
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Fabric(a) => fabric::run(&a),
    }
}
