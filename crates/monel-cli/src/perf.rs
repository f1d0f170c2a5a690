//! `monel perf TEST [SERVER]`: perftest-style bandwidth and latency tests, plus the raw-UDP
//! baselines they are compared with (`udp-bw`, `udp-lat`).

use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::tools::perf::{self, BwReport, Endpoint, LatReport, PerfOptions, Test};
use anyhow::{Context as _, bail};
use clap::Args;

use crate::connect::{self, ConnArgs, Session};
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, sendmmsg};

/// Arguments of `monel perf`.
#[derive(Debug, Args)]
pub(crate) struct PerfArgs {
    /// write-bw | send-bw | read-bw | atomic-bw | write-lat | send-lat | read-lat | atomic-lat |
    /// udp-bw | udp-lat
    test: String,
    /// Server to connect to; without it, act as the server.
    server: Option<String>,
    #[command(flatten)]
    conn: ConnArgs,
    /// Message size.
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// All sizes from 2 bytes to 2^23 (stops at --size if given).
    #[arg(short = 'a', long)]
    all: bool,
    /// Iterations.
    #[arg(short = 'n', long)]
    iters: Option<u32>,
    /// Run for this many seconds instead.
    #[arg(short = 'D', long)]
    duration: Option<u64>,
    /// Send queue depth.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Datagrams per sendmmsg batch (udp-bw).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// udp-lat: each side sends, with every datagram and in the same sendmmsg, a 20-byte one
    /// standing for the ACK a reliable connection owes (BTH, AETH, ICRC) and skips the
    /// peer's on receipt: the least an RC transport puts through the kernel per message.
    #[arg(long)]
    with_ack: bool,
    /// udp-bw: gather every datagram from three pieces, as the soft RNIC sends a packet
    /// without copying its payload: a 12-byte header, the payload, a 4-byte trailer (what the
    /// kernel's copy costs for that layout, user space aside).
    #[arg(long)]
    gather: bool,
    /// QPs, each running the test (bandwidth tests, with --perftest; perftest's `-q`).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Both sides send at once (write-bw, read-bw, atomic-bw, with --perftest; perftest's
    /// `-b`).
    #[arg(short = 'b', long)]
    bidirectional: bool,
    /// Speak perftest's exchange (TCP, `-p`, default 18515) instead of Monel's, so
    /// perftest's `ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`,
    /// `ib_read_lat`, `ib_send_lat` and `ib_atomic_lat` run against this side with the same
    /// `-s`, `-n`, `-a`, `-D`, `-q`, `-b`, `-t` and `-m` (no job secret).
    #[arg(long)]
    perftest: bool,
}

fn cpu_seconds() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    u.map(|u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
    .unwrap_or(0.0)
}

fn sizes(a: &PerfArgs, default: usize) -> Vec<usize> {
    if a.all {
        let max = a.size.unwrap_or(1 << 23);
        (1..=23)
            .map(|k| 1usize << k)
            .filter(|&s| s <= max)
            .collect()
    } else {
        vec![a.size.unwrap_or(default)]
    }
}

