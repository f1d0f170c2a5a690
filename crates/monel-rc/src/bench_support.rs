//! A two-QP loop for measuring the engine's per-packet cost (benches and the callgrind
//! example). Not part of the API's promises.

use monel_wire::{LKey, Psn, Qpn, RKey};

use crate::memory::{Access, AccessFlags, AtomicOp, Key, MemError, MemoryAccess};
use crate::{
    CongestionConfig, Instant, Mtu, QpAttr, QpCaps, RcQp, RemoteAddr, SendFlags, SendOp, SendWr,
    Sge,
};

/// Memory that checks every access like a real one but moves no bytes, so measurements
/// exclude the payload copy.
#[derive(Debug, Default)]
pub struct NullMemory;

impl MemoryAccess for NullMemory {
    fn check(&self, _: Key, addr: u64, len: u64, _: Access) -> Result<(), MemError> {
        if addr.checked_add(len).is_some_and(|e| e <= 1 << 40) {
            Ok(())
        } else {
            Err(MemError::OutOfBounds)
        }
    }
    fn read(&self, key: Key, addr: u64, out: &mut [u8], a: Access) -> Result<(), MemError> {
        self.check(key, addr, out.len() as u64, a)
    }
    fn write(&mut self, key: Key, addr: u64, data: &[u8], a: Access) -> Result<(), MemError> {
        self.check(key, addr, data.len() as u64, a)
    }
    fn atomic(&mut self, _: RKey, _: u64, _: AtomicOp) -> Result<u64, MemError> {
        Ok(0)
    }
    fn invalidate(&mut self, _: RKey) -> Result<(), MemError> {
        Ok(())
    }
}

/// Requester and responder QPs wired back to back, streaming one long RDMA WRITE at 4 KiB
/// MTU.
#[derive(Debug)]
pub struct EngineLoop {
    req: RcQp,
    resp: RcQp,
    mem: NullMemory,
    buf: Vec<u8>,
    now: Instant,
    wr_id: u64,
}

fn up(qp: &mut RcQp, remote: u32) {
    let a = QpAttr {
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        path_mtu: Mtu::Mtu4096,
        dest_qp_num: Qpn::new(remote),
        rq_psn: Psn::new(0),
        sq_psn: Psn::new(0),
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        ..Default::default()
    };
    let _ = qp.bring_up(&a);
}

impl Default for EngineLoop {
    fn default() -> Self {
        Self::new()
    }
}

impl EngineLoop {
    /// Two connected QPs.
    pub fn new() -> Self {
        let mut req = RcQp::new(Qpn::new(1 << 8), QpCaps::default(), CongestionConfig::None);
        let mut resp = RcQp::new(Qpn::new(2 << 8), QpCaps::default(), CongestionConfig::None);
        up(&mut req, 2 << 8);
        up(&mut resp, 1 << 8);
        Self {
            req,
            resp,
            mem: NullMemory,
            buf: vec![0; 8192],
            now: Instant::ZERO,
            wr_id: 0,
        }
    }

    fn post(&mut self) {
        self.wr_id += 1;
        let wr = SendWr {
            wr_id: self.wr_id,
            op: SendOp::Write(RemoteAddr {
                addr: 0,
                rkey: RKey(1),
            }),
            sg_list: vec![Sge {
                addr: 0,
                length: 1 << 30,
                lkey: LKey(1),
            }],
            flags: SendFlags::default(),
        };
        let _ = self.req.post_send(wr);
    }

    /// Moves `n` data packets through requester and responder (and their ACKs back).
    /// Returns the data packets delivered.
    pub fn run(&mut self, n: u64) -> u64 {
        let mut delivered = 0;
        while delivered < n {
            let Some(t) = self.req.poll_transmit(self.now, &mut self.buf, &self.mem) else {
                self.post();
                continue;
            };
            self.resp
                .handle_packet(self.now, &self.buf[..t.len], false, &mut self.mem);
            delivered += 1;
            while let Some(a) = self.resp.poll_transmit(self.now, &mut self.buf, &self.mem) {
                self.req
                    .handle_packet(self.now, &self.buf[..a.len], false, &mut self.mem);
            }
            while self.req.poll_completion().is_some() {}
            self.now = Instant::from_nanos(self.now.as_nanos() + 330);
        }
        delivered
    }
}
