//! A soft device's GID table follows its interface's addresses while the device is open, as
//! rxe's follows netdev events: a device on an interface with no address and no carrier
//! opens, gains a GID when an address appears and carries RC traffic on it; an address that
//! goes leaves its entry zero (the other entries keep their index, and a QP naming the
//! cleared index is refused); the next address takes that index again.
//!
//! The test makes a network namespace of its own (on its thread, so only its sockets and the
//! `ip` commands it runs are in it), which needs root: the default run leaves it out, and
//! `tests/netns/gids.sh` runs it.

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use monel_verbs::*;

const T: Duration = Duration::from_secs(10);

fn ip(args: &str) {
    let st = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .unwrap_or_else(|e| panic!("ip {args}: {e}"));
    assert!(st.success(), "ip {args}: {st}");
}

/// The index holding `addr`, waiting up to `T` for the table to show it.
fn index_of(ctx: &Context, addr: IpAddr) -> u8 {
    let t0 = Instant::now();
    loop {
        let n = ctx.query_port().gid_tbl_len;
        let found = (0..n).map(|i| i as u8).find(|&i| {
            ctx.query_gid(i)
                .is_ok_and(|g| g.gid != Gid::default() && g.gid.to_ip() == addr)
        });
        if let Some(i) = found {
            return i;
        }
        assert!(t0.elapsed() < T, "{addr} never appeared in the GID table");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_cleared(ctx: &Context, index: u8) {
    let t0 = Instant::now();
    while ctx.query_gid(index).is_ok_and(|g| g.gid != Gid::default()) {
        assert!(t0.elapsed() < T, "GID {index} never cleared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct End {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

fn end(dev: &Device) -> End {
    let ctx = Context::open(dev, ContextConfig::default()).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64).unwrap();
    End { ctx, pd, cq }
}

fn qp(e: &End) -> QueuePair {
    e.pd.create_qp(&QpInitAttr {
        send_cq: &e.cq,
        recv_cq: &e.cq,
        cap: QpCap::default(),
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })
    .unwrap()
}

/// Connects a fresh QP on `a` (source GID `sgid`) with one on `b` (GID 0).
fn connect(a: &End, sgid: u8, b: &End) -> Result<(QueuePair, QueuePair)> {
    let (x, y) = (qp(a), qp(b));
    let (px, py) = (random_psn(), random_psn());
    x.connect(
        &RemoteQp {
            qpn: y.qp_num(),
            psn: py,
            gid: b.ctx.query_gid(0)?.gid,
        },
        &ConnectParams {
            sgid_index: sgid,
            local_psn: px,
            ..ConnectParams::default()
        },
    )?;
    y.connect(
        &RemoteQp {
            qpn: x.qp_num(),
            psn: px,
            gid: a.ctx.query_gid(sgid)?.gid,
        },
        &ConnectParams {
            local_psn: py,
            ..ConnectParams::default()
        },
    )?;
    Ok((x, y))
}

/// 64 KiB each way over a connected pair, checked.
fn exchange(a: &End, x: &QueuePair, b: &End, y: &QueuePair) {
    let data: Vec<u8> = (0..65_536u32).map(|i| (i * 7 + 3) as u8).collect();
    for (from, q, to, r) in [(a, x, b, y), (b, y, a, x)] {
        let rx = to
            .pd
            .reg_mr(vec![0; data.len()], AccessFlags::LOCAL_WRITE)
            .unwrap();
        r.post_recv(RecvWr {
            wr_id: 2,
            sg_list: vec![rx.sge(0, data.len())],
        })
        .unwrap();
        let tx = from
            .pd
            .reg_mr(data.clone(), AccessFlags::LOCAL_WRITE)
            .unwrap();
        q.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: vec![tx.sge(0, data.len())],
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        })
        .unwrap();
        for cq in [&from.cq, &to.cq] {
            let wc = cq.poll_n(1, T);
            assert_eq!(
                wc.len(),
                1,
                "no completion within {T:?}: {:?} / {:?}",
                from.ctx.counters(),
                to.ctx.counters()
            );
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
        }
        let mut got = vec![0; data.len()];
        rx.read(0, &mut got).unwrap();
        assert!(got == data, "the data arrived changed");
    }
}

fn follows() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .expect("unshare(CLONE_NEWNET): this test needs root (tests/netns/gids.sh)");
    // Packets between two addresses of one namespace go through its loopback.
    ip("link set lo up");
    ip("link add gta type veth peer name gtb");
    ip("addr add 10.78.0.2/24 dev gtb");

    // An interface with no address and no carrier: the device opens with an empty table.
    let dev = Device::by_name("gta").unwrap();
    assert!(dev.gids.is_empty(), "{dev:?}");
    let a = end(&dev);
    assert_eq!(a.ctx.query_port().state, PortState::Down);
    assert!(a.ctx.query_gid(0).is_err());

    ip("addr add 10.78.0.1/24 dev gta");
    ip("link set gta up");
    ip("link set gtb up");
    let i = index_of(&a.ctx, "10.78.0.1".parse().unwrap());
    assert_eq!(a.ctx.query_port().state, PortState::Active);
    let b = end(&Device::bind("10.78.0.2".parse().unwrap()).unwrap());
    let (x, y) = connect(&a, i, &b).unwrap();
    exchange(&a, &x, &b, &y);

    // A second address (on another subnet: deleting a primary address deletes its
    // secondaries): a second entry, the first one where it was.
    ip("addr add 10.79.0.11/24 dev gta");
    let j = index_of(&a.ctx, "10.79.0.11".parse().unwrap());
    assert_ne!(i, j);
    assert_eq!(index_of(&a.ctx, "10.78.0.1".parse().unwrap()), i);

    // The first address goes: its entry is zero, the second keeps its index, a QP cannot
    // name the cleared one, and one on the second address works.
    ip("addr del 10.78.0.1/24 dev gta");
    wait_cleared(&a.ctx, i);
    assert_eq!(index_of(&a.ctx, "10.79.0.11".parse().unwrap()), j);
    let e = connect(&a, i, &b).unwrap_err();
    assert!(e.to_string().contains("not in the GID table"), "{e}");
    let (x2, y2) = connect(&a, j, &b).unwrap();
    exchange(&a, &x2, &b, &y2);

    // A new address takes the cleared index.
    ip("addr add 10.80.0.21/24 dev gta");
    assert_eq!(index_of(&a.ctx, "10.80.0.21".parse().unwrap()), i);
    let (x3, y3) = connect(&a, i, &b).unwrap();
    exchange(&a, &x3, &b, &y3);
}

#[test]
#[ignore = "needs root for a network namespace of its own: tests/netns/gids.sh runs it"]
fn the_gid_table_follows_the_interface() {
    // On a thread of its own: the namespace is this thread's, and the device's progress
    // thread, started from it, inherits it.
    std::thread::spawn(follows).join().unwrap();
}
