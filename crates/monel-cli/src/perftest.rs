//! `monel perf TEST --perftest`: the tests with perftest's own exchange, so `ib_write_bw`,
//! `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_read_lat`, `ib_send_lat`
//! and `ib_atomic_lat` (run with the same `-s`, `-n` or `-D`, `-a`, `-q`, `-b` and `-p` as
//! Monel) meet Monel as server or client, on the soft RNIC or a kernel RDMA device. The
//! report is perftest's, column for column. The exchange is perftest's: unauthenticated, so
//! a job secret refuses it.

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
    /// `-q`: QPs, each running the test (bandwidth tests).
    pub(crate) qps: u32,
    /// `-D`: seconds to run instead of iterations (bandwidth tests).
    pub(crate) duration: Option<u64>,
    /// `-b`: both sides run at once (write, read and atomic bandwidth).
    pub(crate) duplex: bool,
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

/// Most QPs `-q` takes.
const MAX_QPS: u32 = 16;

/// Runs one test against perftest.
pub(crate) fn run(r: &Run<'_>) -> anyhow::Result<()> {
    if r.secret {
        bail!(
            "--perftest: perftest's exchange cannot prove a job secret; unset MONEL_SECRET \
             (and --secret-file) to meet perftest's tools"
        );
    }
    if !(1..=MAX_QPS).contains(&r.qps) {
        bail!("-q {}: from 1 to {MAX_QPS} QPs", r.qps);
    }
    if !r.test.is_bw() && (r.qps > 1 || r.duplex || r.duration.is_some()) {
        bail!("--perftest: -q, -b and -D run with the bandwidth tests");
    }
    if r.duration.is_some() && r.all {
        bail!("--perftest: -D cannot run every size (-a), as perftest's cannot");
    }
    if r.duration.is_some_and(|d| d < 1) {
        bail!("-D 0: run for at least a second");
    }
    let dev = Device::from_arg(r.device)?;
    let gid_index = dev
        .ipv4_gid_index()
        .context("--perftest: the device has no IPv4 RoCE v2 GID (perftest speaks IPv4)")?;
    let want = Mtu::from_bytes(r.mtu).with_context(|| format!("-m {}: not an IB MTU", r.mtu))?;
    let mtu_code = want.min(dev.port_attr().active_mtu) as u8;
    let sizes: Vec<usize> = match r.test {
        Test::AtomicBw | Test::AtomicLat => vec![8],
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
    let gid = ctx.query_gid(gid_index)?.gid;
    let (stream, client) = tcp(r, gid.to_ip())?;
    let mut oob = Oob::new(stream, client)?;
    let agreed = oob
        .open(PAGE, CACHE_LINE, mtu_code)
        .map_err(anyhow::Error::msg)?;
    // `IBV_MTU_*` codes 1..=5 are 256 << (code - 1) bytes.
    let mtu = Mtu::from_bytes(128 << agreed.mtu_code).context("perftest MTU code")?;
    let pd = ctx.alloc_pd();
    // As perftest: one CQ for every QP.
    let cq = ctx.create_cq(((r.tx_depth + RX_DEPTH) * r.qps) as usize)?;
    // As perftest: each QP's buffer, the first half this side's source, the second what the
    // peer reaches.
    let half = size.max(agreed.cycle_buffer as usize);
    let mut qps = Vec::new();
    let mut mrs = Vec::new();
    let mut mine = Vec::new();
    for _ in 0..r.qps {
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
        let mr = pd.reg_mr(
            vec![0u8; 2 * half],
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )?;
        mine.push(Keys {
            lid: 0,
            out_reads: 16,
            qpn: qp.qp_num().value(),
            psn: monel_verbs::random_psn().value(),
            rkey: mr.rkey().0,
            vaddr: mr.addr() + half as u64,
            gid,
            srqn: 0,
        });
        qps.push(qp);
        mrs.push(mr);
    }
    let err = anyhow::Error::msg;
    // Each QP's keys for the peer's.
    let theirs = mine
        .iter()
        .map(|k| oob.hand_shake(k))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let k0 = mine[0];
    if matches!(r.test, Test::WriteLat | Test::ReadLat | Test::AtomicLat) {
        // write_lat, read_lat and atomic_lat shake hands twice before connecting.
        oob.hand_shake(&k0).map_err(err)?;
    }
    for (qp, (me, them)) in qps.iter().zip(mine.iter().zip(&theirs)) {
        if them.gid.to_ip().is_ipv4() != gid.to_ip().is_ipv4() {
            bail!("perftest peer's GID {} is of another IP family", them.gid);
        }
        qp.connect(
            &RemoteQp {
                qpn: monel_verbs::Qpn::new(them.qpn),
                psn: monel_verbs::Psn::new(them.psn),
                gid: them.gid,
            },
            &ConnectParams {
                sgid_index: gid_index,
                local_psn: monel_verbs::Psn::new(me.psn),
                mtu,
                access: AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                min_rnr_timer: 12,
                rd_atomic: them.out_reads.clamp(1, 16) as u8,
                hop_limit: 0xff,
                udp_port: None,
            },
        )?;
    }
    println!(
        "# monel perf {} --perftest ({}; MTU {}; {} GID {} {}; {} QP{}{}{})",
        r.test.name(),
        if client { "client" } else { "server" },
        mtu.bytes(),
        dev.name,
        gid_index,
        gid.to_ip(),
        r.qps,
        if r.qps > 1 { "s" } else { "" },
        if r.duplex { "; bidirectional" } else { "" },
        r.duration.map(|d| format!("; {d} s")).unwrap_or_default()
    );
    for (me, them) in mine.iter().zip(&theirs) {
        println!(
            "# local  QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
            me.qpn, me.psn, me.rkey, me.vaddr
        );
        println!(
            "# remote QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {}",
            them.qpn,
            them.psn,
            them.rkey,
            them.vaddr,
            them.gid.to_ip()
        );
    }
    let line = "-".repeat(87);
    let duration = r.duration.map(Duration::from_secs);
    let o = |size| PerfOptions {
        size,
        iters,
        duration,
        // perftest's margin: a quarter of the duration at each end.
        margin: duration.map(|d| d / 4),
        tx_depth: r.tx_depth.max(1),
        ..PerfOptions::default()
    };
    let eps: Vec<Endpoint<'_>> = qps
        .iter()
        .zip(&mrs)
        .zip(&theirs)
        .map(|((qp, mr), them)| Endpoint {
            qp,
            cq: &cq,
            mr,
            remote: monel_verbs::cm::BufferInfo {
                addr: them.vaddr,
                rkey: monel_verbs::RKey(them.rkey),
                len: size as u64,
            },
        })
        .collect();
    if !r.test.is_bw() {
        return latency(r.test, oob, &k0, &eps[0], &sizes, iters, client, &line);
    }
    // The keys again, QP by QP, once every QP is connected ("remote" in perftest's words).
    let remote_keys = |oob: &mut Oob| -> anyhow::Result<()> {
        for k in &mine {
            oob.hand_shake(k).map_err(err)?;
        }
        Ok(())
    };
    if r.test == Test::SendBw {
        // send_bw: one handshake, the keys again, then per size: the receives, one more
        // handshake, the run.
        oob.hand_shake(&k0).map_err(err)?;
        remote_keys(&mut oob)?;
        println!("{line}\n{}", BwReport::HEADER);
        let each = if duration.is_some() {
            RX_DEPTH
        } else {
            RX_DEPTH.min(iters)
        };
        for &size in &sizes {
            let rep = if r.duplex {
                // Both ways: both post receives, then each sends as it receives (the server
                // from the client's first message on).
                for e in &eps {
                    post_recvs(e, size, each)?;
                }
                oob.hand_shake(&k0).map_err(err)?;
                let mine = numbers(&both_ways(&eps, &o(size), each, client)?);
                if duration.is_some() {
                    mine
                } else {
                    sum(&mine, &oob.bw_reports(&mine).map_err(err)?)
                }
            } else if client {
                oob.hand_shake(&k0).map_err(err)?;
                numbers(&perf::bw_client(&eps, r.test, &o(size))?)
            } else {
                for e in &eps {
                    post_recvs(e, size, each)?;
                }
                oob.hand_shake(&k0).map_err(err)?;
                numbers(&recv_run(&eps, &o(size), each)?)
            };
            println!("{}", row(&rep));
            if r.all {
                // With -a, a handshake closes each size.
                oob.hand_shake(&k0).map_err(err)?;
            }
        }
        println!("{line}");
        oob.close(&k0).map_err(err)?;
        return Ok(());
    }
    // write_bw, read_bw, atomic_bw: the keys again and one more handshake. Half duplex: the
    // server waits for the client's run and prints the client's report. Both ways (-b):
    // both run, each size between handshakes, and each prints the sum of both reports.
    remote_keys(&mut oob)?;
    oob.hand_shake(&k0).map_err(err)?;
    println!("{line}\n{}", BwReport::HEADER);
    if !client && !r.duplex {
        oob.hand_shake(&k0).map_err(err)?;
        let theirs = oob.bw_reports(&BwNumbers::default()).map_err(err)?;
        println!("{}", row(&theirs));
        println!("{line}");
        oob.close(&k0).map_err(err)?;
        return Ok(());
    }
    let mut last = BwNumbers::default();
    for &size in &sizes {
        if r.duplex {
            oob.hand_shake(&k0).map_err(err)?;
        }
        last = numbers(&perf::bw_client(&eps, r.test, &o(size))?);
        if r.duplex {
            if r.all {
                oob.hand_shake(&k0).map_err(err)?;
            }
            let peer = oob.bw_reports(&last).map_err(err)?;
            println!("{}", row(&sum(&last, &peer)));
        } else {
            println!("{}", row(&last));
        }
    }
    println!("{line}");
    if !r.duplex {
        oob.hand_shake(&k0).map_err(err)?;
        oob.bw_reports(&last).map_err(err)?;
    }
    oob.close(&k0).map_err(err)?;
    Ok(())
}

/// Both sides' reports of a bidirectional run, as perftest adds them: rates summed, size and
/// iterations this side's.
fn sum(mine: &BwNumbers, theirs: &BwNumbers) -> BwNumbers {
    BwNumbers {
        bw_peak: mine.bw_peak + theirs.bw_peak,
        bw_avg: mine.bw_avg + theirs.bw_avg,
        msg_rate: mine.msg_rate + theirs.msg_rate,
        ..*mine
    }
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
        Test::ReadLat | Test::AtomicLat => {
            oob.hand_shake(mine).map_err(err)?;
            oob.hand_shake(mine).map_err(err)?;
            if client {
                header();
                for &size in sizes {
                    let posts = reads(e, test, size, iters)?;
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

/// read_lat and atomic_lat (client): one READ (or FETCH_AND_ADD of 8 bytes) at a time.
/// Returns the post times.
fn reads(e: &Endpoint<'_>, test: Test, size: usize, iters: u32) -> anyhow::Result<Vec<Instant>> {
    let mut posts = Vec::with_capacity(iters as usize);
    let mut wcs = Vec::new();
    for i in 0..iters {
        posts.push(Instant::now());
        let op = if test == Test::AtomicLat {
            SendOp::FetchAdd {
                remote: remote(e),
                add: 1,
            }
        } else {
            SendOp::Read(remote(e))
        };
        post_signaled(e, u64::from(i), op, size)?;
        wait_one(e, &mut wcs, test.name())?;
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

/// A timed run's clock (perftest's `-D`): it starts at `start` (the server's at its first
/// arrival), counts what completes between the margins, and ends after the duration.
struct Sampler {
    duration: Duration,
    margin: Duration,
    start: Option<Instant>,
    opened: Option<(u64, Instant)>,
    closed: Option<(u64, Instant)>,
}

impl Sampler {
    fn new(o: &PerfOptions, start: Option<Instant>) -> Option<Self> {
        Some(Self {
            duration: o.duration?,
            margin: o.margin.unwrap_or_default(),
            start,
            opened: None,
            closed: None,
        })
    }
    /// Notes the count at `now`; true once the duration has passed.
    fn tick(&mut self, count: u64, now: Instant) -> bool {
        let Some(t0) = self.start else {
            return false;
        };
        if self.opened.is_none() && now >= t0 + self.margin {
            self.opened = Some((count, now));
        }
        if self.closed.is_none() && now >= t0 + self.duration.saturating_sub(self.margin) {
            self.closed = Some((count, now));
        }
        now >= t0 + self.duration
    }
    /// What the window held, as perftest reports a timed run (no peak).
    fn report(&self, size: usize) -> Option<BwReport> {
        let ((a, ta), (b, tb)) = (self.opened?, self.closed?);
        Some(BwReport {
            size,
            iters: b - a,
            seconds: (tb - ta).as_secs_f64().max(1e-9),
            peak_mbs: 0.0,
        })
    }
}

/// The next completions into `wcs` (waiting a little when there are none: then `Ok(false)`);
/// an error once nothing has completed for 30 s since `last`, or on a failed completion.
fn next_completions(
    cq: &monel_verbs::CompletionQueue,
    wcs: &mut Vec<WorkCompletion>,
    last: &mut Instant,
    what: &str,
) -> anyhow::Result<bool> {
    wcs.clear();
    if cq.poll_into(64, wcs) == 0 {
        cq.wait(Duration::from_millis(20));
        if last.elapsed() > Duration::from_secs(30) {
            bail!("{what}: nothing completed for 30 s");
        }
        return Ok(false);
    }
    *last = Instant::now();
    if let Some(wc) = wcs.iter().find(|w| w.status != WcStatus::Success) {
        bail!("{what}: completion {:?} ({:?})", wc.status, wc.opcode);
    }
    Ok(true)
}

/// A whole-run report: `count` messages of `size` since `start`.
fn whole_run(size: usize, count: u64, start: Option<Instant>) -> BwReport {
    let seconds = start.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-9);
    BwReport {
        size,
        iters: count,
        seconds,
        peak_mbs: count as f64 * size as f64 / seconds / f64::from(1 << 20),
    }
}

/// `send-bw -b`: each side SENDs `iters` messages on each QP while it receives as many,
/// reposting a receive on its QP while more are due; the server starts sending at its first
/// arrival (perftest's `run_iter_bi`). With a duration, both run for it and count what this
/// side sent between the margins. The report is this side's sends.
fn both_ways(
    eps: &[Endpoint<'_>],
    o: &PerfOptions,
    posted: u32,
    client: bool,
) -> anyhow::Result<BwReport> {
    let cq = eps[0].cq;
    let qpns: Vec<_> = eps.iter().map(|e| e.qp.qp_num()).collect();
    let n = eps.len();
    let (mut sent, mut done, mut got) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    let mut rposted = vec![u64::from(posted); n];
    let per = if o.duration.is_some() {
        u64::MAX
    } else {
        u64::from(o.iters)
    };
    let cq_mod = u64::from(o.cq_mod.clamp(1, o.tx_depth));
    let mut start = client.then(Instant::now);
    let mut sampler = Sampler::new(o, start);
    let mut wcs = Vec::new();
    let mut last = Instant::now();
    loop {
        let stop = sampler
            .as_mut()
            .is_some_and(|s| s.tick(done.iter().sum(), Instant::now()));
        let sending = start.is_some() && !stop;
        let mut busy = o.duration.is_some() && !stop;
        for (k, e) in eps.iter().enumerate() {
            while sending && sent[k] < per && sent[k] - done[k] < u64::from(o.tx_depth) {
                let sig = (sent[k] + 1) % cq_mod == 0 || sent[k] + 1 == per;
                match e.qp.post_send(SendWr {
                    wr_id: sent[k] + 1,
                    op: SendOp::Send,
                    sg_list: vec![e.mr.sge(0, o.size)],
                    flags: SendFlags {
                        signaled: sig,
                        ..SendFlags::default()
                    },
                }) {
                    Ok(()) => sent[k] += 1,
                    Err(monel_verbs::VerbsError {
                        kind: monel_verbs::ErrorKind::Post(_),
                        ..
                    }) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            // Unsignaled sends at the end of a timed run complete with the next signaled
            // one: the run ends when the last signaled one has.
            let owed = if stop {
                sent[k] - sent[k] % cq_mod
            } else {
                sent[k]
            };
            busy |= done[k] < owed || (o.duration.is_none() && (sent[k] < per || got[k] < per));
        }
        if !busy {
            break;
        }
        if !next_completions(cq, &mut wcs, &mut last, "send-bw -b")? {
            continue;
        }
        for wc in &wcs {
            let Some(k) = qpns.iter().position(|&q| q == wc.qp_num) else {
                continue;
            };
            if wc.opcode == WcOpcode::Recv {
                if start.is_none() {
                    start = Some(Instant::now());
                    sampler = Sampler::new(o, start);
                }
                got[k] += 1;
                if rposted[k] < per {
                    post_recvs(&eps[k], o.size, 1)?;
                    rposted[k] += 1;
                }
            } else {
                done[k] = done[k].max(wc.wr_id);
            }
        }
    }
    Ok(sampler
        .and_then(|s| s.report(o.size))
        .unwrap_or_else(|| whole_run(o.size, done.iter().sum(), start)))
}

/// `send-bw` server: counts `iters` receives on each QP (each began with `posted` posted),
/// reposting on a QP while more are due there; the clock runs from the first arrival. With a
/// duration: receives until it has passed since the first arrival, counting what arrives
/// between the margins (perftest's `-D`).
fn recv_run(eps: &[Endpoint<'_>], o: &PerfOptions, posted: u32) -> anyhow::Result<BwReport> {
    let cq = eps[0].cq;
    let qpns: Vec<_> = eps.iter().map(|e| e.qp.qp_num()).collect();
    let mut posted = vec![posted; eps.len()];
    let total = u64::from(o.iters) * eps.len() as u64;
    let (mut got, mut start) = (0u64, None::<Instant>);
    let mut sampler = Sampler::new(o, None);
    let mut wcs = Vec::new();
    let mut last = Instant::now();
    loop {
        let done = match sampler.as_mut() {
            Some(s) => s.tick(got, Instant::now()),
            None => got >= total,
        };
        if done {
            break;
        }
        if !next_completions(cq, &mut wcs, &mut last, "send-bw")? {
            continue;
        }
        for wc in &wcs {
            if start.is_none() {
                start = Some(Instant::now());
                sampler = Sampler::new(o, start);
            }
            got += 1;
            let Some(k) = qpns.iter().position(|&q| q == wc.qp_num) else {
                continue;
            };
            if o.duration.is_some() || posted[k] < o.iters {
                post_recvs(&eps[k], o.size, 1)?;
                posted[k] += 1;
            }
        }
    }
    Ok(sampler
        .and_then(|s| s.report(o.size))
        .unwrap_or_else(|| whole_run(o.size, got, start)))
}
