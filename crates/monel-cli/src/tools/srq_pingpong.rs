//! `ibv_srq_pingpong`, wire- and exchange-compatible with rdma-core's: several RC QPs whose
//! receives all come from one shared receive queue. The exchange sends one 52-byte record
//! per QP slot, always 256 of them (rdma-core's `MAX_QP`; the slots beyond the QPs in use
//! are zero), then `"done\0"`; the QP attributes and the traffic pattern are rdma-core's
//! (the client starts a SEND on every QP; each side sends again on a QP once its last SEND
//! there completed and a message from it arrived; `iters` counts messages over all QPs).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use monel_verbs::{
    AccessFlags, ConnectParams, Context, ErrorKind, QpCap, QpInitAttr, QpType, QueuePair, RecvWr,
    RemoteQp, Result, SendFlags, SendOp, SendWr, SrqAttr, VerbsError, WcStatus, random_psn,
};

use super::pingpong::{
    DONE, Dest, MSG_LEN, Options, Report, Role, dial, io, read_exact_once, serve_first,
};

/// Records each side sends, whatever number of QPs it uses (rdma-core's `MAX_QP`).
pub(crate) const MAX_QP: usize = 256;

const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;

/// The exchange: a record per QP, then zero records up to [`MAX_QP`].
fn encode(mine: &[Dest]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_QP * MSG_LEN);
    for d in mine {
        out.extend(d.encode());
    }
    let zero = b"0000:000000:000000:00000000000000000000000000000000\0";
    while out.len() < MAX_QP * MSG_LEN {
        out.extend(zero);
    }
    out
}

/// The peer's first `n` records (the rest are its unused slots).
fn decode(m: &[u8], n: usize) -> Result<Vec<Dest>> {
    m.chunks_exact(MSG_LEN).take(n).map(Dest::parse).collect()
}

