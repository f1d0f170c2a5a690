//! The soft-RNIC transport: one RC queue pair per pair of ranks on different hosts, carrying
//! the link's byte stream as RoCEv2 packets through Monel's verbs layer.
//!
//! Each side registers a receive ring (`REMOTE_WRITE`). The sender copies bytes into a staging
//! region at the same ring offset and posts an RDMA WRITE with immediate (the immediate is the
//! byte count) into the peer's ring; the completion of the zero-length receive it consumes
//! tells the receiver how far the ring filled. The receiver hands back credits (bytes consumed,
//! receives reposted) with an RDMA WRITE with immediate of 16 bytes into the sender's credit
//! word, once a quarter of the window is consumed, so a sender never overruns the ring or the
//! receive queue. The pair's TCP connection stays open as the liveness signal: a dead peer
//! closes it, and sleeping ranks wait on it and the completion channel together (epoll).
//!
//! Memory registered with the NIC ([`Nic::register`]: symmetric windows) skips the staging
//! copy: a write the caller promises to leave unchanged until [`Link::settle`] gathers
//! the frame header from staging and the payload straight from where it lies (two SGEs), as
//! NCCL does with registered user buffers.
//!
//! `nic.rs` opens the NIC the rank's links share (device, port and GID) and keeps what is
//! registered with it; this file is the pair's handshake and the link.

use std::cell::RefCell;
use std::io::{self, Read};
use std::net::{IpAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use monel_verbs::{
    AccessFlags, CompletionQueue, ConnectParams, Gid, MemoryRegion, Mtu, QpCap, QpInitAttr, QpType,
    QueuePair, RKey, RecvWr, RemoteAddr, RemoteQp, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};
use nix::poll::PollFlags;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

mod nic;

pub(crate) use nic::Nic;
use nic::gid_text;

use super::{Link, Registration, Setup};
use monel_copy::copy;
use monel_peer::channel::{Channel, bound_reads, first_text};
use monel_peer::hca::{GidPolicy, HcaFilter};
use monel_sched::tune::TransportKind;
use monel_verbs::protect::{PacketAuth, Protection};

/// Soft-RNIC transport settings.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Pairs on different hosts may use the soft RNIC (`MONEL_TRANSPORT`).
    pub enabled: bool,
    /// Device to open: an IP address or a device/interface name (`MONEL_RDMA_DEV`; default:
    /// the address this rank reaches the rendezvous from).
    pub device: Option<String>,
    /// Receive ring per peer, bytes (`MONEL_RDMA_RING`).
    pub ring: usize,
    /// UDP segmentation offload and GRO on the RNIC's socket (`MONEL_RDMA_GSO=0|1`).
    pub gso: bool,
    /// How each packet is protected (`MONEL_RDMA_AUTH=none|mac|encrypt`; default `mac`).
    /// A pair uses the stronger of its two ranks' settings, with keys derived from the
    /// pair's authenticated link.
    pub auth: PacketAuth,
    /// Which GID the device's port uses (`MONEL_IB_GID_INDEX`, `MONEL_IB_ROCE_VERSION_NUM`,
    /// `MONEL_IB_ADDR_FAMILY`, `MONEL_IB_ADDR_RANGE`, or their `NCCL_IB_*` aliases; default:
    /// the first IPv4 GID, else the first).
    pub gid: GidPolicy,
    /// Which kernel RDMA devices and ports may be used (`MONEL_IB_HCA`, or `NCCL_IB_HCA`;
    /// default: any). Without one the soft RNIC is used.
    pub hca: Option<HcaFilter>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            device: None,
            ring: 2 << 20,
            gso: true,
            auth: PacketAuth::Mac,
            gid: GidPolicy::default(),
            hca: None,
        }
    }
}

/// Data messages a sender may have in flight beyond the receiver's last credit.
const MSG_WINDOW: u64 = 256;
/// Receives posted per QP: the data window plus room for the peer's credit messages.
const RQ_DEPTH: u32 = 512;
/// Send queue depth; data leaves room for credits.
const SQ_DEPTH: u32 = 512;
const SQ_CREDIT_RESERVE: u64 = 16;
/// Largest single WRITE (bytes): bigger messages hold staging longer before it frees.
const MAX_MSG: usize = 256 << 10;
/// The immediate that marks a credit message (data immediates are byte counts <= MAX_MSG).
const CREDIT_IMM: u32 = u32::MAX;
/// The work-request id of credit messages (data ids are stream offsets).
const CREDIT_WR: u64 = u64::MAX;

