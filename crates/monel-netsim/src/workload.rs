//! Random work with an independent model of its outcome: every kind of RC operation, random
//! lengths, several QPs. Every completion is checked against the model as it arrives: exactly
//! once, in posting order, success, and the right bytes; at the end the WRITE targets must
//! equal the model.

use std::collections::VecDeque;

use monel_rc::memory::AccessFlags;
use monel_rc::{
    Instant, QpStats, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use monel_wire::{LKey, RKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::net::{ConnectConfig, Network};

/// Shape of a random workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkloadConfig {
    /// Work requests per flow.
    pub ops_per_flow: usize,
    /// Largest SEND/WRITE/READ in bytes.
    pub max_len: u32,
    /// Outstanding work requests per flow.
    pub depth: usize,
    /// Receives kept posted per flow.
    pub recv_depth: usize,
    /// Give up after this much virtual time.
    pub deadline: Instant,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            ops_per_flow: 500,
            max_len: 16 * 1024,
            depth: 16,
            recv_depth: 16,
            deadline: Instant::from_nanos(60_000_000_000),
        }
    }
}

/// What a finished workload measured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Report {
    /// Work requests completed (all verified).
    pub completed: usize,
    /// Payload bytes moved by them.
    pub payload_bytes: u64,
    /// Virtual time from start to the last completion.
    pub elapsed_ns: u64,
    /// Sum of the counters of every QP.
    pub stats: QpStats,
    /// Packets the links lost.
    pub lost: u64,
    /// Packets the hosts dropped on a bad ICRC.
    pub icrc_drops: u64,
    /// Simulator events processed.
    pub events: u64,
}

impl Report {
    /// Payload goodput in Gb/s of virtual time.
    pub fn goodput_gbps(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.payload_bytes as f64 * 8.0 / self.elapsed_ns as f64
        }
    }
}

#[derive(Debug)]
enum Expect {
    Done,
    Bytes { at: u64, data: Vec<u8> },
    Word { at: u64, value: u64 },
}

#[derive(Debug)]
struct Posted {
    wr_id: u64,
    opcode: WcOpcode,
    len: u32,
    expect: Expect,
}

#[derive(Debug)]
struct RecvExpect {
    data: Vec<u8>,
    imm: Option<u32>,
    opcode: WcOpcode,
    byte_len: u32,
}

const ATOMIC_WORDS: usize = 64;

#[derive(Debug)]
struct Flow {
    a: usize,
    qa: usize,
    b: usize,
    qb: usize,
    lkey_a: LKey,
    src: u64,
    dst: u64,
    dst_lkey: LKey,
    lkey_b: LKey,
    recv: u64,
    wtarget: (u64, RKey),
    rsource: (u64, RKey),
    atomics: (u64, RKey),
    model_write: Vec<u8>,
    model_read: Vec<u8>,
    model_atomic: [u64; ATOMIC_WORDS],
    posted: VecDeque<Posted>,
    recv_expect: VecDeque<RecvExpect>,
    next_wr: u64,
    done: usize,
}

/// A set of flows with their model.
#[derive(Debug)]
pub struct Workload {
    cfg: WorkloadConfig,
    flows: Vec<Flow>,
    rng: ChaCha8Rng,
    payload: u64,
    completed: usize,
    seed: u64,
}

