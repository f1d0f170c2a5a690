//! Agents of a job finding each other by name through a real etcd server (Debian's
//! etcd-server, started here on loopback): connect by name, one name per job, jobs apart, a
//! name gone with its agent, a dead agent's name gone with its lease, and an agent found by
//! a name that is not its own refused.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use monel_verbs::Device;
use monel_xfer::{Agent, AgentConfig, Registry, XferError};

const SECRET: &[u8] = b"job secret for the registry tests";

/// An etcd server on loopback, in a data directory of its own; killed on drop.
struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
    endpoint: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Two free ports below the kernel's ephemeral range: a port the kernel hands out (bind to
/// 0) can be taken as the source port of a connection made before etcd binds it.
fn free_ports() -> (u16, u16) {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
        .max(10_002);
    let span = u32::from(low - 10_000);
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    let mut held = Vec::new();
    for k in 0..span {
        let port = 10_000 + ((seed.wrapping_add(k.wrapping_mul(7919))) % span) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
            if held.len() == 2 {
                break;
            }
        }
    }
    assert_eq!(held.len(), 2, "no two free ports between 10000 and {low}");
    let port = |i: usize| held[i].local_addr().unwrap().port();
    (port(0), port(1))
}

fn etcd() -> Etcd {
    let (client, peer) = free_ports();
    let dir = std::env::temp_dir().join(format!("monel-etcd-{}-{client}", std::process::id()));
    let endpoint = format!("http://127.0.0.1:{client}");
    let child = Command::new("etcd")
        .args([
            "--name",
            "t",
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-cluster",
            &format!("t=http://127.0.0.1:{peer}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd: install Debian's etcd-server (scripts/test.sh does)");
    let e = Etcd {
        child,
        dir,
        endpoint,
    };
    let probe = Registry::new(&e.endpoint, "probe");
    let t0 = Instant::now();
    while probe.lookup("nobody").is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "etcd did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    e
}

fn agent(name: &str, ip: &str, reg: Option<Registry>) -> monel_xfer::Result<Agent> {
    let dev = Device::bind(ip.parse().unwrap()).unwrap();
    let listen: SocketAddr = format!("{ip}:0").parse().unwrap();
    let mut cfg = AgentConfig::new(name, dev, listen, Some(SECRET.to_vec()));
    cfg.udp_port = 0;
    cfg.registry = reg;
    Agent::new(cfg)
}

#[test]
fn agents_of_a_job_find_each_other_by_name() {
    let e = etcd();
    let job = |j: &str| Some(Registry::new(&e.endpoint, j));
    let decode = agent("decode-r", "127.0.3.50", job("job-1")).unwrap();
    decode.register("kv", 1 << 16).unwrap();
    let prefill = agent("prefill-r", "127.0.3.51", job("job-1")).unwrap();
    assert_eq!(prefill.connect_name("decode-r").unwrap(), "decode-r");
    assert_eq!(prefill.remote_segments("decode-r").unwrap()[0].name, "kv");
    let mut names = prefill.registered().unwrap();
    names.sort();
    assert_eq!(names, ["decode-r", "prefill-r"]);
    // One name per job; another job's agents are apart.
    match agent("decode-r", "127.0.3.52", job("job-1")) {
        Err(XferError::Duplicate(_)) => {}
        other => panic!("a second decode-r: {:?}", other.map(|a| a.address())),
    }
    let stranger = agent("decode-r", "127.0.3.53", job("job-2")).unwrap();
    assert_eq!(stranger.registered().unwrap(), ["decode-r"]);
    match stranger.connect_name("prefill-r") {
        Err(XferError::UnknownPeer(n)) => assert_eq!(n, "prefill-r"),
        other => panic!("{other:?}"),
    }
    // An agent that goes takes its name with it.
    drop(decode);
    match prefill.connect_name("decode-r") {
        Err(XferError::UnknownPeer(_)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(prefill.registered().unwrap(), ["prefill-r"]);
}

#[test]
fn a_dead_agents_name_goes_with_its_lease_and_an_impostor_is_refused() {
    let e = etcd();
    let mut r = Registry::new(&e.endpoint, "job-3");
    r.ttl = Duration::from_secs(2);
    let real = agent("real", "127.0.3.54", Some(r.clone())).unwrap();
    // A registration whose agent died: nobody renews its lease.
    let lease = r.grant().unwrap();
    r.claim("ghost", "127.0.3.55:9".parse().unwrap(), lease)
        .unwrap();
    // And one that names the real agent's address under another name.
    let lease2 = r.grant().unwrap();
    r.claim("impostor", real.address(), lease2).unwrap();
    let me = agent("me", "127.0.3.56", Some(r.clone())).unwrap();
    match me.connect_name("impostor") {
        Err(XferError::BadMessage(m)) => assert!(m.contains("says it is \"real\""), "{m}"),
        other => panic!("{other:?}"),
    }
    let t0 = Instant::now();
    while r.lookup("ghost").unwrap().is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the dead agent's lease never ran out"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The live agents' leases are kept alive all the while.
    assert!(r.lookup("real").unwrap().is_some());
    assert!(r.lookup("me").unwrap().is_some());
}
