//! `monel perf TEST --perftest`: the tests with perftest's own exchange, so `ib_write_bw`,
//! `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_read_lat` and
//! `ib_send_lat` (run with the same `-s`, `-n` and `-p` as Monel) meet Monel as server or
//! client, on the soft RNIC or a kernel RDMA device. The report is perftest's, column for
//! column. The exchange is perftest's:
//! unauthenticated, so a job secret refuses it.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use monel_verbs::{
    AccessFlags, ConnectParams, Context, ContextConfig, Device, Mtu, QpCap, QpInitAttr, QpType,
    RecvWr, RemoteAddr, RemoteQp, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::tools::perf::{self, BwReport, Endpoint, LatReport, PerfOptions, Test};
use crate::tools::perftest_oob::{BwNumbers, Keys, Oob};
use crate::tools::pingpong;

/// Receives the server keeps posted for `send-bw` (perftest's default `--rx-depth`).
const RX_DEPTH: u32 = 512;
/// What perftest takes as the page and cache-line sizes.
const PAGE: u32 = 4096;
const CACHE_LINE: u32 = 64;

/// perftest's bandwidth row (`REPORT_FMT`).
fn row(n: &BwNumbers) -> String {
    perf::bw_row(n.size, n.iters, n.bw_peak, n.bw_avg, n.msg_rate)
}

fn numbers(r: &BwReport) -> BwNumbers {
    BwNumbers {
        size: r.size as u64,
        iters: r.iters,
        bw_peak: r.peak_mbs,
        bw_avg: r.avg_mbs(),
        msg_rate: r.iters as f64 / r.seconds / 1e6,
    }
}

/// What one run needs from the command line.
#[derive(Debug)]
pub(crate) struct Run<'a> {
    pub(crate) test: Test,
    pub(crate) device: &'a str,
    pub(crate) server: Option<&'a str>,
    pub(crate) port: u16,
    pub(crate) udp_port: u16,
    pub(crate) mtu: u32,
    pub(crate) size: Option<usize>,
    /// `-a`: every size from 2 B to 8 MiB, as perftest's `-a`.
    pub(crate) all: bool,
    pub(crate) iters: Option<u32>,
    pub(crate) tx_depth: u32,
    pub(crate) secret: bool,
}

fn tcp(r: &Run<'_>, local: IpAddr) -> anyhow::Result<(TcpStream, bool)> {
    match r.server {
        Some(s) => {
            let ip: IpAddr = s
                .parse()
                .with_context(|| format!("{s}: not an IP address"))?;
            let to = SocketAddr::new(ip, r.port);
            // perftest's server may not listen yet: try for a while, as its clients do not.
            let s = pingpong::dial(to, Duration::from_secs(30), "perftest exchange")?;
            Ok((s, true))
        }
        None => {
            // perftest's clients speak IPv4 only.
            let any = if local.is_ipv4() {
                IpAddr::from([0, 0, 0, 0])
            } else {
                local
            };
            let l = TcpListener::bind((any, r.port))
                .with_context(|| format!("listen on {}", r.port))?;
            let (s, from) = l.accept()?;
            println!("# perftest client {from}");
            Ok((s, false))
        }
    }
}