/// One side's half of a pair before the peer's details are known.
struct Endpoint {
    nic: Arc<Nic>,
    qp: QueuePair,
    cq: CompletionQueue,
    rx: MemoryRegion,
    credit_in: MemoryRegion,
    psn: monel_verbs::Psn,
}

impl Endpoint {
    fn new(nic: &Arc<Nic>, ring: usize) -> monel_verbs::Result<Self> {
        let cq = nic.ctx.create_cq((SQ_DEPTH + RQ_DEPTH) as usize)?;
        let qp = nic.pd.create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_send_wr: SQ_DEPTH,
                max_recv_wr: RQ_DEPTH,
                // A frame header from staging and its payload from registered memory.
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        })?;
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        Ok(Self {
            rx: nic.pd.reg_mr(vec![0; ring], remote)?,
            credit_in: nic.pd.reg_mr(vec![0; 16], remote)?,
            nic: nic.clone(),
            qp,
            cq,
            psn: monel_verbs::random_psn(),
        })
    }

    /// The offer: QPN, PSN, GID, UDP port, MTU, then the ring and credit word.
    fn offer(&self, auth: PacketAuth) -> Vec<u8> {
        let nic = &self.nic;
        let mut b = Vec::with_capacity(OFFER_LEN);
        b.extend(self.qp.qp_num().value().to_le_bytes());
        b.extend(self.psn.value().to_le_bytes());
        b.extend(nic.gid.0);
        b.extend(nic.port.to_le_bytes());
        b.extend(nic.mtu.bytes().to_le_bytes());
        b.extend(self.rx.addr().to_le_bytes());
        b.extend(self.rx.rkey().0.to_le_bytes());
        b.extend((self.rx.len() as u64).to_le_bytes());
        b.extend(self.credit_in.addr().to_le_bytes());
        b.extend(self.credit_in.rkey().0.to_le_bytes());
        b.push(auth.code());
        b
    }
}

const OFFER_LEN: usize = 4 + 4 + 16 + 2 + 4 + 8 + 4 + 8 + 8 + 4 + 1;

/// A peer's offer, decoded.
pub(crate) struct Offer {
    remote: RemoteQp,
    port: u16,
    mtu: Mtu,
    ring: RemoteAddr,
    ring_len: usize,
    credit: RemoteAddr,
    /// The packet protection the peer asks for.
    auth: PacketAuth,
}

impl Offer {
    pub(crate) fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != OFFER_LEN {
            return Err(format!("malformed RDMA offer ({} bytes)", b.len()));
        }
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().expect("2"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        let mtu = Mtu::from_bytes(u32_at(26)).ok_or("RDMA offer with a bad MTU")?;
        let ring_len = u64_at(42) as usize;
        if !(4096..=1 << 30).contains(&ring_len) {
            return Err(format!("RDMA offer with a ring of {ring_len} bytes"));
        }
        let auth = PacketAuth::from_code(b[62]).ok_or("RDMA offer with an unknown protection")?;
        Ok(Self {
            remote: RemoteQp {
                qpn: monel_verbs::Qpn::new(u32_at(0) & 0xff_ffff),
                psn: monel_verbs::Psn::new(u32_at(4) & 0xff_ffff),
                gid: Gid(b[8..24].try_into().expect("16")),
            },
            port: u16_at(24),
            mtu,
            ring: RemoteAddr {
                addr: u64_at(30),
                rkey: RKey(u32_at(38)),
            },
            ring_len,
            credit: RemoteAddr {
                addr: u64_at(50),
                rkey: RKey(u32_at(58)),
            },
            auth,
        })
    }
}

const OFFER: u8 = 11;
const NO_OFFER: u8 = 10;
const READY: u8 = 13;
const FAIL: u8 = 12;

