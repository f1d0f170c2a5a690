//! The RDMA link: [`RDMA_LANES`] RC queue pairs per peer over Monel's verbs (the soft RNIC,
//! or a kernel RDMA device through rdma-core), each set up by Monel's connection manager
//! (both sides prove the job secret; the queue pair's packets are then protected with keys
//! from it). The agents' messages go as SENDs on the first queue pair, among them the token
//! the initiator's further queue pairs present so the target joins them to the first.
//! READs and WRITEs go straight between registered segments, spread over the queue pairs.
//! One thread drives every peer's completions ([`progress_loop`]).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use monel_verbs::cm::{self, CmConfig};
use monel_verbs::{
    AccessFlags, ConnectParams, MemoryRegion, Mtu, QpCap, QpInitAttr, QpType, QueuePair, RKey,
    RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
};

use super::{
    AgentConfig, Link, MSG_MAX, Peer, Shared, State, WR_SLICE, apply, dial, end_slice, io,
    next_peer, pump, push_peer, send_msg, verbs, wait,
};
use crate::batch::Batch;
use crate::error::{Result, XferError};
use crate::wire::Msg;

/// Receive slots per peer for its messages, and send slots for ours.
pub(super) const RX_SLOTS: usize = 16;
pub(super) const TX_SLOTS: usize = 16;
/// Work requests each peer's queue pairs hold together.
pub(super) const SQ_DEPTH: u32 = 256;
/// Queue pairs per RDMA peer (lanes): slices spread over them (over several ports or paths
/// where the fabric has them). The first carries the agents' messages too.
pub const RDMA_LANES: usize = 2;
/// Slices in flight on each lane: the peer's [`SQ_DEPTH`] shared among them, so the one
/// completion queue's bound on peers holds.
const LANE_DEPTH: u32 = SQ_DEPTH / RDMA_LANES as u32;
/// `wr_id` kinds of the messages' sends and receives (slices' are [`WR_SLICE`]).
const WR_MSG_TX: u64 = 2 << 56;
const WR_MSG_RX: u64 = 3 << 56;

/// The client's side: connects a first queue pair to the agent at `addr` and takes it in
/// as a new peer; returns the peer's index.
pub(super) fn connect(s: &Arc<Shared>, addr: SocketAddr) -> Result<usize> {
    let qp = new_qp(s)?;
    let mut stream = dial(addr, s.cfg.timeout)?;
    stream.write_all(crate::stream::OPEN_RDMA).map_err(io)?;
    cm::connect_stream(stream, &qp, None, &cm_config(&s.cfg)).map_err(verbs)?;
    add_rdma_peer(s, qp)
}

/// The client's side, once peer `i` (`name`) introduced itself: sends it a token on the
/// first queue pair and opens the further ones presenting it. A lane that cannot be added
/// is logged, and the peer goes on with those it has.
pub(super) fn add_lanes(s: &Arc<Shared>, i: usize, addr: SocketAddr, name: &str) -> Result<()> {
    let token = monel_peer::auth::nonce();
    {
        let mut st = s.state();
        let p = &mut st.peers[i];
        send_msg(p, i, &Msg::Lanes(token))?;
        if let Link::Rdma { token: t, .. } = &mut p.link {
            *t = Some(token);
        }
    }
    for lane in 1..RDMA_LANES {
        let added = new_qp(s).and_then(|qp| {
            let mut stream = dial(addr, s.cfg.timeout)?;
            stream
                .write_all(crate::stream::OPEN_RDMA_LANE)
                .and_then(|()| stream.write_all(&token))
                .map_err(io)?;
            cm::connect_stream(stream, &qp, None, &cm_config(&s.cfg)).map_err(verbs)?;
            join_lane(s, i, qp)
        });
        if let Err(e) = added {
            tracing::info!(target: "monel::xfer", "{}: RDMA lane {lane} to {name}: {e}", s.name);
            break;
        }
    }
    Ok(())
}

/// The server's side of an `MXFRRDMA` connection: a new peer.
pub(super) fn accept(s: &Arc<Shared>, c: TcpStream) -> Result<usize> {
    let qp = new_qp(s)?;
    cm::accept_stream(c, &qp, None, &cm_config(&s.cfg)).map_err(verbs)?;
    add_rdma_peer(s, qp)
}