/// Runs one srq_pingpong side on `ctx` with `num_qp` QPs.
pub(crate) fn run(ctx: &Context, role: &Role, o: &Options, num_qp: usize) -> Result<Report> {
    const V: &str = "srq_pingpong";
    if num_qp == 0 || num_qp > MAX_QP || num_qp as u32 > o.rx_depth {
        return Err(VerbsError::invalid(
            V,
            format!(
                "{num_qp} QPs: want 1..={MAX_QP}, and at most rx_depth ({}) so each has a receive",
                o.rx_depth
            ),
        ));
    }
    if o.size == 0 || o.iters == 0 {
        return Err(VerbsError::invalid(V, "size and iters must be positive"));
    }
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(o.rx_depth as usize + num_qp)?;
    // rdma-core sends its zeroed buffer. Each posted receive gets a slot of its own, filled
    // with 0xff, so a check (-c) sees every byte of every message rewritten.
    let tx = pd.reg_mr(vec![0; o.size], AccessFlags::LOCAL_WRITE)?;
    let depth = o.rx_depth as usize;
    let rx = pd.reg_mr(vec![0xff; depth * o.size], AccessFlags::LOCAL_WRITE)?;
    let free = std::cell::RefCell::new((0..depth).rev().collect::<Vec<usize>>());
    let srq = pd.create_srq(&SrqAttr {
        max_wr: o.rx_depth,
        max_sge: 1,
        srq_limit: 0,
    })?;
    let qps: Vec<QueuePair> = (0..num_qp)
        .map(|_| {
            pd.create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: 0,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: Some(&srq),
            })
        })
        .collect::<Result<_>>()?;
    for qp in &qps {
        qp.init(AccessFlags::NONE)?;
    }
    // A receive's work request id: RECV_ID in the low bits, its slot above them.
    let post_recv = |n: u32| -> Result<u32> {
        for _ in 0..n {
            let slot = free.borrow_mut().pop().expect("a slot per receive posted");
            srq.post_recv(RecvWr {
                wr_id: RECV_ID | (slot as u64) << 2,
                sg_list: vec![rx.sge(slot * o.size, o.size)],
            })?;
        }
        Ok(n)
    };
    let mut routs = post_recv(o.rx_depth)?;
    let gid = ctx.query_gid(o.gid_index)?.gid;
    let mine: Vec<Dest> = qps
        .iter()
        .map(|qp| Dest {
            lid: 0,
            qpn: qp.qp_num(),
            psn: random_psn(),
            gid,
        })
        .collect();
    let connect = |peers: &[Dest]| -> Result<()> {
        for ((qp, me), peer) in qps.iter().zip(&mine).zip(peers) {
            qp.connect(
                &RemoteQp {
                    qpn: peer.qpn,
                    psn: peer.psn,
                    gid: peer.gid,
                },
                &ConnectParams {
                    sgid_index: o.gid_index,
                    local_psn: me.psn,
                    mtu: o.mtu,
                    access: AccessFlags::NONE,
                    rd_atomic: 1,
                    hop_limit: 1,
                    ..ConnectParams::default()
                },
            )?;
        }
        Ok(())
    };
    let is_client = match role {
        Role::Client { server } => {
            let mut s = dial(SocketAddr::new(*server, o.port), o.timeout, V)?;
            s.write_all(&encode(&mine)).map_err(io)?;
            let peers = decode(&read_exact_once(&mut s, MAX_QP * MSG_LEN)?, num_qp)?;
            s.write_all(DONE).map_err(io)?;
            connect(&peers)?;
            true
        }
        Role::Server { bind } => {
            // As rc_pingpong's server: every connection is read on its own until one sends
            // valid records.
            let (mut s, peers) = serve_first(
                SocketAddr::new(*bind, o.port),
                move |s: &mut TcpStream| decode(&read_exact_once(s, MAX_QP * MSG_LEN)?, num_qp),
                o.timeout,
                "srq_pingpong",
            )?;
            connect(&peers)?;
            s.write_all(&encode(&mine)).map_err(io)?;
            if read_exact_once(&mut s, DONE.len())? != DONE {
                return Err(VerbsError::new(
                    V,
                    ErrorKind::Peer("expected \"done\"".into()),
                ));
            }
            false
        }
    };
    let post_send = |i: usize| {
        qps[i].post_send(SendWr {
            wr_id: SEND_ID,
            op: SendOp::Send,
            sg_list: vec![tx.sge(0, o.size)],
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        })
    };
    let start = Instant::now();
    let mut pending = vec![RECV_ID; num_qp];
    if is_client {
        for (i, p) in pending.iter_mut().enumerate() {
            post_send(i)?;
            *p |= SEND_ID;
        }
    }
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    while scnt < o.iters || rcnt < o.iters {
        if !cq.wait(o.timeout) {
            return Err(VerbsError::new(
                V,
                ErrorKind::Timeout(format!("no completion after {scnt} sends, {rcnt} receives")),
            ));
        }
        for wc in cq.poll(o.rx_depth as usize + num_qp) {
            if wc.status != WcStatus::Success {
                return Err(VerbsError::invalid(
                    V,
                    format!(
                        "failed status {:?} ({}) for wr_id {}",
                        wc.status, wc.status as u32, wc.wr_id
                    ),
                ));
            }
            let Some(i) = qps.iter().position(|q| q.qp_num() == wc.qp_num) else {
                return Err(VerbsError::invalid(
                    V,
                    format!("completion for unknown QPN {:06x}", wc.qp_num.value()),
                ));
            };
            let kind = wc.wr_id & 3;
            match kind {
                SEND_ID => scnt += 1,
                RECV_ID => {
                    let slot = (wc.wr_id >> 2) as usize;
                    if o.validate {
                        let at = slot * o.size;
                        let ok = wc.byte_len as usize == o.size
                            && rx.with(|b| {
                                let m = &mut b[at..at + o.size];
                                let ok = m.iter().all(|&x| x == 0);
                                m.fill(0xff);
                                ok
                            });
                        if !ok {
                            return Err(VerbsError::invalid(
                                V,
                                format!(
                                    "message {rcnt} on QP {i}: {} bytes, not {} zero bytes",
                                    wc.byte_len, o.size
                                ),
                            ));
                        }
                    }
                    free.borrow_mut().push(slot);
                    routs -= 1;
                    if routs as usize <= num_qp {
                        routs += post_recv(o.rx_depth - routs)?;
                    }
                    rcnt += 1;
                }
                _ => {
                    return Err(VerbsError::invalid(
                        V,
                        format!("completion for unknown wr_id {}", wc.wr_id),
                    ));
                }
            }
            pending[i] &= !kind;
            if scnt < o.iters && pending[i] == 0 {
                post_send(i)?;
                pending[i] = RECV_ID | SEND_ID;
            }
        }
    }
    Ok(Report {
        bytes: o.size as u64 * u64::from(o.iters) * 2,
        seconds: start.elapsed().as_secs_f64(),
        iters: o.iters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use monel_verbs::{Gid, Psn, Qpn};

    #[test]
    fn the_exchange_has_a_record_per_slot_and_reads_only_the_qps_in_use() {
        let d = |q: u32| Dest {
            lid: 0,
            qpn: Qpn::new(q),
            psn: Psn::new(q * 3),
            gid: Gid::from_ip("10.77.0.1".parse().unwrap()),
        };
        let m = encode(&[d(0x11), d(0x12)]);
        assert_eq!(m.len(), 256 * 52);
        assert_eq!(
            &m[104..155],
            b"0000:000000:000000:00000000000000000000000000000000"
        );
        assert_eq!(decode(&m, 2).unwrap(), vec![d(0x11), d(0x12)]);
        // A zero slot where a QP was expected is refused.
        assert!(decode(&m, 3).is_err());
    }
}