/// Runs one bandwidth test against perftest.
pub(crate) fn run(r: &Run<'_>) -> anyhow::Result<()> {
    if r.secret {
        bail!(
            "--perftest: perftest's exchange cannot prove a job secret; unset MONEL_SECRET \
             (and --secret-file) to meet perftest's tools"
        );
    }
    if r.test == Test::AtomicLat {
        bail!("--perftest: atomic-lat speaks Monel's exchange only");
    }
    let dev = Device::from_arg(r.device)?;
    let gid_index = dev
        .ipv4_gid_index()
        .context("--perftest: the device has no IPv4 RoCE v2 GID (perftest speaks IPv4)")?;
    let gid = dev.gid(gid_index)?.gid;
    let want = Mtu::from_bytes(r.mtu).with_context(|| format!("-m {}: not an IB MTU", r.mtu))?;
    let mtu_code = want.min(dev.port_attr().active_mtu) as u8;
    let sizes: Vec<usize> = match r.test {
        Test::AtomicBw => vec![8],
        _ if r.all => (1..24).map(|k| 1usize << k).collect(),
        t if t.is_bw() => vec![r.size.unwrap_or(65536).max(1)],
        _ => vec![r.size.unwrap_or(2).max(1)],
    };
    let size = sizes.iter().copied().max().unwrap_or(1);
    let iters = r
        .iters
        .unwrap_or(if r.test == Test::WriteBw { 5000 } else { 1000 });
    let ctx = Context::open(
        &dev,
        ContextConfig {
            udp_port: r.udp_port,
            ..ContextConfig::default()
        },
    )?;
    let (stream, client) = tcp(r, gid.to_ip())?;
    let mut oob = Oob::new(stream, client)?;
    let agreed = oob
        .open(PAGE, CACHE_LINE, mtu_code)
        .map_err(anyhow::Error::msg)?;
    // `IBV_MTU_*` codes 1..=5 are 256 << (code - 1) bytes.
    let mtu = Mtu::from_bytes(128 << agreed.mtu_code).context("perftest MTU code")?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq((r.tx_depth + RX_DEPTH) as usize)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: r.tx_depth.max(1),
            max_recv_wr: RX_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })?;
    // As perftest: the first half is this side's source, the second what the peer reaches.
    let half = size.max(agreed.cycle_buffer as usize);
    let mr = pd.reg_mr(
        vec![0u8; 2 * half],
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
    )?;
    let psn = monel_verbs::random_psn();
    let mine = Keys {
        lid: 0,
        out_reads: 16,
        qpn: qp.qp_num().value(),
        psn: psn.value(),
        rkey: mr.rkey().0,
        vaddr: mr.addr() + half as u64,
        gid,
        srqn: 0,
    };
    let err = anyhow::Error::msg;
    let theirs = oob.hand_shake(&mine).map_err(err)?;
    if matches!(r.test, Test::WriteLat | Test::ReadLat) {
        // write_lat and read_lat shake hands twice before connecting.
        oob.hand_shake(&mine).map_err(err)?;
    }
    if theirs.gid.to_ip().is_ipv4() != gid.to_ip().is_ipv4() {
        bail!("perftest peer's GID {} is of another IP family", theirs.gid);
    }
    qp.connect(
        &RemoteQp {
            qpn: monel_verbs::Qpn::new(theirs.qpn),
            psn: monel_verbs::Psn::new(theirs.psn),
            gid: theirs.gid,
        },
        &ConnectParams {
            sgid_index: gid_index,
            local_psn: psn,
            mtu,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: theirs.out_reads.clamp(1, 16) as u8,
            hop_limit: 0xff,
            udp_port: None,
        },
    )?;
    println!(
        "# monel perf {} --perftest ({}; MTU {}; {} GID {} {})",
        r.test.name(),
        if client { "client" } else { "server" },
        mtu.bytes(),
        dev.name,
        gid_index,
        gid.to_ip()
    );
    println!(
        "# local  QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
        mine.qpn, mine.psn, mine.rkey, mine.vaddr
    );
    println!(
        "# remote QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {}",
        theirs.qpn,
        theirs.psn,
        theirs.rkey,
        theirs.vaddr,
        theirs.gid.to_ip()
    );
    let line = "-".repeat(87);
    let o = |size| PerfOptions {
        size,
        iters,
        duration: None,
        tx_depth: r.tx_depth.max(1),
        ..PerfOptions::default()
    };
    let e = Endpoint {
        qp: &qp,
        cq: &cq,
        mr: &mr,
        remote: monel_verbs::cm::BufferInfo {
            addr: theirs.vaddr,
            rkey: monel_verbs::RKey(theirs.rkey),
            len: size as u64,
        },
    };
    if !r.test.is_bw() {
        return latency(r.test, oob, &mine, &e, &sizes, iters, client, &line);
    }
    if r.test == Test::SendBw {
        // send_bw: one handshake, then one per QP, then the receives, one more, the run.
        oob.hand_shake(&mine).map_err(err)?;
        oob.hand_shake(&mine).map_err(err)?;
        println!("{line}\n{}", BwReport::HEADER);
        for &size in &sizes {
            let rep = if client {
                oob.hand_shake(&mine).map_err(err)?;
                perf::bw_client(&e, r.test, &o(size))?
            } else {
                let posted = post_recvs(&e, size, RX_DEPTH.min(iters))?;
                oob.hand_shake(&mine).map_err(err)?;
                recv_run(&e, size, iters, posted)?
            };
            println!("{}", row(&numbers(&rep)));
            if r.all {
                // With -a, a handshake closes each size.
                oob.hand_shake(&mine).map_err(err)?;
            }
        }
        println!("{line}");
        oob.close(&mine).map_err(err)?;
        return Ok(());
    }
    // write_bw, read_bw, atomic_bw: two more handshakes; the server waits for the client's
    // run and prints the client's report.
    oob.hand_shake(&mine).map_err(err)?;
    oob.hand_shake(&mine).map_err(err)?;
    println!("{line}\n{}", BwReport::HEADER);
    if client {
        let mut last = BwNumbers::default();
        for &size in &sizes {
            last = numbers(&perf::bw_client(&e, r.test, &o(size))?);
            println!("{}", row(&last));
        }
        println!("{line}");
        oob.hand_shake(&mine).map_err(err)?;
        oob.bw_reports(&last).map_err(err)?;
    } else {
        oob.hand_shake(&mine).map_err(err)?;
        let theirs = oob.bw_reports(&BwNumbers::default()).map_err(err)?;
        println!("{}", row(&theirs));
        println!("{line}");
    }
    oob.close(&mine).map_err(err)?;
    Ok(())
}