/// The server's side of an `MXFRRDML` connection: a further queue pair of the peer whose
/// first sent the token it presents (waited for, up to the agent's timeout: the token may
/// still be on its way).
pub(super) fn accept_lane(s: &Arc<Shared>, mut c: TcpStream) -> Result<usize> {
    c.set_read_timeout(Some(s.cfg.timeout)).map_err(io)?;
    let mut token = [0u8; 16];
    std::io::Read::read_exact(&mut c, &mut token).map_err(io)?;
    let qp = new_qp(s)?;
    cm::accept_stream(c, &qp, None, &cm_config(&s.cfg)).map_err(verbs)?;
    let deadline = Instant::now() + s.cfg.timeout;
    let mut st = s.state();
    let i = loop {
        let found = st.peers.iter().position(|p| {
            p.lost.is_none() && matches!(&p.link, Link::Rdma { token: Some(t), .. } if *t == token)
        });
        if let Some(i) = found {
            break i;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(XferError::BadMessage("an RDMA lane for no peer".into()));
        }
        st = wait(s, st, left);
    };
    drop(st);
    join_lane(s, i, qp)?;
    Ok(i)
}

/// Posts what `batch` (number `id`) has waiting on each lane, as far as the lane's send
/// queue allows.
pub(super) fn post_slices(qps: &mut [(QueuePair, u32)], batch: &mut Batch, id: u32, lost: bool) {
    if lost {
        return;
    }
    for (lane, (qp, n)) in qps.iter_mut().enumerate() {
        while *n < LANE_DEPTH {
            let Some(sl) = batch.take(lane) else { break };
            let tag = WR_SLICE | u64::from(id) << 32 | (lane as u64) << 24 | sl.id as u64;
            match post_slice(qp, tag, &sl) {
                Ok(()) => *n += 1,
                Err(err) => batch.complete(sl.id, Err(err)),
            }
        }
    }
}

/// Sends message `bytes` to peer `i` from send slot `slot` of `tx`, on its first queue pair.
pub(super) fn send(
    qp: &QueuePair,
    tx: &MemoryRegion,
    i: usize,
    slot: usize,
    bytes: &[u8],
) -> Result<()> {
    tx.write(slot * MSG_MAX, bytes).map_err(verbs)?;
    qp.post_send(SendWr {
        wr_id: WR_MSG_TX | (i as u64) << 16 | slot as u64,
        op: SendOp::Send,
        sg_list: vec![tx.sge(slot * MSG_MAX, bytes.len())],
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    })
    .map_err(verbs)
}

fn cm_config(cfg: &AgentConfig) -> CmConfig {
    CmConfig {
        secret: cfg.secret.clone(),
        mtu: Mtu::Mtu4096,
        // RoCE v2 over IPv4 where the port has it (a kernel device's GID 0 is RoCE v1).
        gid_index: cfg.device.ipv4_gid_index().unwrap_or(0),
        timeout: cfg.timeout,
        params: ConnectParams {
            // A peer that is gone ends in about a second, not never.
            retry_cnt: 5,
            ..ConnectParams::default()
        },
        auth: cfg.auth,
    }
}

fn new_qp(s: &Shared) -> Result<QueuePair> {
    s.pd.create_qp(&QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        cap: QpCap {
            max_send_wr: SQ_DEPTH + TX_SLOTS as u32,
            max_recv_wr: RX_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })
    .map_err(verbs)
}

/// Takes a connected queue pair in as a peer: posts its receives, introduces this agent and
/// publishes its segments.
fn add_rdma_peer(s: &Shared, qp: QueuePair) -> Result<usize> {
    let rx =
        s.pd.reg_mr(vec![0u8; RX_SLOTS * MSG_MAX], AccessFlags::LOCAL_WRITE)
            .map_err(verbs)?;
    let tx =
        s.pd.reg_mr(vec![0u8; TX_SLOTS * MSG_MAX], AccessFlags::LOCAL_WRITE)
            .map_err(verbs)?;
    let mut st = s.state();
    let i = next_peer(&st)?;
    for slot in 0..RX_SLOTS {
        qp.post_recv(RecvWr {
            wr_id: WR_MSG_RX | (i as u64) << 16 | slot as u64,
            sg_list: vec![rx.sge(slot * MSG_MAX, MSG_MAX)],
        })
        .map_err(verbs)?;
    }
    let link = Link::Rdma {
        qps: vec![(qp, 0)],
        rx,
        tx,
        tx_free: (0..TX_SLOTS).collect(),
        token: None,
    };
    push_peer(s, &mut st, link)
}