/// Moves every pair in `streams` (the pairs shared memory did not take) onto the soft RNIC
/// where both sides can, over each pair's TCP connection: offers (QP, ring, credit word) to
/// every peer, reads theirs, connects, then confirms both ways before any data moves. A pair
/// where either side cannot stays on TCP, with the reason.
pub(crate) fn upgrade(
    streams: Vec<Option<Channel>>,
    local_ip: IpAddr,
    cfg: &RdmaConfig,
    deadline: Instant,
) -> io::Result<Vec<Option<Setup<RdmaLink>>>> {
    let n = streams.len();
    let mut out: Vec<Option<Setup<RdmaLink>>> = (0..n).map(|_| None).collect();
    if streams.iter().all(Option::is_none) {
        return Ok(out);
    }
    let mut streams = streams;
    bound_reads(&mut streams, deadline)?;
    let nic: Result<Arc<Nic>, String> = if cfg.enabled {
        Nic::open(cfg, local_ip)
            .map(Arc::new)
            .map_err(|e| format!("no soft RNIC: {e}"))
    } else {
        Err("the soft RNIC is disabled on this rank (MONEL_TRANSPORT)".into())
    };
    // Offers first to everyone (small writes never block), then the peers' offers.
    let mut mine: Vec<Option<Result<Endpoint, String>>> = (0..n).map(|_| None).collect();
    for (j, s) in streams.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let ep = nic
            .clone()
            .and_then(|nic| Endpoint::new(&nic, cfg.ring).map_err(|e| e.to_string()));
        match &ep {
            Ok(ep) => s.send(OFFER, &[&ep.offer(ep.nic.auth(cfg))])?,
            Err(why) => s.send(NO_OFFER, &[why.as_bytes()])?,
        }
        mine[j] = Some(ep);
    }
    let mut staged: Vec<Option<Result<(Endpoint, Offer), String>>> = (0..n).map(|_| None).collect();
    for (j, s) in streams.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let (kind, f) = s.recv()?;
        let ep = mine[j].take().expect("offered to every peer");
        let verdict = match (ep, kind) {
            (Err(why), _) => Err(why),
            (Ok(_), NO_OFFER) => Err(format!("rank {j} has no soft RNIC: {}", first_text(&f))),
            (Ok(_), k) if k != OFFER => Err(format!("rank {j} sent a garbled RDMA handshake")),
            (Ok(ep), _) => Offer::decode(f.first().map_or(&[], |v| v)).and_then(|o| {
                let nic = &ep.nic;
                let mode = nic.auth(cfg).max(o.auth);
                let (mine, theirs) = (ep.qp.qp_num().value(), o.remote.qpn.value());
                if nic.is_rdma_core() && mode != PacketAuth::None {
                    return Err(format!(
                        "{} speaks plain RoCEv2 and rank {j} asks for {mode} packets \
                         (MONEL_RDMA_AUTH=none on rank {j} lets the pair use it)",
                        nic.ctx.device().name
                    ));
                }
                if !nic.is_rdma_core() {
                    ep.qp
                        .protect(&Protection::between(s.key(), mode, mine, theirs))
                        .map_err(|e| e.to_string())?;
                }
                ep.qp
                    .connect(
                        &o.remote,
                        &ConnectParams {
                            sgid_index: nic.sgid_index,
                            local_psn: ep.psn,
                            mtu: nic.mtu.min(o.mtu),
                            access: AccessFlags::REMOTE_WRITE,
                            // 4 ms ACK timeout, retried 7 times, RNR retried forever.
                            timeout: 10,
                            retry_cnt: 7,
                            rnr_retry: 7,
                            min_rnr_timer: 1,
                            rd_atomic: 1,
                            hop_limit: 64,
                            udp_port: Some(o.port),
                        },
                    )
                    .map_err(|e| e.to_string())?;
                for _ in 0..RQ_DEPTH {
                    ep.qp
                        .post_recv(RecvWr {
                            wr_id: 0,
                            sg_list: vec![],
                        })
                        .map_err(|e| e.to_string())?;
                }
                Ok((ep, o))
            }),
        };
        match &verdict {
            Ok(_) => s.send(READY, &[])?,
            Err(why) => s.send(FAIL, &[why.as_bytes()])?,
        }
        staged[j] = Some(verdict);
    }
    for (j, slot) in streams.iter_mut().enumerate() {
        let Some(mut s) = slot.take() else { continue };
        let (kind, f) = s.recv()?;
        s.s.set_read_timeout(None)?;
        let v = staged[j].take().expect("answered every peer");
        out[j] = Some(match (v, kind) {
            (Ok((ep, o)), READY) => {
                let nic = &ep.nic;
                let desc = format!(
                    "{} -> gid {} udp {} qpn {:#x}, MTU {}, {} KiB ring, packets {}",
                    nic.describe(),
                    gid_text(o.remote.gid),
                    o.port,
                    o.remote.qpn.value(),
                    nic.mtu.min(o.mtu).bytes(),
                    ep.rx.len() >> 10,
                    nic.auth(cfg).max(o.auth)
                );
                let link = RdmaLink::new(ep, o, s.s)?;
                Setup::Up(link, desc)
            }
            (Ok(_), _) => Setup::Declined(
                s,
                format!(
                    "rank {j} could not connect the soft RNIC: {}",
                    first_text(&f)
                ),
            ),
            (Err(why), _) => Setup::Declined(s, why),
        });
    }
    Ok(out)
}