pub(crate) fn run(a: &PerfArgs) -> anyhow::Result<()> {
    if a.test == "udp-bw" || a.test == "udp-lat" {
        return udp(a);
    }
    let test = Test::parse(&a.test).with_context(|| format!("unknown test {}", a.test))?;
    if a.perftest {
        return crate::perftest::run(&crate::perftest::Run {
            test,
            device: &a.conn.device,
            server: a.server.as_deref(),
            port: a.conn.port,
            udp_port: a.conn.udp_port,
            mtu: a.conn.mtu,
            size: a.size,
            all: a.all,
            iters: a.iters,
            tx_depth: a.tx_depth,
            secret: connect::secret(&a.conn)?.is_some(),
            qps: a.qps,
            duration: a.duration,
            duplex: a.bidirectional,
        });
    }
    if a.qps != 1 || a.bidirectional {
        bail!("-q and -b run with --perftest");
    }
    if test == Test::AtomicBw {
        bail!("atomic-bw runs with --perftest (against ib_atomic_bw)");
    }
    let default_size = if test.is_bw() { 65536 } else { 2 };
    let all = sizes(a, default_size);
    let maxsize = *all.iter().max().unwrap_or(&default_size);
    let Session {
        dev,
        ctx,
        cq,
        mr,
        qp,
        mut conn,
        is_client,
        ..
    } = connect::open(&a.conn, a.server.as_deref(), a.tx_depth, |pd| {
        perf::buffer(pd, maxsize)
    })?;
    let e = Endpoint {
        qp: &qp,
        cq: &cq,
        mr: &mr,
        remote: conn.remote_buf.context("peer offered no buffer")?,
    };
    println!(
        "# monel perf {} ({}; MTU {}; packets {}; {})",
        a.test,
        if is_client { "client" } else { "server" },
        conn.mtu.bytes(),
        conn.auth,
        dev.name
    );
    println!(
        "{}",
        if test.is_bw() {
            BwReport::HEADER
        } else {
            LatReport::HEADER
        }
    );
    for size in all {
        let o = PerfOptions {
            size,
            iters: a.iters.unwrap_or(if test.is_bw() { 5000 } else { 1000 }),
            duration: a.duration.map(Duration::from_secs),
            tx_depth: a.tx_depth.max(1),
            ..PerfOptions::default()
        };
        conn.barrier()?;
        let cpu0 = cpu_seconds();
        if test.is_bw() {
            if is_client {
                let r = perf::bw_client(std::slice::from_ref(&e), test, &o)?;
                perf::bw_client_finish(test, &r, &mut conn)?;
                let gb = r.size as f64 * r.iters as f64 / 1e9;
                println!(
                    "{}   [{:.2} Gb/s, {:.2} CPU s/GB]",
                    r.row(),
                    r.gbps(),
                    (cpu_seconds() - cpu0) / gb
                );
            } else {
                perf::bw_server(&e, test, &o, &mut conn)?;
            }
        } else {
            let r = perf::lat(&e, test, &o, is_client, a.conn.busy)?;
            conn.barrier()?;
            if is_client {
                println!("{}", r.row());
            }
        }
    }
    if !is_client {
        println!("# server done; counters:\n{}", ctx.counters());
    }
    Ok(())
}