/// Adds `qp` (connected) as the next lane of RDMA peer `i`.
fn join_lane(s: &Shared, i: usize, qp: QueuePair) -> Result<()> {
    let mut st = s.state();
    match &mut st.peers[i].link {
        Link::Rdma { qps, .. } if qps.len() < RDMA_LANES => qps.push((qp, 0)),
        _ => {
            return Err(XferError::BadMessage(format!(
                "a lane of a peer that has {RDMA_LANES}, or is not on RDMA"
            )));
        }
    }
    pump(&mut st);
    drop(st);
    s.changed.notify_all();
    Ok(())
}

/// Posts one slice as an RDMA WRITE or READ on `qp`.
fn post_slice(qp: &QueuePair, tag: u64, sl: &crate::batch::Slice) -> Result<()> {
    let remote = RemoteAddr {
        addr: sl.remote_addr,
        rkey: RKey(sl.remote_key),
    };
    let op = match sl.op {
        crate::batch::Op::Write => SendOp::Write(remote),
        crate::batch::Op::Read => SendOp::Read(remote),
    };
    qp.post_send(SendWr {
        wr_id: tag,
        op,
        sg_list: vec![monel_verbs::Sge {
            addr: sl.local_addr,
            length: sl.len,
            lkey: monel_verbs::LKey(sl.local_key),
        }],
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    })
    .map_err(verbs)
}

pub(super) fn progress_loop(s: &Arc<Shared>) {
    let mut wcs = Vec::new();
    while !s.stop.load(Ordering::Acquire) {
        wcs.clear();
        if s.cq.poll_into(64, &mut wcs) == 0 {
            s.cq.wait(Duration::from_millis(20));
            continue;
        }
        let mut st = s.state();
        for wc in &wcs {
            handle(&mut st, wc);
        }
        pump(&mut st);
        drop(st);
        s.changed.notify_all();
    }
}

fn handle(st: &mut State, wc: &monel_verbs::WorkCompletion) {
    let kind = wc.wr_id & (0xff << 56);
    let ok = wc.status == WcStatus::Success;
    match kind {
        WR_SLICE => {
            let id = ((wc.wr_id >> 32) & 0x00ff_ffff) as u32;
            let Some(i) = st.batches.get(&id).map(|e| e.peer) else {
                return;
            };
            let p = &mut st.peers[i];
            if let Link::Rdma { qps, .. } = &mut p.link {
                if let Some((_, n)) = qps.get_mut(((wc.wr_id >> 24) & 0xff) as usize) {
                    *n = n.saturating_sub(1);
                }
            }
            let result = if ok { Ok(()) } else { Err(lost(p, wc.status)) };
            end_slice(st, i, wc.wr_id, result);
        }
        WR_MSG_TX => {
            let (i, slot) = (
                ((wc.wr_id >> 16) & 0xffff) as usize,
                (wc.wr_id & 0xffff) as usize,
            );
            if let Some(p) = st.peers.get_mut(i) {
                if let Link::Rdma { tx_free, .. } = &mut p.link {
                    tx_free.push(slot);
                }
                if !ok {
                    lost(p, wc.status);
                }
            }
        }
        WR_MSG_RX => {
            let (i, slot) = (
                ((wc.wr_id >> 16) & 0xffff) as usize,
                (wc.wr_id & 0xffff) as usize,
            );
            if i >= st.peers.len() {
                return;
            }
            if !ok || wc.opcode != WcOpcode::Recv {
                lost(&mut st.peers[i], wc.status);
                return;
            }
            let Link::Rdma { rx, .. } = &st.peers[i].link else {
                return;
            };
            let len = (wc.byte_len as usize).min(MSG_MAX);
            let mut bytes = vec![0u8; len];
            let _ = rx.read(slot * MSG_MAX, &mut bytes);
            let taken = Msg::decode(&bytes).and_then(|m| apply(st, i, m));
            let p = &mut st.peers[i];
            if let Err(e) = taken {
                // A peer that breaks the protocol is cut off; the others go on.
                p.lost = Some(e);
                return;
            }
            if let Link::Rdma { qps, rx, .. } = &p.link {
                let _ = qps[0].0.post_recv(RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: vec![rx.sge(slot * MSG_MAX, MSG_MAX)],
                });
            }
        }
        _ => {}
    }
}

fn lost(p: &mut Peer, status: WcStatus) -> XferError {
    let e = XferError::PeerLost(format!(
        "{}: {status:?}",
        p.name.as_deref().unwrap_or("a peer")
    ));
    p.lost.get_or_insert(e).clone()
}