/// The stream state of one RDMA link.
struct State {
    qp: QueuePair,
    cq: CompletionQueue,
    rx: MemoryRegion,
    credit_in: MemoryRegion,
    tx: MemoryRegion,
    credit_out: MemoryRegion,
    remote_ring: RemoteAddr,
    remote_credit: RemoteAddr,
    /// Receive ring size (this side's `rx`).
    rx_cap: u64,
    /// The peer's ring size (and this side's staging).
    tx_cap: u64,
    // Sending: stream offsets.
    head: u64,
    peer_tail: u64,
    send_done: u64,
    msgs_sent: u64,
    peer_msgs: u64,
    sq_posted: u64,
    sq_done: u64,
    // Receiving.
    arrived: u64,
    tail: u64,
    credited_tail: u64,
    msgs_in: u64,
    credited_msgs: u64,
    wcs: Vec<WorkCompletion>,
    /// The stream offset up to which posted writes read the caller's memory.
    held_to: u64,
    /// Bytes sent straight from registered memory.
    zero_copy: u64,
    /// The first failed work completion.
    failed: Option<String>,
    /// The peer closed the TCP connection.
    eof: bool,
    /// The device (its counters for the logs); keeps it open while the link lives (dropped
    /// last).
    nic: Arc<Nic>,
}

impl State {
    /// Takes every completion: data arrived, credits, finished sends; reposts receives.
    fn drain(&mut self) {
        self.take_completions(true);
    }

    /// Takes completions; `drive`: an empty queue first has the calling thread receive what
    /// the device's sockets hold (busy polling); otherwise only what is queued.
    fn take_completions(&mut self, drive: bool) {
        loop {
            self.wcs.clear();
            let got = if drive {
                self.cq.poll_into(64, &mut self.wcs)
            } else {
                self.cq.poll_queued(64, &mut self.wcs)
            };
            for i in 0..got {
                let wc = self.wcs[i];
                self.complete(&wc);
            }
            if got < 64 {
                return;
            }
        }
    }

