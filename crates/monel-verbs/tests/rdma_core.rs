//! The rdma-core provider on a real kernel RDMA device: every verb the soft RNIC has, through
//! libibverbs, with the same types and results. These need a device, so they are ignored
//! here; `tests/rxe-vm/interop.sh` runs them with `--ignored` in the VM on Linux rxe
//! (`MONEL_TEST_DEV`, default `rxe0`). Two QPs on the one device talk through rxe's loopback.

mod common;

use std::time::Duration;

use common::{T, one, signaled};
use monel_verbs::*;

fn device() -> Device {
    let name = std::env::var("MONEL_TEST_DEV").unwrap_or_else(|_| "rxe0".into());
    let d = Device::by_name(&name).unwrap_or_else(|e| panic!("no device {name}: {e}"));
    assert!(d.is_rdma_core(), "{name} is not an rdma-core device");
    d
}

struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    psn: Psn,
    gid_index: u8,
}

fn side(cap: QpCap, qp_type: QpType) -> Side {
    let dev = device();
    let gid_index = dev.ipv4_gid_index().expect("an IPv4 RoCE v2 GID");
    let ctx = Context::open(&dev, ContextConfig::default()).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    Side {
        ctx,
        pd,
        cq,
        qp,
        psn: random_psn(),
        gid_index,
    }
}

fn remote(s: &Side) -> RemoteQp {
    RemoteQp {
        qpn: s.qp.qp_num(),
        psn: s.psn,
        gid: s.ctx.device().gid(s.gid_index).unwrap().gid,
    }
}

fn params(s: &Side) -> ConnectParams {
    ConnectParams {
        sgid_index: s.gid_index,
        local_psn: s.psn,
        mtu: Mtu::Mtu1024,
        ..ConnectParams::default()
    }
}

fn pair() -> (Side, Side) {
    let a = side(QpCap::default(), QpType::Rc);
    let b = side(QpCap::default(), QpType::Rc);
    a.qp.connect(&remote(&b), &params(&a)).unwrap();
    b.qp.connect(&remote(&a), &params(&b)).unwrap();
    (a, b)
}

