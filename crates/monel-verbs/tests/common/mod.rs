//! Two soft devices on loopback addresses, connected RC QPs.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use monel_verbs::*;

pub const T: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Side {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub psn: Psn,
}

pub fn open(ip: &str, port: u16) -> (Context, ProtectionDomain, CompletionQueue) {
    let dev = Device::bind(ip.parse().unwrap()).unwrap();
    let cfg = ContextConfig {
        udp_port: port,
        ..ContextConfig::default()
    };
    let ctx = Context::open(&dev, cfg).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096).unwrap();
    (ctx, pd, cq)
}

/// An RC QP with default capacities whose sends and receives complete on `cq`.
pub fn rc_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> QueuePair {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap::default(),
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })
    .unwrap()
}

/// A side with its own context configuration and QP capacities.
pub fn side_with(ip: &str, cfg: ContextConfig, cap: QpCap) -> Side {
    let dev = Device::bind(ip.parse().unwrap()).unwrap();
    let ctx = Context::open(&dev, cfg).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
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
    }
}

pub fn side(ip: &str, port: u16) -> Side {
    let (ctx, pd, cq) = open(ip, port);
    let qp = rc_qp(&pd, &cq);
    Side {
        ctx,
        pd,
        cq,
        qp,
        psn: random_psn(),
    }
}

pub fn remote(s: &Side) -> RemoteQp {
    RemoteQp {
        qpn: s.qp.qp_num(),
        psn: s.psn,
        gid: s.ctx.device().gid(0).unwrap().gid,
    }
}

pub fn connect(a: &Side, b: &Side, mtu: Mtu) {
    let p = |s: &Side| ConnectParams {
        local_psn: s.psn,
        mtu,
        ..ConnectParams::default()
    };
    a.qp.connect(&remote(b), &p(a)).unwrap();
    b.qp.connect(&remote(a), &p(b)).unwrap();
}

/// Two connected sides on 127.0.0.<x> and 127.0.0.<x+1>, UDP `port`.
pub fn pair(x: u8, port: u16, mtu: Mtu) -> (Side, Side) {
    let a = side(&format!("127.0.0.{x}"), port);
    let b = side(&format!("127.0.0.{}", x + 1), port);
    connect(&a, &b, mtu);
    (a, b)
}

pub fn signaled() -> SendFlags {
    SendFlags {
        signaled: true,
        ..SendFlags::default()
    }
}

pub fn one(cq: &CompletionQueue) -> WorkCompletion {
    let v = cq.poll_n(1, T);
    assert_eq!(v.len(), 1, "no completion within {T:?}");
    v[0]
}