/// The latency tests: their handshakes, the ping-pong (WRITE, SEND) or the client's lone
/// READs, and perftest's latency row.
#[allow(clippy::too_many_arguments)]
fn latency(
    test: Test,
    mut oob: Oob,
    mine: &Keys,
    e: &Endpoint<'_>,
    sizes: &[usize],
    iters: u32,
    client: bool,
    line: &str,
) -> anyhow::Result<()> {
    let err = anyhow::Error::msg;
    let header = || println!("{line}\n{} ", LatReport::HEADER);
    match test {
        Test::WriteLat => {
            oob.hand_shake(mine).map_err(err)?;
            oob.hand_shake(mine).map_err(err)?;
            header();
            for &size in sizes {
                let posts = write_pingpong(e, size, iters, !client)?;
                println!("{}", lat_row(size, iters, &posts, 2.0));
            }
            println!("{line}");
            // write_lat ends without a closing exchange.
            Ok(())
        }
        Test::ReadLat => {
            oob.hand_shake(mine).map_err(err)?;
            oob.hand_shake(mine).map_err(err)?;
            if client {
                header();
                for &size in sizes {
                    let posts = reads(e, size, iters)?;
                    println!("{}", lat_row(size, iters, &posts, 1.0));
                }
                println!("{line}");
            }
            oob.close(mine).map_err(err)
        }
        _ => {
            // send_lat: two handshakes, then one more once both sides' receives are posted.
            oob.hand_shake(mine).map_err(err)?;
            oob.hand_shake(mine).map_err(err)?;
            header();
            for &size in sizes {
                let posted = post_recvs(e, size, RX_DEPTH.min(iters))?;
                oob.hand_shake(mine).map_err(err)?;
                let posts = send_pingpong(e, size, iters, client, posted)?;
                println!("{}", lat_row(size, iters, &posts, 2.0));
            }
            println!("{line}");
            oob.close(mine).map_err(err)
        }
    }
}