/// Raw UDP baselines: `udp-bw` sends datagrams of RoCE-packet size in sendmmsg batches;
/// `udp-lat` ping-pongs datagrams of the message size.
fn udp(a: &PerfArgs) -> anyhow::Result<()> {
    let bind: IpAddr = a
        .conn
        .device
        .parse()
        .context("udp-*: -d must be an IP address")?;
    let sock = UdpSocket::bind(SocketAddr::new(bind, a.conn.port))?;
    let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
    let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::SndBuf, &(4 << 20));
    let bw = a.test == "udp-bw";
    let size = a.size.unwrap_or(if bw { 65536 } else { 8 });
    // A RoCE packet of a full MTU: BTH + payload + ICRC.
    let dgram = if bw {
        (a.conn.mtu as usize + 16).min(size + 16)
    } else {
        size
    };
    // GSO (unless --no-gso): a sendmmsg of `batch` datagrams carries them as messages of up
    // to 15 4112-byte segments, as the soft RNIC sends a WRITE; the receiver takes GRO.
    let gso = bw && !a.conn.no_gso;
    let per_msg = if gso {
        (65_000 / dgram.max(1)).clamp(1, 64)
    } else {
        1
    };
    if gso {
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::UdpGroSegment, &true)?;
    }
    // Room to receive any datagram of the test (and the stand-in ACK of `--with-ack`).
    let mut buf = vec![0x5au8; (dgram * per_msg).max(if bw { 65_536 } else { 64 })];
    // --busy: spin on a non-blocking socket, as the soft RNIC's busy-polling waits do.
    let busy = a.conn.busy && !bw;
    sock.set_nonblocking(busy)?;
    let mut ack_hdrs = MultiHeaders::<SockaddrStorage>::preallocate(2, None);
    match &a.server {
        None => {
            // Receiver / echo server: runs until the client's zero-length "end" datagram.
            sock.set_read_timeout(Some(Duration::from_secs(60)))?;
            let (mut bytes, mut t0) = (0u64, None);
            let (mut echoed, mut acks) = (0u64, 0u64);
            loop {
                let (n, from) = recv_spin(&sock, &mut buf, busy)?;
                if n == 0 {
                    if let (true, Some(t)) = (bw, t0) {
                        let s = Instant::now().duration_since(t).as_secs_f64();
                        println!(
                            "udp-bw receiver: {:.2} Gb/s payload",
                            bytes as f64 * 8.0 / s / 1e9
                        );
                        sock.send_to(&bytes.to_be_bytes(), from)?;
                    } else if !bw {
                        println!("udp-lat server: {echoed} echoed, {acks} stand-in ACKs dropped");
                    }
                    return Ok(());
                }
                t0.get_or_insert_with(Instant::now);
                if bw {
                    bytes += n as u64;
                } else if a.with_ack && is_ack(&buf[..n]) {
                    acks += 1;
                } else if a.with_ack {
                    send_with_ack(&sock, &mut ack_hdrs, &buf[..n], from)?;
                    echoed += 1;
                } else {
                    sock.send_to(&buf[..n], from)?;
                    echoed += 1;
                }
            }
        }
        Some(s) => {
            let to = SocketAddr::new(s.parse()?, a.conn.port);
            let start = Instant::now();
            if bw {
                let total = size as u64 * u64::from(a.iters.unwrap_or(5000));
                let per = dgram as u64;
                let mut sent = 0u64;
                let cmsg = gso.then(|| nix::cmsg_space!(u16));
                let mut hdrs = MultiHeaders::<SockaddrStorage>::preallocate(a.batch, cmsg);
                let addr = SockaddrStorage::from(to);
                let seg = dgram as u16;
                // --gather: headers and trailers live apart from the payload, as in the RNIC.
                let pieces = [0x11u8; 32];
                if a.gather && dgram < 16 {
                    bail!("--gather: datagrams of at least 16 bytes");
                }
                while sent < total {
                    // Datagrams this call: one batch, cut into messages of `per_msg`.
                    let k = ((total - sent).div_ceil(per) as usize).min(a.batch);
                    let lens: Vec<usize> = (0..k.div_ceil(per_msg))
                        .map(|m| per_msg.min(k - m * per_msg))
                        .collect();
                    let slices: Vec<Vec<IoSlice<'_>>> = lens
                        .iter()
                        .map(|&n| {
                            if a.gather {
                                (0..n)
                                    .flat_map(|i| {
                                        let d = &buf[i * dgram..(i + 1) * dgram];
                                        let (head, rest) = d.split_at(12);
                                        let (body, tail) = rest.split_at(rest.len() - 4);
                                        [
                                            IoSlice::new(&pieces[..head.len()]),
                                            IoSlice::new(body),
                                            IoSlice::new(&pieces[16..16 + tail.len()]),
                                        ]
                                    })
                                    .collect()
                            } else {
                                vec![IoSlice::new(&buf[..n * dgram])]
                            }
                        })
                        .collect();
                    let addrs = vec![Some(addr); lens.len()];
                    let gso_cmsg = [ControlMessage::UdpGsoSegments(&seg)];
                    match sendmmsg(
                        sock.as_raw_fd(),
                        &mut hdrs,
                        &slices,
                        &addrs,
                        if gso { &gso_cmsg[..] } else { &[] },
                        MsgFlags::empty(),
                    ) {
                        Ok(r) => {
                            let n: usize = lens.iter().take(r.count()).sum();
                            sent += n as u64 * per;
                        }
                        Err(nix::errno::Errno::ENOBUFS | nix::errno::Errno::EAGAIN) => {}
                        Err(e) => bail!("sendmmsg: {e}"),
                    }
                }
                let secs = start.elapsed().as_secs_f64();
                sock.set_read_timeout(Some(Duration::from_secs(5)))?;
                std::thread::sleep(Duration::from_millis(100));
                sock.send_to(&[], to)?;
                let mut r = [0u8; 8];
                let n = sock.recv(&mut r)?;
                let got = if n == 8 { u64::from_be_bytes(r) } else { 0 };
                println!(
                    "udp-bw: {} B datagrams{} x{} per sendmmsg{}: sent {:.2} Gb/s, delivered {:.2} Gb/s ({:.1}% of bytes)",
                    dgram,
                    if a.gather {
                        " (gathered: header, payload, trailer)"
                    } else {
                        ""
                    },
                    a.batch,
                    if gso {
                        format!(" (GSO, up to {per_msg} per message)")
                    } else {
                        String::new()
                    },
                    sent as f64 * 8.0 / secs / 1e9,
                    got as f64 * 8.0 / secs / 1e9,
                    100.0 * got as f64 / sent as f64
                );
            } else {
                sock.set_read_timeout(Some(Duration::from_secs(5)))?;
                let n = a.iters.unwrap_or(1000) as usize;
                let mut samples = Vec::with_capacity(n);
                let mut r = vec![0u8; buf.len()];
                for _ in 0..n {
                    let t = Instant::now();
                    if a.with_ack {
                        send_with_ack(&sock, &mut ack_hdrs, &buf[..size], to)?;
                        loop {
                            let (k, _) = recv_spin(&sock, &mut r, busy)?;
                            if !is_ack(&r[..k]) {
                                break;
                            }
                        }
                    } else {
                        sock.send_to(&buf[..size], to)?;
                        recv_spin(&sock, &mut r, busy)?;
                    }
                    samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
                sock.send_to(&[], to)?;
                samples.sort_by(f64::total_cmp);
                println!("{}", LatReport::HEADER);
                println!("{}", LatReport { size, samples }.row());
            }
            Ok(())
        }
    }
}