const RW: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0,
);

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn device_lists_with_its_gid_table() {
    let d = device();
    let Provider::RdmaCore { port, .. } = d.provider else {
        unreachable!()
    };
    assert_eq!(port, 1);
    let i = d.ipv4_gid_index().unwrap();
    let slots = d.gid_slots();
    assert!(
        slots.iter().any(
            |s| usize::from(s.index) == usize::from(i) && s.kind == monel_peer::GidKind::RoceV2
        ),
        "{slots:?}"
    );
    assert!(d.gid(200).is_err());
    let ctx = Context::open(&d, ContextConfig::default()).unwrap();
    assert_eq!(ctx.local_addr(i).unwrap().port(), 4791);
    assert_eq!(ctx.device().port_attr().state, PortState::Active);
}

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn every_rc_operation_moves_the_right_bytes() {
    let (a, b) = pair();
    let amr = a.pd.reg_mr(vec![0u8; 65536], RW).unwrap();
    let bmr = b.pd.reg_mr(vec![0u8; 65536], RW).unwrap();
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    amr.write(0, &pattern).unwrap();
    let rb = RemoteAddr {
        addr: bmr.addr(),
        rkey: bmr.rkey(),
    };

    // SEND with immediate into a posted receive.
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![bmr.sge(0, 65536)],
    })
    .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::SendImm(0xdead_beef),
        sg_list: vec![amr.sge(0, 10_000)],
        flags: signaled(),
    })
    .unwrap();
    let s = one(&a.cq);
    assert_eq!(
        (s.wr_id, s.status, s.opcode),
        (2, WcStatus::Success, WcOpcode::Send)
    );
    let r = one(&b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode),
        (1, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!((r.byte_len, r.imm), (10_000, Some(0xdead_beef)));
    assert_eq!(r.qp_num, b.qp.qp_num());
    let mut got = vec![0u8; 10_000];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(got, pattern[..10_000]);

    // WRITE of 64 KiB in two SGEs, then WRITE with immediate (consumes a receive).
    a.qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Write(rb),
        sg_list: vec![amr.sge(0, 32768), amr.sge(32768, 32768)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut all = vec![0u8; 65536];
    bmr.read(0, &mut all).unwrap();
    assert_eq!(all, pattern);
    b.qp.post_recv(RecvWr {
        wr_id: 4,
        sg_list: vec![],
    })
    .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 5,
        op: SendOp::WriteImm(rb, 42),
        sg_list: vec![amr.sge(0, 100)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let r = one(&b.cq);
    assert_eq!(
        (r.opcode, r.imm, r.byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(42), 100)
    );

    // READ back from b into a's second half.
    bmr.write(0, &[0x5a; 4096]).unwrap();
    a.qp.post_send(SendWr {
        wr_id: 6,
        op: SendOp::Read(rb),
        sg_list: vec![amr.sge(40000, 4096)],
        flags: signaled(),
    })
    .unwrap();
    let c = one(&a.cq);
    assert_eq!(
        (c.status, c.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut back = vec![0u8; 4096];
    amr.read(40000, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0x5a));

    // Atomics on an 8-byte word of b: fetch-add then compare-swap.
    bmr.write(64, &100u64.to_le_bytes()).unwrap();
    let word = RemoteAddr {
        addr: bmr.addr() + 64,
        rkey: bmr.rkey(),
    };
    a.qp.post_send(SendWr {
        wr_id: 7,
        op: SendOp::FetchAdd {
            remote: word,
            add: 5,
        },
        sg_list: vec![amr.sge(0, 8)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).opcode, WcOpcode::FetchAdd);
    let mut old = [0u8; 8];
    amr.read(0, &mut old).unwrap();
    assert_eq!(u64::from_le_bytes(old), 100);
    a.qp.post_send(SendWr {
        wr_id: 8,
        op: SendOp::CompareSwap {
            remote: word,
            compare: 105,
            swap: 7,
        },
        sg_list: vec![amr.sge(8, 8)],
        flags: signaled(),
    })
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut now = [0u8; 8];
    bmr.read(64, &mut now).unwrap();
    assert_eq!(u64::from_le_bytes(now), 7);

    // Inline SEND: the buffer may be reused at once.
    b.qp.post_recv(RecvWr {
        wr_id: 9,
        sg_list: vec![bmr.sge(0, 64)],
    })
    .unwrap();
    let mut msg = *b"inline bytes";
    a.qp.post_send_inline(10, SendOp::Send, &msg, signaled())
        .unwrap();
    msg.fill(0);
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(one(&b.cq).byte_len, 12);
    let mut m = [0u8; 12];
    bmr.read(0, &mut m).unwrap();
    assert_eq!(&m, b"inline bytes");

    // The state as queried.
    let (st, attr) = a.qp.query().unwrap();
    assert_eq!(st, QpState::Rts);
    assert_eq!(attr.dest_qp_num, b.qp.qp_num());
    assert_eq!(attr.path_mtu, Mtu::Mtu1024);
}

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn completion_channel_sleeps_and_wakes() {
    let (a, b) = pair();
    // Nothing queued: the wait times out.
    let t = std::time::Instant::now();
    assert!(!b.cq.wait(Duration::from_millis(200)));
    assert!(t.elapsed() >= Duration::from_millis(150));
    let amr = a.pd.reg_mr(vec![1u8; 64], RW).unwrap();
    let bmr = b.pd.reg_mr(vec![0u8; 64], RW).unwrap();
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![bmr.sge(0, 64)],
    })
    .unwrap();
    // A send from another thread wakes the sleeping waiter.
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            a.qp.post_send(SendWr {
                wr_id: 2,
                op: SendOp::Send,
                sg_list: vec![amr.sge(0, 64)],
                flags: signaled(),
            })
            .unwrap();
        });
        assert!(b.cq.wait(T), "the channel woke the waiter");
    });
    assert_eq!(b.cq.poll(4).len(), 1);
}

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn a_wrong_rkey_completes_with_a_remote_access_error() {
    let (a, b) = pair();
    let amr = a.pd.reg_mr(vec![0u8; 4096], RW).unwrap();
    let bmr = b.pd.reg_mr(vec![0u8; 4096], RW).unwrap();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write(RemoteAddr {
            addr: bmr.addr(),
            rkey: RKey(bmr.rkey().0 ^ 0x5555_0000),
        }),
        sg_list: vec![amr.sge(0, 4096)],
        flags: signaled(),
    })
    .unwrap();
    let c = one(&a.cq);
    assert_eq!(c.status, WcStatus::RemAccessErr, "{c:?}");
    // Nothing was written, and the QP is in error: later work is flushed.
    let mut got = vec![1u8; 4096];
    bmr.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0));
    assert_eq!(a.qp.query().unwrap().0, QpState::Err);
}

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn a_vanished_peer_exhausts_the_retries() {
    let a = side(QpCap::default(), QpType::Rc);
    let b = side(QpCap::default(), QpType::Rc);
    let gone = remote(&b);
    drop(b);
    let p = ConnectParams {
        timeout: 8, // 1 ms
        retry_cnt: 2,
        ..params(&a)
    };
    a.qp.connect(&gone, &p).unwrap();
    let amr = a.pd.reg_mr(vec![0u8; 64], RW).unwrap();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: vec![amr.sge(0, 64)],
        flags: signaled(),
    })
    .unwrap();
    let c = one(&a.cq);
    assert_eq!(c.status, WcStatus::RetryExcErr, "{c:?}");
}

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn datagrams_arrive_with_a_grh() {
    let cap = QpCap {
        max_inline_data: 0,
        ..QpCap::default()
    };
    let a = side(cap, QpType::Ud);
    let b = side(cap, QpType::Ud);
    let qkey = QKey(0x1111_2222);
    a.qp.ready_ud(qkey, a.psn).unwrap();
    b.qp.ready_ud(qkey, b.psn).unwrap();
    let amr = a.pd.reg_mr(vec![9u8; 1024], RW).unwrap();
    let bmr = b.pd.reg_mr(vec![0u8; 1024 + GRH_LEN], RW).unwrap();
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![bmr.sge(0, 1024 + GRH_LEN)],
    })
    .unwrap();
    let ah =
        a.pd.create_ah(&AhAttr {
            dgid: remote(&b).gid,
            sgid_index: a.gid_index,
            hop_limit: 64,
        })
        .unwrap();
    a.qp.post_send_ud(
        SendWr {
            wr_id: 2,
            op: SendOp::SendImm(77),
            sg_list: vec![amr.sge(0, 1000)],
            flags: signaled(),
        },
        &ah,
        b.qp.qp_num(),
        qkey,
    )
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let r = one(&b.cq);
    assert_eq!(
        (r.status, r.byte_len, r.imm),
        (WcStatus::Success, 1000 + GRH_LEN as u32, Some(77))
    );
    assert!(r.grh);
    assert_eq!(r.src_qp, a.qp.qp_num());
    let mut got = vec![0u8; 1000];
    bmr.read(GRH_LEN, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 9));
}

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn qps_on_one_srq_share_its_receives() {
    let dev = device();
    let gid_index = dev.ipv4_gid_index().unwrap();
    let ctx = Context::open(&dev, ContextConfig::default()).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256).unwrap();
    let srq = pd.create_srq(&SrqAttr::default()).unwrap();
    let mr = pd.reg_mr(vec![0u8; 8192], RW).unwrap();
    for i in 0..4 {
        srq.post_recv(RecvWr {
            wr_id: 100 + i,
            sg_list: vec![mr.sge(i as usize * 1024, 1024)],
        })
        .unwrap();
    }
    let server: Vec<QueuePair> = (0..2)
        .map(|_| {
            pd.create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap {
                    max_recv_wr: 0,
                    max_recv_sge: 0,
                    ..QpCap::default()
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: Some(&srq),
            })
            .unwrap()
        })
        .collect();
    assert!(
        server[0]
            .post_recv(RecvWr {
                wr_id: 0,
                sg_list: vec![]
            })
            .is_err()
    );
    let gid = dev.gid(gid_index).unwrap().gid;
    let psn = random_psn();
    let p = ConnectParams {
        sgid_index: gid_index,
        local_psn: psn,
        ..ConnectParams::default()
    };
    let clients: Vec<Side> = (0..2).map(|_| side(QpCap::default(), QpType::Rc)).collect();
    for (s, c) in server.iter().zip(&clients) {
        s.connect(&remote(c), &p).unwrap();
        c.qp.connect(
            &RemoteQp {
                qpn: s.qp_num(),
                psn,
                gid,
            },
            &params(c),
        )
        .unwrap();
    }
    for (i, c) in clients.iter().enumerate() {
        let m = c.pd.reg_mr(vec![i as u8 + 1; 512], RW).unwrap();
        c.qp.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: vec![m.sge(0, 512)],
            flags: signaled(),
        })
        .unwrap();
        assert_eq!(one(&c.cq).status, WcStatus::Success);
    }
    let got = cq.poll_n(2, T);
    assert_eq!(got.len(), 2);
    let mut qpns: Vec<Qpn> = got.iter().map(|w| w.qp_num).collect();
    qpns.sort_by_key(|q| q.value());
    let mut want: Vec<Qpn> = server.iter().map(QueuePair::qp_num).collect();
    want.sort_by_key(|q| q.value());
    assert_eq!(qpns, want, "each server QP drew one receive from the SRQ");
    assert!(got.iter().all(|w| w.wr_id >= 100 && w.byte_len == 512));
    srq.set_limit(1).unwrap();
    assert_eq!(srq.query().unwrap().0.srq_limit, 1);
}