const STALL: Duration = Duration::from_secs(30);

/// write_lat: each side WRITEs `size` bytes into the peer's half, the last byte counting;
/// it waits for the peer's count in its own half before the next. The server sends first.
/// Returns the post times.
fn write_pingpong(
    e: &Endpoint<'_>,
    size: usize,
    iters: u32,
    server: bool,
) -> anyhow::Result<Vec<Instant>> {
    let half = e.mr.len() / 2;
    let (post_at, poll_at) = (size - 1, half + size - 1);
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut posts = Vec::with_capacity(iters as usize);
    let mut wcs = Vec::new();
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && server) {
            rcnt += 1;
            let t = Instant::now();
            while e.mr.with(|b| b[poll_at]) != rcnt as u8 {
                if t.elapsed() > STALL {
                    bail!("write-lat: message {rcnt} never arrived");
                }
                std::thread::yield_now();
            }
        }
        if scnt < iters {
            posts.push(Instant::now());
            scnt += 1;
            e.mr.write(post_at, &[scnt as u8])?;
            post_signaled(e, u64::from(scnt), SendOp::Write(remote(e)), size)?;
            wait_one(e, &mut wcs, "write-lat")?;
        }
    }
    Ok(posts)
}

/// The peer's half.
fn remote(e: &Endpoint<'_>) -> RemoteAddr {
    RemoteAddr {
        addr: e.remote.addr,
        rkey: e.remote.rkey,
    }
}

/// Posts one signaled `op` of `size` bytes from the start of this side's half.
fn post_signaled(e: &Endpoint<'_>, wr_id: u64, op: SendOp, size: usize) -> monel_verbs::Result<()> {
    e.qp.post_send(SendWr {
        wr_id,
        op,
        sg_list: vec![e.mr.sge(0, size)],
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    })
}

/// read_lat (client): one READ at a time. Returns the post times.
fn reads(e: &Endpoint<'_>, size: usize, iters: u32) -> anyhow::Result<Vec<Instant>> {
    let mut posts = Vec::with_capacity(iters as usize);
    let mut wcs = Vec::new();
    for i in 0..iters {
        posts.push(Instant::now());
        post_signaled(e, u64::from(i), SendOp::Read(remote(e)), size)?;
        wait_one(e, &mut wcs, "read-lat")?;
    }
    Ok(posts)
}

/// send_lat: the server waits for a message before each SEND, the client sends first; sends
/// are signaled every 100th and at the last (perftest's `--cq-mod`). Returns the post times.
fn send_pingpong(
    e: &Endpoint<'_>,
    size: usize,
    iters: u32,
    client: bool,
    mut posted: u32,
) -> anyhow::Result<Vec<Instant>> {
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut posts = Vec::with_capacity(iters as usize);
    let mut wcs: Vec<WorkCompletion> = Vec::new();
    let mut pending_send = false;
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && client) {
            let t = Instant::now();
            let mut got = false;
            while !got {
                wcs.clear();
                if e.cq.poll_into(16, &mut wcs) == 0 {
                    e.cq.wait(Duration::from_millis(20));
                }
                for wc in &wcs {
                    if wc.status != WcStatus::Success {
                        bail!("send-lat: completion {:?}", wc.status);
                    }
                    if wc.opcode == WcOpcode::Recv {
                        rcnt += 1;
                        got = true;
                        if posted < iters {
                            post_recvs(e, size, 1)?;
                            posted += 1;
                        }
                    } else {
                        pending_send = false;
                    }
                }
                if t.elapsed() > STALL {
                    bail!("send-lat: message {} never arrived", rcnt + 1);
                }
            }
        }
        if scnt < iters {
            posts.push(Instant::now());
            scnt += 1;
            let signaled = scnt % 100 == 0 || scnt == iters;
            e.qp.post_send(SendWr {
                wr_id: u64::from(scnt),
                op: SendOp::Send,
                sg_list: vec![e.mr.sge(0, size)],
                flags: SendFlags {
                    signaled,
                    ..SendFlags::default()
                },
            })?;
            pending_send |= signaled;
        }
    }
    // The last signaled send's completion.
    let t = Instant::now();
    while pending_send && t.elapsed() < STALL {
        wcs.clear();
        if e.cq.poll_into(16, &mut wcs) == 0 {
            e.cq.wait(Duration::from_millis(20));
        }
        pending_send &= !wcs.iter().any(|w| w.opcode == WcOpcode::Send);
    }
    Ok(posts)
}