/// The stand-in ACK of `udp-lat --with-ack`: as long as a RoCE ACK (BTH 12, AETH 4, ICRC 4).
const ACK: [u8; 20] = [0x11; 20];

fn is_ack(d: &[u8]) -> bool {
    d == ACK
}

/// Sends `data`, then the stand-in ACK, in one sendmmsg (as the soft RNIC sends a reply with
/// the ACK it owes behind it), over headers made once per run (as the soft RNIC's are).
fn send_with_ack(
    sock: &UdpSocket,
    hdrs: &mut MultiHeaders<SockaddrStorage>,
    data: &[u8],
    to: SocketAddr,
) -> anyhow::Result<()> {
    let addr = Some(SockaddrStorage::from(to));
    let slices = [[IoSlice::new(data)], [IoSlice::new(&ACK)]];
    let sent = sendmmsg(
        sock.as_raw_fd(),
        hdrs,
        &slices,
        [addr, addr],
        [],
        MsgFlags::empty(),
    )?
    .count();
    anyhow::ensure!(sent == 2, "sendmmsg sent {sent} of 2");
    Ok(())
}

/// Receives one datagram: blocking, or (`busy`) spinning on a non-blocking socket for up to
/// 60 s.
fn recv_spin(sock: &UdpSocket, buf: &mut [u8], busy: bool) -> std::io::Result<(usize, SocketAddr)> {
    if !busy {
        return sock.recv_from(buf);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match sock.recv_from(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(e);
                }
                std::hint::spin_loop();
            }
            r => return r,
        }
    }
}