    fn complete(&mut self, wc: &WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.failed.get_or_insert_with(|| {
                format!(
                    "soft RNIC work completion {:?} ({:?})",
                    wc.status, wc.opcode
                )
            });
            return;
        }
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                match wc.imm {
                    Some(CREDIT_IMM) => {
                        let mut b = [0u8; 16];
                        if self.credit_in.read(0, &mut b).is_ok() {
                            let tail = u64::from_le_bytes(b[..8].try_into().expect("8"));
                            let msgs = u64::from_le_bytes(b[8..].try_into().expect("8"));
                            // A credit beyond what was sent is a broken peer: ignore it.
                            if tail <= self.head && msgs <= self.msgs_sent {
                                self.peer_tail = self.peer_tail.max(tail);
                                self.peer_msgs = self.peer_msgs.max(msgs);
                            }
                        }
                    }
                    Some(n) if u64::from(n) <= self.rx_cap - (self.arrived - self.tail) => {
                        self.arrived += u64::from(n);
                        self.msgs_in += 1;
                    }
                    _ => {
                        self.failed
                            .get_or_insert_with(|| "the peer overran the receive ring".into());
                        return;
                    }
                }
                if let Err(e) = self.qp.post_recv(RecvWr {
                    wr_id: 0,
                    sg_list: vec![],
                }) {
                    self.failed.get_or_insert_with(|| e.to_string());
                }
            }
            WcOpcode::RdmaWrite => {
                self.sq_done += 1;
                if wc.wr_id != CREDIT_WR {
                    self.send_done = self.send_done.max(wc.wr_id);
                }
            }
            _ => {}
        }
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(why) => Err(io::Error::other(why.clone())),
            None => Ok(()),
        }
    }

    /// Bytes that may be written now (contiguous in the ring, one message at most).
    fn room(&self) -> usize {
        if self.msgs_sent - self.peer_msgs >= MSG_WINDOW
            || self.sq_posted - self.sq_done >= u64::from(SQ_DEPTH) - SQ_CREDIT_RESERVE
        {
            return 0;
        }
        let free = (self.tx_cap - (self.head - self.peer_tail))
            .min(self.tx_cap - (self.head - self.send_done));
        let to_end = self.tx_cap - self.head % self.tx_cap;
        free.min(to_end).min(MAX_MSG as u64) as usize
    }

    /// Writes what fits of `a` then `b`; `stable`: `b` stays unchanged until [`Link::settle`]
    /// returns, so when it lies in registered memory the NIC reads it there.
    fn write_two(&mut self, a: &[u8], b: &[u8], stable: bool) -> io::Result<usize> {
        self.drain();
        self.check()?;
        let n = self.room().min(a.len() + b.len());
        if n == 0 {
            return Ok(0);
        }
        let off = (self.head % self.tx_cap) as usize;
        let na = n.min(a.len());
        let nb = n - na;
        let straight = if stable && nb > 0 {
            self.nic.registered(&b[..nb])
        } else {
            None
        };
        let sg_list = match &straight {
            Some((r, b_off)) => {
                self.tx.with(|buf| copy(&mut buf[off..off + na], &a[..na]));
                let mut sg = Vec::with_capacity(2);
                if na > 0 {
                    sg.push(self.tx.sge(off, na));
                }
                sg.push(r.mr.sge(*b_off, nb));
                sg
            }
            None => {
                self.tx.with(|buf| {
                    copy(&mut buf[off..off + na], &a[..na]);
                    copy(&mut buf[off + na..off + n], &b[..nb]);
                });
                vec![self.tx.sge(off, n)]
            }
        };
        self.head += n as u64;
        if straight.is_some() {
            self.held_to = self.head;
            self.zero_copy += nb as u64;
        }
        self.qp
            .post_send(SendWr {
                wr_id: self.head,
                op: SendOp::WriteImm(
                    RemoteAddr {
                        addr: self.remote_ring.addr + off as u64,
                        rkey: self.remote_ring.rkey,
                    },
                    n as u32,
                ),
                sg_list,
                flags: SendFlags {
                    signaled: true,
                    ..SendFlags::default()
                },
            })
            .map_err(io::Error::other)?;
        self.msgs_sent += 1;
        self.sq_posted += 1;
        Ok(n)
    }

    /// True once every write that read the caller's memory has completed (the peer
    /// acknowledged it, so the NIC reads it no more).
    fn settled(&self) -> bool {
        self.send_done >= self.held_to
    }

    /// Copies up to `out.len()` arrived bytes (across the ring's wrap), consuming them when
    /// `consume`.
    fn copy_out(&mut self, out: &mut [u8], consume: bool) -> usize {
        let n = (out.len() as u64).min(self.arrived - self.tail) as usize;
        if n == 0 {
            return 0;
        }
        let off = (self.tail % self.rx_cap) as usize;
        let first = n.min(self.rx_cap as usize - off);
        self.rx.with(|buf| {
            copy(&mut out[..first], &buf[off..off + first]);
            copy(&mut out[first..n], &buf[..n - first]);
        });
        if consume {
            self.tail += n as u64;
            self.maybe_credit();
        }
        n
    }

    /// Lends up to `max` arrived bytes, up to the ring's wrap, to `f`; consumes what it used.
    fn read_in_place(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8]) -> usize,
    ) -> io::Result<usize> {
        self.drain();
        let n = (max as u64).min(self.arrived - self.tail) as usize;
        if n == 0 {
            return self.nothing_to_read();
        }
        let off = (self.tail % self.rx_cap) as usize;
        let n = n.min(self.rx_cap as usize - off);
        let used = self.rx.with(|buf| f(&buf[off..off + n])).min(n);
        self.tail += used as u64;
        self.maybe_credit();
        Ok(used)
    }

    /// Hands back credits once a quarter of the ring or of the message window is consumed.
    fn maybe_credit(&mut self) {
        let due = self.tail - self.credited_tail >= self.rx_cap / 4
            || self.msgs_in - self.credited_msgs >= MSG_WINDOW / 4;
        if !due || self.sq_posted - self.sq_done >= u64::from(SQ_DEPTH) || self.failed.is_some() {
            return;
        }
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.tail.to_le_bytes());
        b[8..].copy_from_slice(&self.msgs_in.to_le_bytes());
        // A retransmission may carry a newer value than first sent: credits only grow.
        self.credit_out.with(|buf| buf.copy_from_slice(&b));
        let r = self.qp.post_send(SendWr {
            wr_id: CREDIT_WR,
            op: SendOp::WriteImm(self.remote_credit, CREDIT_IMM),
            sg_list: vec![self.credit_out.sge(0, 16)],
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        });
        match r {
            Ok(()) => {
                self.sq_posted += 1;
                self.credited_tail = self.tail;
                self.credited_msgs = self.msgs_in;
            }
            Err(e) => {
                self.failed.get_or_insert_with(|| e.to_string());
            }
        }
    }

    fn read(&mut self, out: &mut [u8], consume: bool) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        self.drain();
        let n = self.copy_out(out, consume);
        if n > 0 {
            return Ok(n);
        }
        self.nothing_to_read()
    }

    /// What a read that found no bytes reports: the link's failure, the peer's end, or 0.
    fn nothing_to_read(&self) -> io::Result<usize> {
        self.check()?;
        if self.eof {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(0)
    }

    /// True if there is something to do without sleeping.
    fn ready(&self, read: bool, write: bool) -> bool {
        self.failed.is_some()
            || self.eof
            || (read && self.arrived > self.tail)
            || (write && self.room() > 0)
    }
}