impl Workload {
    /// Connects one flow per `(requester host, responder host)` pair and registers its memory.
    pub fn new(
        net: &mut Network,
        pairs: &[(usize, usize)],
        conn: &ConnectConfig,
        cfg: WorkloadConfig,
        seed: u64,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        let mut flows = Vec::new();
        let ml = cfg.max_len as usize;
        for (i, &(a, b)) in pairs.iter().enumerate() {
            let (qa, qb) = net.connect(a, b, conn);
            let key = |rng: &mut ChaCha8Rng| rng.gen_range(1..u32::MAX);
            let lkey_a = LKey(key(&mut rng));
            let ha = net.host_mut(a);
            let src = ha.mem.register(
                cfg.depth * ml,
                lkey_a,
                RKey(key(&mut rng)),
                AccessFlags::LOCAL_WRITE,
            );
            let lkey_d = LKey(key(&mut rng));
            let dst = ha.mem.register(
                cfg.depth * ml,
                lkey_d,
                RKey(key(&mut rng)),
                AccessFlags::LOCAL_WRITE,
            );
            let hb = net.host_mut(b);
            let lkey_b = LKey(key(&mut rng));
            let recv = hb.mem.register(
                cfg.recv_depth * ml,
                lkey_b,
                RKey(key(&mut rng)),
                AccessFlags::LOCAL_WRITE,
            );
            let wk = RKey(key(&mut rng));
            let wlen = 4 * ml;
            let wt = hb.mem.register(
                wlen,
                LKey(key(&mut rng)),
                wk,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            );
            let rk = RKey(key(&mut rng));
            let rs = hb
                .mem
                .register(4 * ml, LKey(key(&mut rng)), rk, AccessFlags::REMOTE_READ);
            let model_read: Vec<u8> = (0..4 * ml).map(|_| rng.r#gen()).collect();
            hb.mem.bytes_mut(rs, 4 * ml).copy_from_slice(&model_read);
            let ak = RKey(key(&mut rng));
            let at = hb.mem.register(
                8 * ATOMIC_WORDS,
                LKey(key(&mut rng)),
                ak,
                AccessFlags::REMOTE_ATOMIC,
            );
            let flow = Flow {
                a,
                qa,
                b,
                qb,
                lkey_a,
                src,
                dst,
                dst_lkey: lkey_d,
                lkey_b,
                recv,
                wtarget: (wt, wk),
                rsource: (rs, rk),
                atomics: (at, ak),
                model_write: vec![0; wlen],
                model_read,
                model_atomic: [0; ATOMIC_WORDS],
                posted: VecDeque::new(),
                recv_expect: VecDeque::new(),
                next_wr: (i as u64) << 32,
                done: 0,
            };
            for slot in 0..cfg.recv_depth {
                let sge = Sge {
                    addr: flow.recv + (slot * ml) as u64,
                    length: cfg.max_len,
                    lkey: flow.lkey_b,
                };
                net.host_mut(b).qps[qb]
                    .post_recv(RecvWr {
                        wr_id: slot as u64,
                        sg_list: vec![sge],
                    })
                    .expect("post_recv");
            }
            flows.push(flow);
        }
        Self {
            cfg,
            flows,
            rng,
            payload: 0,
            completed: 0,
            seed,
        }
    }

    fn post_more(&mut self, net: &mut Network) {
        let ml = self.cfg.max_len;
        for f in &mut self.flows {
            let mut posted_any = false;
            while f.posted.len() < self.cfg.depth
                && (f.next_wr & 0xffff_ffff) < self.cfg.ops_per_flow as u64
            {
                let wr_id = f.next_wr;
                f.next_wr += 1;
                let slot = (wr_id & 0xffff_ffff) as usize % self.cfg.depth;
                let src = f.src + (slot as u64) * u64::from(ml);
                let dst = f.dst_slot(slot, ml);
                let len = match self.rng.gen_range(0..10) {
                    0 => 0,
                    1..=3 => self.rng.gen_range(1..=256),
                    _ => self.rng.gen_range(1..=ml),
                };
                let kind = self.rng.gen_range(0..7);
                let host = net.host_mut(f.a);
                let mut fill = |len: u32, rng: &mut ChaCha8Rng| {
                    let data: Vec<u8> = (0..len).map(|_| rng.r#gen()).collect();
                    if len > 0 {
                        host.mem.bytes_mut(src, len as usize).copy_from_slice(&data);
                    }
                    data
                };
                let (op, sge, posted) = match kind {
                    0 | 1 => {
                        let data = fill(len, &mut self.rng);
                        let imm = (kind == 1).then(|| self.rng.r#gen());
                        f.recv_expect.push_back(RecvExpect {
                            data,
                            imm,
                            opcode: WcOpcode::Recv,
                            byte_len: len,
                        });
                        let op = imm.map_or(SendOp::Send, SendOp::SendImm);
                        (
                            op,
                            Sge {
                                addr: src,
                                length: len,
                                lkey: f.lkey_a,
                            },
                            Posted {
                                wr_id,
                                opcode: WcOpcode::Send,
                                len,
                                expect: Expect::Done,
                            },
                        )
                    }
                    2 | 3 => {
                        let data = fill(len, &mut self.rng);
                        let off = self.rng.gen_range(0..=(f.model_write.len() as u32 - len));
                        f.model_write[off as usize..(off + len) as usize].copy_from_slice(&data);
                        let remote = RemoteAddr {
                            addr: f.wtarget.0 + u64::from(off),
                            rkey: f.wtarget.1,
                        };
                        let op = if kind == 3 {
                            let imm = self.rng.r#gen();
                            f.recv_expect.push_back(RecvExpect {
                                data: Vec::new(),
                                imm: Some(imm),
                                opcode: WcOpcode::RecvRdmaWithImm,
                                byte_len: len,
                            });
                            SendOp::WriteImm(remote, imm)
                        } else {
                            SendOp::Write(remote)
                        };
                        (
                            op,
                            Sge {
                                addr: src,
                                length: len,
                                lkey: f.lkey_a,
                            },
                            Posted {
                                wr_id,
                                opcode: WcOpcode::RdmaWrite,
                                len,
                                expect: Expect::Done,
                            },
                        )
                    }
                    4 => {
                        let off = self.rng.gen_range(0..=(f.model_read.len() as u32 - len));
                        let data = f.model_read[off as usize..(off + len) as usize].to_vec();
                        let remote = RemoteAddr {
                            addr: f.rsource.0 + u64::from(off),
                            rkey: f.rsource.1,
                        };
                        (
                            SendOp::Read(remote),
                            Sge {
                                addr: dst,
                                length: len,
                                lkey: f.dst_lkey,
                            },
                            Posted {
                                wr_id,
                                opcode: WcOpcode::RdmaRead,
                                len,
                                expect: Expect::Bytes { at: dst, data },
                            },
                        )
                    }
                    _ => {
                        let w = self.rng.gen_range(0..ATOMIC_WORDS);
                        let remote = RemoteAddr {
                            addr: f.atomics.0 + 8 * w as u64,
                            rkey: f.atomics.1,
                        };
                        let old = f.model_atomic[w];
                        let (op, opcode) = if kind == 5 {
                            let add = self.rng.gen_range(1..1000u64);
                            f.model_atomic[w] = old.wrapping_add(add);
                            (SendOp::FetchAdd { remote, add }, WcOpcode::FetchAdd)
                        } else {
                            let compare = if self.rng.gen_bool(0.5) { old } else { old ^ 1 };
                            let swap = self.rng.r#gen();
                            if compare == old {
                                f.model_atomic[w] = swap;
                            }
                            (
                                SendOp::CompareSwap {
                                    remote,
                                    compare,
                                    swap,
                                },
                                WcOpcode::CompSwap,
                            )
                        };
                        (
                            op,
                            Sge {
                                addr: dst,
                                length: 8,
                                lkey: f.dst_lkey,
                            },
                            Posted {
                                wr_id,
                                opcode,
                                len: 8,
                                expect: Expect::Word {
                                    at: dst,
                                    value: old,
                                },
                            },
                        )
                    }
                };
                let flags = SendFlags {
                    signaled: true,
                    ..Default::default()
                };
                net.host_mut(f.a).qps[f.qa]
                    .post_send(SendWr {
                        wr_id,
                        op,
                        sg_list: vec![sge],
                        flags,
                    })
                    .expect("post_send");
                f.posted.push_back(posted);
                posted_any = true;
            }
            if posted_any {
                net.kick(f.a);
            }
        }
    }

    fn check_completions(&mut self, net: &mut Network) -> Result<(), String> {
        let seed = self.seed;
        let ml = self.cfg.max_len;
        for fi in 0..self.flows.len() {
            let (a, qa, b, qb) = {
                let f = &self.flows[fi];
                (f.a, f.qa, f.b, f.qb)
            };
            // Requester side.
            let mine: Vec<_> = take_completions(net, a, qa);
            for wc in mine {
                let f = &mut self.flows[fi];
                let p = f.posted.pop_front().ok_or(format!(
                    "seed {seed}: flow {fi}: completion {wc:?} with nothing outstanding"
                ))?;
                if wc.wr_id != p.wr_id || wc.status != WcStatus::Success || wc.opcode != p.opcode {
                    return Err(format!(
                        "seed {seed}: flow {fi}: expected wr {:#x} {:?} success, got {wc:?}",
                        p.wr_id, p.opcode
                    ));
                }
                match &p.expect {
                    Expect::Done => {}
                    Expect::Bytes { at, data } => {
                        let got = net.host(a).mem.bytes(*at, data.len());
                        if got != &data[..] {
                            return Err(format!(
                                "seed {seed}: flow {fi}: READ wr {:#x} returned wrong bytes",
                                p.wr_id
                            ));
                        }
                    }
                    Expect::Word { at, value } => {
                        let got = u64::from_le_bytes(
                            net.host(a).mem.bytes(*at, 8).try_into().expect("8 bytes"),
                        );
                        if got != *value {
                            return Err(format!(
                                "seed {seed}: flow {fi}: atomic wr {:#x} returned {got:#x}, model says {value:#x}",
                                p.wr_id
                            ));
                        }
                    }
                }
                f.done += 1;
                self.completed += 1;
                self.payload += u64::from(p.len);
            }
            // Responder side.
            let theirs: Vec<_> = take_completions(net, b, qb);
            let mut reposted = false;
            for wc in theirs {
                let f = &mut self.flows[fi];
                let e = f
                    .recv_expect
                    .pop_front()
                    .ok_or(format!("seed {seed}: flow {fi}: unexpected receive {wc:?}"))?;
                if wc.status != WcStatus::Success
                    || wc.opcode != e.opcode
                    || wc.imm != e.imm
                    || wc.byte_len != e.byte_len
                {
                    return Err(format!(
                        "seed {seed}: flow {fi}: receive {wc:?}, expected {:?} imm {:?} len {}",
                        e.opcode, e.imm, e.byte_len
                    ));
                }
                let slot_addr = f.recv + wc.wr_id * u64::from(ml);
                if !e.data.is_empty()
                    && net.host(b).mem.bytes(slot_addr, e.data.len()) != &e.data[..]
                {
                    return Err(format!(
                        "seed {seed}: flow {fi}: SEND landed with wrong bytes"
                    ));
                }
                let sge = Sge {
                    addr: slot_addr,
                    length: ml,
                    lkey: f.lkey_b,
                };
                net.host_mut(b).qps[qb]
                    .post_recv(RecvWr {
                        wr_id: wc.wr_id,
                        sg_list: vec![sge],
                    })
                    .map_err(|e| format!("seed {seed}: repost: {e}"))?;
                reposted = true;
            }
            if reposted {
                net.kick(b);
            }
        }
        Ok(())
    }

    /// Runs to completion and verifies everything. Errors name the seed.
    pub fn run(mut self, net: &mut Network) -> Result<Report, String> {
        let total = self.cfg.ops_per_flow * self.flows.len();
        let seed = self.seed;
        let mut last_completion = net.now();
        while self.completed < total {
            self.post_more(net);
            let progressed = net.run_until(self.cfg.deadline, |n| {
                (0..n.host_count()).any(|h| !n.host(h).completions.is_empty())
            });
            if !progressed {
                return Err(format!(
                    "seed {seed}: stalled at {:?} with {}/{} completed (deadline {:?})",
                    net.now(),
                    self.completed,
                    total,
                    self.cfg.deadline
                ));
            }
            self.check_completions(net)?;
            last_completion = net.now();
        }
        for (fi, f) in self.flows.iter().enumerate() {
            if !f.recv_expect.is_empty() {
                return Err(format!(
                    "seed {seed}: flow {fi}: {} receives never completed",
                    f.recv_expect.len()
                ));
            }
            if net.host(f.b).mem.bytes(f.wtarget.0, f.model_write.len()) != &f.model_write[..] {
                return Err(format!(
                    "seed {seed}: flow {fi}: WRITE target differs from the model"
                ));
            }
            for (w, v) in f.model_atomic.iter().enumerate() {
                let got = u64::from_le_bytes(
                    net.host(f.b)
                        .mem
                        .bytes(f.atomics.0 + 8 * w as u64, 8)
                        .try_into()
                        .expect("8"),
                );
                if got != *v {
                    return Err(format!(
                        "seed {seed}: flow {fi}: atomic word {w} is {got:#x}, model {v:#x}"
                    ));
                }
            }
        }
        let mut stats = QpStats::default();
        let mut lost = 0;
        let mut icrc = 0;
        for h in 0..net.host_count() {
            for qp in &net.host(h).qps {
                stats += qp.stats();
            }
            lost += net.link_stats(h, true).lost + net.link_stats(h, false).lost;
            icrc += net.host(h).icrc_drops;
        }
        Ok(Report {
            completed: self.completed,
            payload_bytes: self.payload,
            elapsed_ns: last_completion.as_nanos(),
            stats,
            lost,
            icrc_drops: icrc,
            events: net.events_processed,
        })
    }
}

impl Flow {
    fn dst_slot(&self, slot: usize, ml: u32) -> u64 {
        self.dst + (slot as u64) * u64::from(ml)
    }
}

fn take_completions(net: &mut Network, h: usize, qp: usize) -> Vec<monel_rc::WorkCompletion> {
    let host = net.host_mut(h);
    let mut mine = Vec::new();
    host.completions.retain(|(q, wc)| {
        if *q == qp {
            mine.push(*wc);
            false
        } else {
            true
        }
    });
    mine
}