/// Drops CAP_IPC_LOCK (which lifts the limit) from this thread's effective and permitted
/// sets: capabilities are per thread, so the other tests keep theirs.
#[allow(unsafe_code)]
fn drop_ipc_lock() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const IPC_LOCK: u32 = 1 << 14;
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget/capset with a version-3 header and room for its two data words.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()), 0);
        d[0].effective &= !IPC_LOCK;
        d[0].permitted &= !IPC_LOCK;
        assert_eq!(libc::syscall(libc::SYS_capset, &h, d.as_ptr()), 0);
    }
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(eff & u64::from(IPC_LOCK), 0, "CAP_IPC_LOCK still effective");
}

#[test]
#[ignore = "needs a kernel RDMA device: run in the rxe VM (tests/rxe-vm/interop.sh)"]
fn registering_beyond_the_locked_memory_limit_names_the_limit() {
    drop_ipc_lock();
    let limit = 1u64 << 20;
    // SAFETY: setrlimit with a valid struct, lowering this process's own limit.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::setrlimit(
            libc::RLIMIT_MEMLOCK,
            &libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            },
        )
    };
    assert_eq!(rc, 0);
    let dev = device();
    let ctx = Context::open(&dev, ContextConfig::default()).unwrap();
    let pd = ctx.alloc_pd();
    let small = pd.reg_mr(vec![0u8; 64 << 10], RW);
    assert!(small.is_ok(), "{small:?}");
    let e = pd.reg_mr(vec![0u8; 8 << 20], RW).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("locked-memory limit is 1048576 bytes"),
        "{text}"
    );
    assert!(text.contains("ulimit -l"), "{text}");
}