/// A link over one RC queue pair of the soft RNIC (see the module docs).
pub(crate) struct RdmaLink {
    st: RefCell<State>,
    /// The pair's TCP connection: closes when the peer dies.
    tcp: TcpStream,
    /// Sleeps on the completion channel and the TCP connection together.
    epoll: Epoll,
}

impl RdmaLink {
    fn new(ep: Endpoint, o: Offer, tcp: TcpStream) -> io::Result<Self> {
        let nic = ep.nic;
        let tx = nic
            .pd
            .reg_mr(vec![0; o.ring_len], AccessFlags::NONE)
            .map_err(io::Error::other)?;
        let credit_out = nic
            .pd
            .reg_mr(vec![0; 16], AccessFlags::NONE)
            .map_err(io::Error::other)?;
        tcp.set_nonblocking(true)?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(ep.cq.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))?;
        epoll.add(
            tcp.as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, 1),
        )?;
        let rx_cap = ep.rx.len() as u64;
        Ok(Self {
            st: RefCell::new(State {
                qp: ep.qp,
                cq: ep.cq,
                rx: ep.rx,
                credit_in: ep.credit_in,
                tx,
                credit_out,
                remote_ring: o.ring,
                remote_credit: o.credit,
                rx_cap,
                tx_cap: o.ring_len as u64,
                head: 0,
                peer_tail: 0,
                send_done: 0,
                msgs_sent: 0,
                peer_msgs: 0,
                sq_posted: 0,
                sq_done: 0,
                arrived: 0,
                tail: 0,
                credited_tail: 0,
                msgs_in: 0,
                credited_msgs: 0,
                wcs: Vec::with_capacity(64),
                held_to: 0,
                zero_copy: 0,
                failed: None,
                eof: false,
                nic,
            }),
            tcp,
            epoll,
        })
    }

    /// The peer closed its end: take what it sent before (loopback datagrams sent before the
    /// close are already queued), then report the end.
    fn watch_tcp(&self, st: &mut State) {
        if st.eof {
            return;
        }
        let mut b = [0u8; 1];
        let closed = match (&self.tcp).read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => {
                e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted
            }
        };
        if closed {
            st.drain();
            st.eof = true;
        }
    }

    /// Waits until no posted write reads the caller's memory any more (see
    /// [`State::write_two`]), or `deadline`.
    fn settle_writes(&self, deadline: Instant) -> io::Result<()> {
        let mut st = self.st.borrow_mut();
        let mut round = 0u32;
        loop {
            st.drain();
            st.check()?;
            if st.settled() {
                return Ok(());
            }
            self.watch_tcp(&mut st);
            if st.eof {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "writes from registered memory were not acknowledged in time",
                ));
            }
            round = round.wrapping_add(1);
            if round % 64 == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// The QP's counters (retransmissions, RNR, sequence errors), for diagnostics.
    pub(crate) fn stats(&self) -> Option<monel_verbs::QpStats> {
        self.st.borrow().qp.stats().ok()
    }
}

