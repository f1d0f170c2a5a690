//! The `monel` binary, run as a user would.

use std::process::Command;

const CAPTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../monel-wire/tests/data/rxe-pingpong.pcap"
);

fn monel(args: &[&str]) -> (i32, String) {
    finish(spawn(args))
}

#[test]
fn dump_checks_every_icrc_of_the_rxe_capture() {
    let (code, out) = monel(&["dump", CAPTURE]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1013 records, 1000 RoCEv2 packets, 0 bad ICRC, 0 malformed"),
        "{out}"
    );
    assert!(
        out.contains("10.77.0.3 > 10.77.0.2 RC_SEND_FIRST qp=0x000011"),
        "{out}"
    );
}

#[test]
fn dump_reports_a_corrupted_packet_and_fails() {
    let mut bytes = std::fs::read(CAPTURE).unwrap();
    // Flip one payload byte of some packet deep in the file (inside a 1024-byte SEND payload).
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    let path = std::env::temp_dir().join(format!("monel-cli-{}.pcap", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let (code, out) = monel(&["dump", "-q", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1 bad ICRC") || out.contains("1 malformed"),
        "{out}"
    );
}

#[test]
fn dump_of_a_missing_or_bad_file_is_a_clear_error() {
    let (code, out) = monel(&["dump", "/nonexistent/x.pcap"]);
    assert_ne!(code, 0);
    assert!(out.contains("reading /nonexistent/x.pcap"), "{out}");
    let path = std::env::temp_dir().join(format!("monel-cli-bad-{}.pcap", std::process::id()));
    std::fs::write(&path, b"not a pcap file at all, sorry").unwrap();
    let (code, out) = monel(&["dump", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert_ne!(code, 0);
    assert!(out.contains("malformed pcap data"), "{out}");
}

#[test]
fn sim_prints_the_loss_table() {
    let (code, out) = monel(&["sim", "--ops", "40", "--loss", "0,5"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("loss%"), "{out}");
    assert!(out.contains("   0.0       160"), "{out}");
    assert!(out.contains("   5.0       160"), "{out}");
    let (code, out) = monel(&["sim", "--loss", "150"]);
    assert_ne!(code, 0);
    assert!(out.contains("loss rates are percentages"), "{out}");
}

/// Starts `monel ARGS` in the background (a server), returning the child.
fn spawn(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_monel"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(c: std::process::Child) -> (i32, String) {
    let out = c.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn pingpong_between_two_processes_checks_data() {
    let srv = spawn(&[
        "pingpong",
        "-d",
        "127.0.1.2",
        "-p",
        "18811",
        "--udp-port",
        "24811",
        "-n",
        "300",
        "-s",
        "10000",
        "-c",
        "--counters",
    ]);
    // A garbled and a silent connection first: the server drops the one, outlasts the
    // other, and serves the real client.
    let at = "127.0.1.2:18811";
    let t = std::time::Instant::now();
    let mut garbled = loop {
        match std::net::TcpStream::connect(at) {
            Ok(s) => break s,
            Err(e) if t.elapsed() > std::time::Duration::from_secs(10) => panic!("{at}: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    };
    std::io::Write::write_all(&mut garbled, &[0xff; 52]).unwrap();
    let silent = std::net::TcpStream::connect(at).unwrap();
    let (code, out) = monel(&[
        "pingpong",
        "-d",
        "127.0.1.3",
        "-p",
        "18811",
        "--udp-port",
        "24811",
        "-n",
        "300",
        "-s",
        "10000",
        "-c",
        "127.0.1.2",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("6000000 bytes in"), "{out}");
    assert!(out.contains("300 iters in"), "{out}");
    let (code, sout) = finish(srv);
    drop((garbled, silent));
    assert_eq!(code, 0, "{sout}");
    assert!(sout.contains("icrc_errors              0"), "{sout}");
    assert!(sout.contains("dropped a connection"), "{sout}");
}

#[test]
fn ud_pingpong_between_two_processes_checks_data() {
    let args = |dev: &'static str| {
        vec![
            "pingpong",
            "--ud",
            "-d",
            dev,
            "-p",
            "18813",
            "--udp-port",
            "24814",
            "-n",
            "300",
            "-s",
            "4096",
            "-c",
        ]
    };
    let mut s = args("127.0.1.20");
    s.push("--counters");
    let srv = spawn(&s);
    let mut c = args("127.0.1.21");
    c.push("127.0.1.20");
    let (code, out) = monel(&c);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2457600 bytes in"), "{out}");
    let (code, sout) = finish(srv);
    assert_eq!(code, 0, "{sout}");
    assert!(sout.contains("icrc_errors              0"), "{sout}");
}

#[test]
fn perf_tools_run_between_two_processes() {
    for (i, test) in [
        "write-bw",
        "send-bw",
        "read-bw",
        "write-lat",
        "send-lat",
        "read-lat",
        "atomic-lat",
    ]
    .iter()
    .enumerate()
    {
        let port = (18820 + i).to_string();
        let srv = spawn(&[
            "perf",
            test,
            "-d",
            "127.0.1.4",
            "-p",
            &port,
            "--udp-port",
            "24812",
            "-n",
            "200",
            "-s",
            "8192",
        ]);
        let (code, out) = monel(&[
            "perf",
            test,
            "-d",
            "127.0.1.5",
            "-p",
            &port,
            "--udp-port",
            "24812",
            "-n",
            "200",
            "-s",
            "8192",
            "127.0.1.4",
        ]);
        assert_eq!(code, 0, "{test}: {out}");
        let row = out.lines().last().unwrap_or_default().to_string();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols.first(), Some(&"8192"), "{test}: {out}");
        assert!(
            cols.get(1)
                .is_some_and(|n| n.parse::<u64>().unwrap() >= 200),
            "{test}: {out}"
        );
        let (code, sout) = finish(srv);
        assert_eq!(code, 0, "{test} server: {sout}");
    }
}

#[test]
fn perftest_exchange_runs_between_two_processes_with_its_flags() {
    // Monel on both sides of perftest's exchange (perftest itself meets it in the rxe VM):
    // several QPs, both ways at once, a duration, and atomic_lat.
    for (i, (test, size, flags)) in [
        ("write-bw", "65536", &["-q", "2", "-b"][..]),
        ("send-bw", "65536", &["-b", "-q", "2"][..]),
        ("read-bw", "65536", &["-q", "3"][..]),
        ("send-bw", "4096", &["-D", "1"][..]),
        ("atomic-bw", "8", &["-D", "1", "-q", "2"][..]),
        ("atomic-lat", "8", &[][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18840 + i).to_string();
        let duration = flags.contains(&"-D");
        let qps: u64 = flags
            .iter()
            .position(|f| *f == "-q")
            .map_or(1, |k| flags[k + 1].parse().unwrap());
        let args = |dev: &'static str| {
            let mut a = vec!["perf", test, "--perftest", "-d", dev, "-p", &port];
            a.extend(["--udp-port", "24813", "-s", size]);
            if !duration {
                a.extend(["-n", "100"]);
            }
            a.extend(flags);
            a.into_iter().map(String::from).collect::<Vec<_>>()
        };
        let sargs = args("127.0.1.6");
        let srv = spawn(&sargs.iter().map(String::as_str).collect::<Vec<_>>());
        let mut cargs = args("127.0.1.7");
        cargs.push("127.0.1.6".into());
        let (code, out) = monel(&cargs.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "{test} {flags:?}: {out}");
        let (scode, sout) = finish(srv);
        assert_eq!(scode, 0, "{test} {flags:?} server: {sout}");
        for (side, text) in [("client", &out), ("server", &sout)] {
            if test == "atomic-lat" && side == "server" {
                // The server only lends its memory: no row.
                continue;
            }
            let row = text
                .lines()
                .skip_while(|l| !l.contains("#bytes"))
                .nth(1)
                .unwrap_or_default();
            let cols: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(cols.first(), Some(&size), "{test} {flags:?} {side}: {text}");
            let n: u64 = cols.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
            if duration {
                assert!(n > 0, "{test} {flags:?} {side}: {text}");
                assert_eq!(cols.get(2), Some(&"0.00"), "no peak with -D: {text}");
            } else {
                assert_eq!(n, 100 * qps, "{test} {flags:?} {side}: {text}");
            }
        }
    }
    for (args, says) in [
        (
            &["perf", "write-bw", "-q", "2"][..],
            "-q and -b run with --perftest",
        ),
        (
            &["perf", "write-bw", "--perftest", "-q", "17"][..],
            "-q 17: from 1 to 16",
        ),
        (
            &["perf", "write-lat", "--perftest", "-b"][..],
            "run with the bandwidth tests",
        ),
        (
            &["perf", "write-bw", "--perftest", "-a", "-D", "2"][..],
            "-D cannot run every size",
        ),
    ] {
        let (code, out) = monel(args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(out.contains(says), "{args:?}: {out}");
    }
}

#[test]
fn xfer_bench_moves_and_checks_blocks_both_ways() {
    let target = spawn(&[
        "xfer-bench",
        "-d",
        "127.0.4.11",
        "-p",
        "19711",
        "--buffer-size",
        "4194304",
        "--serve",
        "20",
    ]);
    for (op, link) in [
        ("write", "rdma"),
        ("read", "rdma"),
        ("write", "tcp"),
        ("read", "tcp"),
        ("write", "shm"),
        ("read", "shm"),
    ] {
        let (code, out) = monel(&[
            "xfer-bench",
            "127.0.4.11:19711",
            "-d",
            "127.0.4.12",
            "--operation",
            op,
            "--transport",
            link,
            "--block-size",
            "65536",
            "--batch-size",
            "8",
            "--threads",
            "2",
            "--duration",
            "1",
            "--buffer-size",
            "4194304",
        ]);
        assert_eq!(code, 0, "{op} over {link}: {out}");
        assert!(out.contains("every block checked"), "{op}: {out}");
        assert!(
            out.contains(&format!(
                "xfer-bench {op} over {link} block 65536 batch 8 threads 2"
            )),
            "{out}"
        );
    }
    let (code, out) = monel(&[
        "xfer-bench",
        "127.0.4.11:19711",
        "-d",
        "127.0.4.12",
        "--operation",
        "copy",
    ]);
    assert_ne!(code, 0);
    assert!(out.contains("read or write"), "{out}");
    let mut target = target;
    let _ = target.kill();
    let _ = target.wait();
}

/// Runs a raw-UDP baseline (`monel perf TEST -n N` plus `extra`): the server on 127.0.1.4,
/// the client on 127.0.1.5; the client must succeed. Returns the client's and the server's
/// output.
fn udp_baseline(test: &str, port: u16, n: &str, extra: Option<&str>) -> (String, String) {
    let port = port.to_string();
    let mut args = vec!["perf", test, "-d", "127.0.1.4", "-p", &port, "-n", n];
    args.extend(extra);
    let srv = spawn(&args);
    std::thread::sleep(std::time::Duration::from_millis(200));
    args[3] = "127.0.1.5";
    args.push("127.0.1.4");
    let (code, out) = monel(&args);
    assert_eq!(code, 0, "{test} {extra:?}: {out}");
    let (code, sout) = finish(srv);
    assert_eq!(code, 0, "{test} {extra:?} server: {sout}");
    (out, sout)
}

#[test]
fn udp_ping_pong_baselines_run_with_and_without_the_stand_in_ack() {
    for (i, extra) in [None, Some("--with-ack")].into_iter().enumerate() {
        let (out, sout) = udp_baseline("udp-lat", 18840 + i as u16, "300", extra);
        let row = out.lines().last().unwrap_or_default().to_string();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols.get(..2), Some(&["8", "300"][..]), "{extra:?}: {out}");
        // Every request came back; with --with-ack each came with its ACK, read and dropped.
        let acks = if extra.is_some() { 300 } else { 0 };
        assert!(
            sout.contains(&format!(
                "udp-lat server: 300 echoed, {acks} stand-in ACKs dropped"
            )),
            "{extra:?}: {sout}"
        );
    }
}

/// The perf server refuses a client without the shared secret (read from a file, never
/// from the command line), logs it, and goes on serving: the client with the secret that
/// comes next runs the test.
#[test]
fn perf_refuses_a_peer_without_the_secret_and_keeps_serving() {
    let dir = std::env::temp_dir().join(format!("monel-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("secret");
    std::fs::write(&file, "s3cret\n").unwrap();
    let file = file.to_str().unwrap();
    let common = [
        "perf",
        "write-bw",
        "-p",
        "18830",
        "--udp-port",
        "24813",
        "-n",
        "10",
    ];
    let srv = spawn(&[&common[..], &["-d", "127.0.1.6", "--secret-file", file]].concat());
    let (code, out) = monel(&[&common[..], &["-d", "127.0.1.7", "127.0.1.6"]].concat());
    assert_ne!(code, 0);
    assert!(out.contains("requires a shared secret"), "{out}");
    let with = ["-d", "127.0.1.7", "--secret-file", file, "127.0.1.6"];
    let (code, out) = monel(&[&common[..], &with].concat());
    assert_eq!(code, 0, "{out}");
    let (code, sout) = finish(srv);
    assert_eq!(code, 0, "{sout}");
    assert!(sout.contains("dropped a connection"), "{sout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `monel launch -n N -- monel bench OP ARGS...`: its standard output, after checking that
/// every rank succeeded.
fn launch_bench(n: usize, op: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_monel"))
        .args(["launch", "-n", &n.to_string(), "--"])
        .args([env!("CARGO_BIN_EXE_monel"), "bench", op])
        .args(args)
        .env("MONEL_TIMEOUT", "30")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{op}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `monel launch` starts three ranks of `monel bench`, which bootstrap from torchrun's
/// variables, run every size out of place and in place, and check every element.
#[test]
fn launch_runs_a_checked_collective_benchmark() {
    // nccl-tests' and torch's spellings name the same collectives.
    for op in ["all_reduce", "reduce-scatter", "all_to_all"] {
        let text = launch_bench(3, op, &["-b", "8", "-e", "96K", "-f", "16", "-n", "2"]);
        assert!(
            text.contains("# Out of bounds values : 0 OK"),
            "{op}: {text}"
        );
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            4, // 8 B, 128 B, 2 KiB, 32 KiB
            "{op}: {text}"
        );
    }
}

/// A misspelled collective is refused before any rendezvous, naming the nearest one.
#[test]
fn bench_suggests_the_nearest_collective_on_a_typo() {
    let (code, text) = monel(&["bench", "allreduc"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("did you mean all_reduce?"), "{text}");
    let (code, text) = monel(&["bench", "teleport"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("want one of all_reduce"), "{text}");
}

/// `monel bench -T` times each size for a target time: the ranks calibrate on batches of
/// warm calls together (a rank that decided alone would leave the others waiting in a
/// collective it never calls) and every element checks out.
#[test]
fn bench_with_a_target_time_calibrates_on_every_rank_alike() {
    let text = launch_bench(
        3,
        "all_reduce",
        &[
            "-b", "8", "-e", "8K", "-f", "32", "-T", "20", "--format", "csv",
        ],
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 3, "8 B, 256 B, 8 KiB: {text}");
    for r in &rows {
        // size,count,type,redop,root,time,algbw,busbw,#wrong, then in place likewise
        let (oop, ip): (f64, f64) = (r[5].parse().unwrap(), r[9].parse().unwrap());
        assert!(oop > 0.0 && ip > 0.0, "{r:?}");
        assert_eq!((r[8], r[12]), ("0", "0"), "{r:?}");
    }
}

/// A rank that dies takes the job down with a non-zero status, and the survivors say
/// which rank is gone instead of hanging.
#[test]
fn launch_reports_a_failed_rank() {
    let out = Command::new(env!("CARGO_BIN_EXE_monel"))
        .args([
            "launch",
            "-n",
            "2",
            "--",
            env!("CARGO_BIN_EXE_monel"),
            "bench",
            "all_reduce",
            "-d",
            "nosuchtype",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown data type"));
}

/// The main job: three ranks on two simulated hosts, so both shared memory and the soft RNIC
/// carry traffic; every collective verified, the paths printed, the sweep run.
#[test]
fn demo_verifies_every_collective_over_both_paths() {
    let out = Command::new(env!("CARGO_BIN_EXE_monel"))
        .args(["demo", "-n", "3", "--hosts", "2", "--max-bytes", "2048"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("rank 0 -> 1 via SHM"), "{text}");
    assert!(
        text.contains("rank 0 -> 2 via RoCE provider soft"),
        "{text}"
    );
    for op in [
        "all_reduce",
        "broadcast",
        "reduce ",
        "all_gather",
        "reduce_scatter",
        "alltoall",
        "gather",
        "scatter",
        "barrier",
    ] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
    assert!(!text.contains("WRONG"), "{text}");
    assert!(
        text.contains("all results verified on every rank"),
        "{text}"
    );
}

/// Without the soft RNIC, the demo's cross-host pairs fall back to TCP and say why.
#[test]
fn demo_falls_back_to_tcp_when_rdma_is_forbidden() {
    let out = Command::new(env!("CARGO_BIN_EXE_monel"))
        .args(["demo", "-n", "3", "--hosts", "2", "--max-bytes", "64"])
        .env("MONEL_TRANSPORT", "^rdma")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("rank 0 -> 2 via TCP"), "{text}");
    assert!(
        text.contains("not RDMA: the soft RNIC is disabled"),
        "{text}"
    );
}

#[test]
fn fabric_plan_takes_an_algorithm_and_refuses_one_the_collective_lacks() {
    let design = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/fabric/rail-optimized.toml"
    );
    let (code, out) = monel(&[
        "fabric",
        "plan",
        design,
        "--gpus",
        "256",
        "--algorithm",
        "hier",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("RoCE rail-optimized (hier)"), "{out}");
    assert!(
        out.contains("all_reduce hier") && out.contains("lockstep engine"),
        "{out}"
    );
    let (code, out) = monel(&["fabric", "plan", design, "--algorithm", "spiral"]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("--algorithm spiral: all_reduce has auto, ring"),
        "{out}"
    );
}

/// `monel fabric flows`: htsim's connection matrix with its pins, and a CSV flow list with a
/// dependency, each with per-flow CSV and JSON; a bad line is an error naming it.
#[test]
fn fabric_flows_runs_flow_lists_and_names_bad_lines() {
    let data = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../monel-fabric/tests/data/htsim/"
    );
    let design = format!("{data}leafspine32.toml");
    let dir = std::env::temp_dir().join(format!("monel-flows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (csv, json) = (dir.join("out.csv"), dir.join("out.json"));
    let (code, out) = monel(&[
        "fabric",
        "flows",
        &design,
        &format!("{data}incast32_8to1.cm"),
        "--pins",
        &format!("{data}pin_incast_pfc.txt"),
        "--csv",
        csv.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("8 flows on htsim leaf-spine 32 (packet engine"),
        "{out}"
    );
    assert!(out.contains("PFC pauses"), "{out}");
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(rows.lines().count(), 9, "{rows}");
    assert!(rows.starts_with("flow,from,to,bytes,spine,start_us,done_us,fct_us"));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["flows"].as_array().unwrap().len(), 8);
    assert!(j["makespan_us"].as_f64().unwrap() > 2000.0, "{j}");

    let list = dir.join("flows.csv");
    std::fs::write(
        &list,
        "from,to,bytes,start_us,after\n0,5,1MiB,0,\n5,10,1MiB,,0\n",
    )
    .unwrap();
    let (code, out) = monel(&[
        "fabric",
        "flows",
        &design,
        list.to_str().unwrap(),
        "--engine",
        "fluid",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("2 flows") && out.contains("fluid engine"),
        "{out}"
    );
    std::fs::write(&list, "from,to,bytes,start_us\n0,5,1MiB,0\n0,5,lots,0\n").unwrap();
    let (code, out) = monel(&["fabric", "flows", &design, list.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("traffic line 3"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The raw UDP bandwidth baseline runs with contiguous datagrams and with each one gathered
/// from three pieces (`--gather`, the soft RNIC's layout); the receiver counts what arrived.
#[test]
fn udp_bandwidth_baselines_run_contiguous_and_gathered() {
    for (i, extra) in [None, Some("--gather")].into_iter().enumerate() {
        let (out, sout) = udp_baseline("udp-bw", 18850 + i as u16, "200", extra);
        assert_eq!(
            out.contains("(gathered: header, payload, trailer)"),
            extra.is_some(),
            "{extra:?}: {out}"
        );
        // Some bytes arrived and the receiver said how many.
        let pct: f64 = out
            .split('(')
            .next_back()
            .and_then(|s| s.split('%').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{extra:?}: no delivered share in {out}"));
        assert!(pct > 0.0 && pct <= 100.0, "{extra:?}: {out}");
        assert!(sout.contains("udp-bw receiver:"), "{sout}");
    }
}

/// `monel doctor` with `env` set: its exit status and output.
fn doctor(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_monel"))
        .arg("doctor")
        .args(args)
        .env_remove("MONEL_IB_HCA")
        .env_remove("NCCL_IB_HCA")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// On this host (no RDMA in the kernel) the doctor says so and that a job would run over
/// the soft RNIC; over rxe's recorded port files it picks the RoCE v2 IPv4 GID, as NCCL
/// would, or the one MONEL_IB_* settings ask for; a malformed setting fails it, naming the
/// variable; `--json` gives every check its verdict.
#[test]
fn doctor_names_each_verdict_and_the_gid_it_would_pick() {
    let (code, out) = doctor(&[], &[("MASTER_ADDR", "127.0.0.1")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("a job would run here"), "{out}");
    assert!(
        out.contains("soft RNIC") && out.contains("monel_lo"),
        "{out}"
    );
    assert!(
        out.contains("ranks reach the rendezvous at 127.0.0.1:0 from 127.0.0.1 on lo"),
        "{out}"
    );
    let rxe = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/rxe-sysfs");
    let (code, out) = doctor(&["--sysfs", rxe], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "rxe0 port 1 (ACTIVE, LinkUp, Ethernet): GID 1 RoCE v2 10.77.0.2 on eth0, index 1: the first RoCE v2 IPv4 GID"
        ),
        "{out}"
    );
    let (_, out) = doctor(&["--sysfs", rxe], &[("NCCL_IB_ADDR_FAMILY", "AF_INET6")]);
    assert!(
        out.contains("GID 0 RoCE v2 fe80::5054:ff:fe4d:2 on eth0"),
        "{out}"
    );
    assert!(
        out.contains("NCCL_IB_ADDR_FAMILY=AF_INET6 read as MONEL_IB_ADDR_FAMILY"),
        "{out}"
    );
    let (_, out) = doctor(&["--sysfs", rxe], &[("MONEL_IB_GID_INDEX", "5")]);
    assert!(out.contains("rxe0 port 1 has no GID at index 5"), "{out}");
    assert!(out.contains("1: RoCE v2 10.77.0.2"), "{out}");
    let (code, out) = doctor(&["--sysfs", rxe], &[("MONEL_IB_HCA", "rxe0:0")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("MONEL_IB_HCA") && out.contains("a job would not run"),
        "{out}"
    );
    let (_, out) = doctor(&["--sysfs", rxe], &[("MONEL_IB_HCA", "^rxe")]);
    assert!(
        out.contains("rxe0 port 1: left out by MONEL_IB_HCA"),
        "{out}"
    );
    let (code, out) = doctor(&["--sysfs", rxe, "--json"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.trim_start().starts_with('[') && out.contains("\"verdict\": \"ok\""),
        "{out}"
    );
}

/// `monel pingpong --srq` between two processes: 16 QPs sharing one receive queue, every
/// message checked, as `ibv_srq_pingpong` runs (which the VM harness meets both ways).
#[test]
fn srq_pingpong_between_two_processes_checks_data() {
    let common = [
        "pingpong",
        "--srq",
        "-q",
        "8",
        "-p",
        "18816",
        "--udp-port",
        "24816",
        "-n",
        "400",
        "-s",
        "3000",
        "-c",
    ];
    let srv = spawn(&[&common[..], &["-d", "127.0.1.24"]].concat());
    let (code, out) = monel(&[&common[..], &["-d", "127.0.1.25", "127.0.1.24"]].concat());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2400000 bytes in"), "{out}");
    assert!(out.contains("400 iters in"), "{out}");
    let (code, sout) = finish(srv);
    assert_eq!(code, 0, "{sout}");
}

/// `monel doctor --peers` RDMA-pings each peer through the path a job would take: a peer
/// running `monel doctor --serve` answers (ten checked round trips), one that runs nothing
/// fails the doctor, naming the peer and the fix.
#[test]
fn doctor_pings_its_peers_over_rdma() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let server = Command::new(env!("CARGO_BIN_EXE_monel"))
        .args([
            "doctor",
            "--serve",
            "1",
            "-d",
            "127.0.78.2",
            "--port",
            &port,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out) = doctor(
        &[
            "-d",
            "127.0.78.3",
            "--port",
            &port,
            "--peers",
            "127.0.78.2,127.0.78.9",
        ],
        &[],
    );
    let served = server.wait_with_output().unwrap();
    let sout = String::from_utf8_lossy(&served.stdout);
    assert!(
        out.contains("ok    peer           127.0.78.2: 10 RDMA round trips of 4 KiB"),
        "{out}"
    );
    assert!(out.contains("every byte checked"), "{out}");
    assert!(out.contains("FAIL  peer           127.0.78.9:"), "{out}");
    assert!(
        out.contains("fix: run `monel doctor --serve` there"),
        "{out}"
    );
    assert_eq!(
        code, 1,
        "a peer that does not answer fails the doctor: {out}"
    );
    assert!(sout.contains("ping answered: 10 round trips"), "{sout}");
}