/// Waits for one send completion, which must be a success.
fn wait_one(e: &Endpoint<'_>, wcs: &mut Vec<WorkCompletion>, what: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        wcs.clear();
        if e.cq.poll_into(1, wcs) == 1 {
            if wcs[0].status != WcStatus::Success {
                bail!("{what}: completion {:?}", wcs[0].status);
            }
            return Ok(());
        }
        if t.elapsed() > STALL {
            bail!("{what}: no completion for {STALL:?}");
        }
        e.cq.wait(Duration::from_millis(20));
    }
}

/// perftest's latency row (`REPORT_FMT_LAT`) from the post times: the gaps between
/// consecutive posts over `rtt_factor` (2 for ping-pongs: one way), sorted, the two largest
/// left out; t_typical is the median.
fn lat_row(size: usize, iters: u32, posts: &[Instant], rtt_factor: f64) -> String {
    let mut d: Vec<f64> = posts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    d.sort_by(f64::total_cmp);
    d.truncate(d.len().saturating_sub(2).max(1.min(d.len())));
    let n = d.len();
    if n == 0 {
        return format!(" {size:<7} {iters}          (too few iterations)");
    }
    let median = if n % 2 == 0 {
        (d[n / 2] + d[n / 2 - 1]) / 2.0
    } else {
        d[n / 2]
    };
    let avg = d.iter().sum::<f64>() / n as f64;
    let sd = (d.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / n as f64).sqrt();
    let pct = |p: f64| d[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
    format!(
        " {size:<7} {iters}          {:<7.2}        {:<7.2}      {median:<7.2}  \t       {avg:<7.2}     \t{sd:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        d[0],
        d[n - 1],
        pct(0.99),
        pct(0.999)
    )
}

/// Posts `n` receives of `size` bytes; returns `n`.
fn post_recvs(e: &Endpoint<'_>, size: usize, n: u32) -> anyhow::Result<u32> {
    for i in 0..n {
        e.qp.post_recv(RecvWr {
            wr_id: u64::from(i),
            sg_list: vec![e.mr.sge(0, size)],
        })?;
    }
    Ok(n)
}

/// `send-bw` server: counts `iters` receives, reposting while more are due; the clock runs
/// from the first arrival.
fn recv_run(
    e: &Endpoint<'_>,
    size: usize,
    iters: u32,
    mut posted: u32,
) -> anyhow::Result<BwReport> {
    let (mut got, mut start) = (0u32, None);
    let mut wcs = Vec::new();
    let mut last = Instant::now();
    while got < iters {
        wcs.clear();
        if e.cq.poll_into(64, &mut wcs) == 0 {
            e.cq.wait(Duration::from_millis(50));
            if last.elapsed() > Duration::from_secs(30) {
                bail!("send-bw: {got} of {iters} messages arrived, then none for 30 s");
            }
            continue;
        }
        last = Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                bail!("send-bw: receive completed with {:?}", wc.status);
            }
            start.get_or_insert_with(Instant::now);
            got += 1;
            if posted < iters {
                post_recvs(e, size, 1)?;
                posted += 1;
            }
        }
    }
    let seconds = start.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-9);
    let avg = f64::from(got) * size as f64 / seconds / f64::from(1 << 20);
    Ok(BwReport {
        size,
        iters: u64::from(got),
        seconds,
        peak_mbs: avg,
    })
}