/// How long a closing link waits for its last writes to be acknowledged.
const FLUSH_ON_CLOSE: Duration = Duration::from_secs(2);

impl Drop for RdmaLink {
    /// Closing a link ends its TCP connection, which the peer reads as the end of the data:
    /// first let the writes already posted reach the peer (their completions come back only
    /// once the peer acknowledged them), within `FLUSH_ON_CLOSE` (2 s), unless the peer closed
    /// first (it acknowledges nothing more).
    fn drop(&mut self) {
        let until = Instant::now() + FLUSH_ON_CLOSE;
        let mut st = self.st.borrow_mut();
        while st.sq_done < st.sq_posted && st.failed.is_none() && Instant::now() < until {
            st.drain();
            if st.sq_done == st.sq_posted {
                break;
            }
            self.watch_tcp(&mut st);
            if st.eof {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl Link for RdmaLink {
    fn kind(&self) -> TransportKind {
        TransportKind::Roce
    }
    fn write_some(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        self.st.get_mut().write_two(data, &[], false)
    }
    fn write_two(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        self.st.get_mut().write_two(a, b, false)
    }
    fn write_two_stable(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        self.st.get_mut().write_two(a, b, true)
    }
    fn settle(&mut self, deadline: Instant) -> io::Result<()> {
        self.settle_writes(deadline)
    }
    fn zero_copy_bytes(&self) -> u64 {
        self.st.borrow().zero_copy
    }
    #[allow(unsafe_code)]
    unsafe fn register(&self, ptr: *mut u8, len: usize) -> Option<io::Result<Registration>> {
        let nic = self.st.borrow().nic.clone();
        // SAFETY: this function's contract is `Nic::register`'s.
        let r = unsafe { nic.register(ptr, len) };
        Some(r.map(|r| Box::new(r) as Registration))
    }
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.st.get_mut().read(buf, true)
    }
    fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.st.borrow_mut().read(buf, false)
    }
    fn read_in_place(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Option<io::Result<usize>> {
        Some(self.st.get_mut().read_in_place(max, f))
    }
    fn fd(&self) -> RawFd {
        self.epoll.0.as_raw_fd()
    }
    fn arm(&mut self, read: bool, write: bool) -> Option<PollFlags> {
        let st = self.st.get_mut();
        // Clear a stale wake-up, arm the channel, then look: a completion that lands between
        // the look and the sleep writes the channel.
        st.cq.get_event();
        st.drain();
        if st.ready(read, write) {
            return None;
        }
        // From here the progress thread receives for this link and writes the channel.
        st.cq.req_notify();
        st.take_completions(false);
        if st.ready(read, write) {
            return None;
        }
        let mut st = self.st.borrow_mut();
        self.watch_tcp(&mut st);
        (!st.ready(read, write)).then_some(PollFlags::POLLIN)
    }
    fn disarm(&mut self) {
        let st = self.st.get_mut();
        st.cq.get_event();
    }
    fn path_progress(&self) -> Option<(u64, u64)> {
        self.stats().map(|s| (s.timeouts, s.rx_packets))
    }
    fn counters(&self) -> Option<String> {
        let s = self.stats()?;
        let d = self.st.borrow().nic.ctx.counters();
        Some(format!(
            "{} packets sent, {} received, {} retransmitted, {} timeouts, {} sequence NAKs \
             received ({} sent), {} RNR NAKs received, {} duplicates, {} out of sequence; \
             device: {} datagrams in {} receive calls ({} coalesced), {} sent in {} calls \
             ({} segmented), {} bytes zero-copy; {} bytes sent straight from registered \
             windows (no staging copy)",
            s.tx_packets,
            s.rx_packets,
            s.retransmitted_packets,
            s.timeouts,
            s.seq_naks_received,
            s.seq_naks_sent,
            s.rnr_naks_received,
            s.duplicate_requests,
            s.out_of_sequence,
            d.rx_packets,
            d.rx_batches,
            d.rx_coalesced,
            d.tx_packets,
            d.tx_batches,
            d.tx_segmented,
            d.tx_zero_copy_bytes,
            self.st.borrow().zero_copy
        ))
    }
}
