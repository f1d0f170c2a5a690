//! `monel perf TEST --perftest`: the tests with perftest's own exchange, so `ib_write_bw`,
//! `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_read_lat`, `ib_send_lat`
//! and `ib_atomic_lat` (run with the same `-s`, `-n` or `-D`, `-a`, `-q`, `-b` and `-p` as
//! Monel) meet Monel as server or client, on the soft RNIC or a kernel RDMA device. The
//! report is perftest's, column for column. The exchange is perftest's: unauthenticated, so
//! a job secret refuses it.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context as _, bail};
use monel_verbs::{
    AccessFlags, ConnectParams, Context, ContextConfig, Device, Mtu, QpCap, QpInitAttr, QpType,
    RemoteQp,
};

use crate::tools::perf::{self, BwReport, Endpoint, LatReport, PerfOptions, Test};
use crate::tools::perftest_oob::{BwNumbers, Keys, Oob};
use crate::tools::perftest_runs::{
    both_ways, lat_row, post_recvs, reads, recv_run, send_pingpong, write_pingpong,
};
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
    let bw = Bandwidth {
        r,
        mine: &mine,
        eps: &eps,
        sizes: &sizes,
        client,
        line: &line,
        opts: o,
    };
    if r.test == Test::SendBw {
        bw.send(oob)
    } else {
        bw.one_sided(oob)
    }
}

/// A bandwidth test's run against perftest once every QP is connected: the keys again, QP
/// by QP ("remote" in perftest's words), then the test's own handshakes around each size.
struct Bandwidth<'a, O: Fn(usize) -> PerfOptions> {
    r: &'a Run<'a>,
    mine: &'a [Keys],
    eps: &'a [Endpoint<'a>],
    sizes: &'a [usize],
    client: bool,
    line: &'a str,
    /// The run's options for one message size.
    opts: O,
}

impl<O: Fn(usize) -> PerfOptions> Bandwidth<'_, O> {
    fn remote_keys(&self, oob: &mut Oob) -> anyhow::Result<()> {
        for k in self.mine {
            oob.hand_shake(k).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }

    /// send_bw: one handshake, the keys again, then per size: the receives, one more
    /// handshake, the run.
    fn send(&self, mut oob: Oob) -> anyhow::Result<()> {
        let err = anyhow::Error::msg;
        let (r, eps, k0) = (self.r, self.eps, &self.mine[0]);
        oob.hand_shake(k0).map_err(err)?;
        self.remote_keys(&mut oob)?;
        println!("{}\n{}", self.line, BwReport::HEADER);
        let each = if r.duration.is_some() {
            RX_DEPTH
        } else {
            RX_DEPTH.min((self.opts)(0).iters)
        };
        for &size in self.sizes {
            let o = (self.opts)(size);
            let rep = if r.duplex {
                // Both ways: both post receives, then each sends as it receives (the server
                // from the client's first message on).
                for e in eps {
                    post_recvs(e, size, each)?;
                }
                oob.hand_shake(k0).map_err(err)?;
                let mine = numbers(&both_ways(eps, &o, each, self.client)?);
                if r.duration.is_some() {
                    mine
                } else {
                    sum(&mine, &oob.bw_reports(&mine).map_err(err)?)
                }
            } else if self.client {
                oob.hand_shake(k0).map_err(err)?;
                numbers(&perf::bw_client(eps, r.test, &o)?)
            } else {
                for e in eps {
                    post_recvs(e, size, each)?;
                }
                oob.hand_shake(k0).map_err(err)?;
                numbers(&recv_run(eps, &o, each)?)
            };
            println!("{}", row(&rep));
            if r.all {
                // With -a, a handshake closes each size.
                oob.hand_shake(k0).map_err(err)?;
            }
        }
        println!("{}", self.line);
        oob.close(k0).map_err(err)
    }

    /// write_bw, read_bw, atomic_bw: the keys again and one more handshake. Half duplex: the
    /// server waits for the client's run and prints the client's report. Both ways (-b):
    /// both run, each size between handshakes, and each prints the sum of both reports.
    fn one_sided(&self, mut oob: Oob) -> anyhow::Result<()> {
        let err = anyhow::Error::msg;
        let (r, k0) = (self.r, &self.mine[0]);
        self.remote_keys(&mut oob)?;
        oob.hand_shake(k0).map_err(err)?;
        println!("{}\n{}", self.line, BwReport::HEADER);
        if !self.client && !r.duplex {
            oob.hand_shake(k0).map_err(err)?;
            let theirs = oob.bw_reports(&BwNumbers::default()).map_err(err)?;
            println!("{}", row(&theirs));
            println!("{}", self.line);
            return oob.close(k0).map_err(err);
        }
        let mut last = BwNumbers::default();
        for &size in self.sizes {
            if r.duplex {
                oob.hand_shake(k0).map_err(err)?;
            }
            last = numbers(&perf::bw_client(self.eps, r.test, &(self.opts)(size))?);
            if r.duplex {
                if r.all {
                    oob.hand_shake(k0).map_err(err)?;
                }
                let peer = oob.bw_reports(&last).map_err(err)?;
                println!("{}", row(&sum(&last, &peer)));
            } else {
                println!("{}", row(&last));
            }
        }
        println!("{}", self.line);
        if !r.duplex {
            oob.hand_shake(k0).map_err(err)?;
            oob.bw_reports(&last).map_err(err)?;
        }
        oob.close(k0).map_err(err)
    }
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
