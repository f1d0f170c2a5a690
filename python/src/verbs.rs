//! Verbs from Python: devices, protection domains, memory regions on Python buffers (numpy
//! arrays, tensors, bytearrays; registered in place, no copy), completion queues, RC queue
//! pairs, Monel's connection manager, and RDMA WRITE/READ/SEND/atomics with their work
//! completions. Thin wrappers over `monel-verbs`; every object keeps its context alive, so the
//! soft RNIC's progress thread outlives whatever still uses it.

use std::net::SocketAddr;
use std::time::Duration;

use monel_verbs::cm::{self, BufferInfo, CmConfig, Connection, Listener};
use monel_verbs::protect::PacketAuth;
use monel_verbs::{
    AccessFlags, CompletionQueue, ConnectParams, Context, ContextConfig, Device, Gid, Mtu,
    PortState, ProtectionDomain, Psn, QpCap, QpInitAttr, QpType, Qpn, QueuePair, RKey, RemoteAddr,
    RemoteQp, SendFlags, SendOp, SendWr, VerbsError as RsVerbsError, WcOpcode, WcStatus,
    WorkCompletion, random_psn,
};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::prelude::*;

use crate::{InvalidArgumentError, MonelError};

create_exception!(
    _monel,
    VerbsError,
    MonelError,
    "A verb failed; `verb` names it (as in libibverbs) and `kind` says why."
);

/// The Python exception for a verbs error, with `verb` and `kind` set.
fn verr(e: RsVerbsError) -> PyErr {
    use monel_verbs::ErrorKind as K;
    let kind = match &e.kind {
        K::InvalidArgument(_) => "invalid_argument",
        K::Modify(_) => "modify",
        K::Post(_) => "post",
        K::Busy(_) => "busy",
        K::NotFound(_) => "not_found",
        K::Unsupported(_) => "unsupported",
        K::Peer(_) => "peer",
        K::Io(_) => "io",
        K::Timeout(_) => "timeout",
        _ => "other",
    };
    let err = VerbsError::new_err(e.to_string());
    Python::attach(|py| {
        let v = err.value(py);
        let _ = v.setattr("verb", e.verb);
        let _ = v.setattr("kind", kind);
    });
    err
}

fn invalid(msg: impl Into<String>) -> PyErr {
    InvalidArgumentError::new_err(msg.into())
}

fn mtu_of(bytes: u32) -> PyResult<Mtu> {
    Mtu::from_bytes(bytes)
        .ok_or_else(|| invalid(format!("mtu {bytes}: want 256, 512, 1024, 2048 or 4096")))
}

fn timeout_of(seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        invalid(format!(
            "timeout {seconds}: want a non-negative number of seconds"
        ))
    })
}

/// `ibv_wc_status` names, as libibverbs' `ibv_wc_status_str` spells them in enum form.
fn status_name(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "success",
        WcStatus::LocLenErr => "loc_len_err",
        WcStatus::LocQpOpErr => "loc_qp_op_err",
        WcStatus::LocProtErr => "loc_prot_err",
        WcStatus::WrFlushErr => "wr_flush_err",
        WcStatus::BadRespErr => "bad_resp_err",
        WcStatus::LocAccessErr => "loc_access_err",
        WcStatus::RemInvReqErr => "rem_inv_req_err",
        WcStatus::RemAccessErr => "rem_access_err",
        WcStatus::RemOpErr => "rem_op_err",
        WcStatus::RetryExcErr => "retry_exc_err",
        WcStatus::RnrRetryExcErr => "rnr_retry_exc_err",
        WcStatus::FatalErr => "fatal_err",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

fn opcode_name(o: WcOpcode) -> &'static str {
    match o {
        WcOpcode::Send => "send",
        WcOpcode::RdmaWrite => "rdma_write",
        WcOpcode::RdmaRead => "rdma_read",
        WcOpcode::CompSwap => "comp_swap",
        WcOpcode::FetchAdd => "fetch_add",
        WcOpcode::Recv => "recv",
        WcOpcode::RecvRdmaWithImm => "recv_rdma_with_imm",
    }
}

fn access_of(bits: u32) -> PyResult<AccessFlags> {
    if bits & !AccessFlags::ALL.0 != 0 {
        return Err(invalid(format!(
            "access {bits:#x}: want ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ \
             and ACCESS_REMOTE_ATOMIC or'd together"
        )));
    }
    Ok(AccessFlags(bits))
}

/// A soft RoCE device (`ibv_device` plus what `ibv_query_port` and `ibv_query_gid` tell).
#[pyclass(name = "Device", module = "monel._monel", frozen)]
pub struct PyDevice {
    dev: Device,
}

#[pymethods]
impl PyDevice {
    /// Device name (`monel_<interface>`).
    #[getter]
    fn name(&self) -> String {
        self.dev.name.clone()
    }
    /// The IP interface it sits on.
    #[getter]
    fn ifname(&self) -> String {
        self.dev.ifname.clone()
    }
    /// The GID table, as IPv6 text (IPv4 addresses mapped as `::ffff:a.b.c.d`).
    #[getter]
    fn gids(&self) -> Vec<String> {
        self.dev.gids.iter().map(|g| g.gid.to_string()).collect()
    }
    /// The IP address of each GID.
    #[getter]
    fn ips(&self) -> Vec<String> {
        self.dev
            .gids
            .iter()
            .map(|g| g.gid.to_ip().to_string())
            .collect()
    }
    /// `"active"` or `"down"`.
    #[getter]
    fn state(&self) -> &'static str {
        match self.dev.port_attr().state {
            PortState::Active => "active",
            PortState::Down => "down",
        }
    }
    /// The largest RoCE MTU the link carries, in bytes (rxe's rule).
    #[getter]
    fn active_mtu(&self) -> u32 {
        self.dev.port_attr().active_mtu.bytes()
    }
    /// The interface's IP MTU.
    #[getter]
    fn link_mtu(&self) -> u32 {
        self.dev.link_mtu
    }
    /// Opens the device (`ibv_open_device`): binds its UDP sockets on `udp_port` (4791, as
    /// RoCEv2; 0 picks a free port, which Monel's connection manager tells the peer) and starts
    /// its progress thread.
    #[pyo3(signature = (udp_port=4791, busy_poll=false, gso=true))]
    fn open(
        &self,
        py: Python<'_>,
        udp_port: u16,
        busy_poll: bool,
        gso: bool,
    ) -> PyResult<PyContext> {
        let cfg = ContextConfig {
            udp_port,
            busy_poll,
            gso,
            ..ContextConfig::default()
        };
        let ctx = py.detach(|| Context::open(&self.dev, cfg)).map_err(verr)?;
        Ok(PyContext { ctx })
    }
    fn __repr__(&self) -> String {
        format!("Device({:?}, gids={:?})", self.dev.name, self.gids())
    }
}

/// Every RDMA device of this host: the kernel's RoCE ports (through rdma-core), then one
/// soft device per IP interface with an address.
#[pyfunction]
pub(crate) fn device_list() -> PyResult<Vec<PyDevice>> {
    Ok(monel_verbs::devices()
        .map_err(verr)?
        .into_iter()
        .map(|dev| PyDevice { dev })
        .collect())
}

/// A device bound to one IP address, or named by interface or device name.
#[pyfunction]
pub(crate) fn get_device(address_or_name: &str) -> PyResult<PyDevice> {
    Ok(PyDevice {
        dev: Device::from_arg(address_or_name).map_err(verr)?,
    })
}

/// An open device (`ibv_context`).
#[pyclass(name = "Context", module = "monel._monel", frozen)]
pub struct PyContext {
    ctx: Context,
}

#[pymethods]
impl PyContext {
    /// The device's name.
    #[getter]
    fn device_name(&self) -> String {
        self.ctx.device().name.clone()
    }
    /// The UDP port its sockets are bound to.
    #[getter]
    fn udp_port(&self) -> PyResult<u16> {
        Ok(self.ctx.local_addr(0).map_err(verr)?.port())
    }
    /// A new protection domain (`ibv_alloc_pd`).
    fn alloc_pd(slf: Py<Self>, py: Python<'_>) -> PyProtectionDomain {
        let pd = slf.get().ctx.alloc_pd();
        let _ = py;
        PyProtectionDomain { pd, ctx: slf }
    }
    /// A new completion queue with room for `cqe` completions (`ibv_create_cq`).
    #[pyo3(signature = (cqe=256))]
    fn create_cq(slf: Py<Self>, cqe: usize) -> PyResult<PyCompletionQueue> {
        let cq = slf.get().ctx.create_cq(cqe).map_err(verr)?;
        Ok(PyCompletionQueue { cq, _ctx: slf })
    }
    /// The device's counters (packets, bytes, ICRC drops, retransmissions, ...), by name.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.ctx.counters().rows().to_vec()
    }
}

/// A protection domain (`ibv_pd`).
#[pyclass(name = "ProtectionDomain", module = "monel._monel", frozen)]
pub struct PyProtectionDomain {
    pd: ProtectionDomain,
    ctx: Py<PyContext>,
}

#[pymethods]
impl PyProtectionDomain {
    /// Registers a contiguous numpy array, CPU tensor or buffer in place (`ibv_reg_mr`). The
    /// region keeps the buffer alive; as with any RDMA memory, do not touch it while an
    /// operation on it is in flight.
    #[pyo3(signature = (buffer, access))]
    fn reg_mr(&self, buffer: &Bound<'_, PyAny>, access: u32) -> PyResult<PyMemoryRegion> {
        let access = access_of(access)?;
        // A flat byte view of numpy arrays, tensors and buffers of any element type.
        let view = buffer
            .py()
            .import("monel.verbs")?
            .getattr("_byte_view")?
            .call1((buffer,))?;
        let buf = PyBuffer::<u8>::get(&view)?;
        if !buf.is_c_contiguous() {
            return Err(invalid("reg_mr: the buffer is not contiguous"));
        }
        let writes =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if buf.readonly() && (access & writes) != AccessFlags::NONE {
            return Err(invalid(
                "reg_mr: the buffer is read-only; register it with REMOTE_READ only",
            ));
        }
        // SAFETY: the region below is stored next to the PyBuffer that pins the exporter's
        // memory (the exporter cannot free or resize it while the buffer view exists), and
        // `PyMemoryRegion`'s fields drop the region (deregistering it under the device lock,
        // after which the RNIC never touches it) before the view. Writes happen only where the
        // buffer is writable (checked above; the RNIC checks access flags on every access).
        #[allow(unsafe_code)]
        let mr = unsafe {
            self.pd
                .reg_mr_raw(buf.buf_ptr().cast::<u8>(), buf.len_bytes(), access)
        }
        .map_err(verr)?;
        Ok(PyMemoryRegion {
            mr: std::sync::Mutex::new(Some(mr)),
            buf: std::sync::Mutex::new(Some(buf)),
        })
    }

    /// A new queue pair in RESET (`ibv_create_qp`); RC only.
    #[pyo3(signature = (send_cq, recv_cq=None, max_send_wr=128, max_recv_wr=512, max_inline_data=256, sq_sig_all=false))]
    #[allow(clippy::too_many_arguments)]
    fn create_qp(
        &self,
        py: Python<'_>,
        send_cq: &PyCompletionQueue,
        recv_cq: Option<&PyCompletionQueue>,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_inline_data: u32,
        sq_sig_all: bool,
    ) -> PyResult<PyQueuePair> {
        let qp = self
            .pd
            .create_qp(&QpInitAttr {
                send_cq: &send_cq.cq,
                recv_cq: &recv_cq.unwrap_or(send_cq).cq,
                cap: QpCap {
                    max_send_wr,
                    max_recv_wr,
                    max_inline_data,
                    ..QpCap::default()
                },
                qp_type: QpType::Rc,
                sq_sig_all,
                srq: None,
            })
            .map_err(verr)?;
        Ok(PyQueuePair {
            qp,
            psn: random_psn(),
            _ctx: self.ctx.clone_ref(py),
        })
    }
}

/// A registered memory region (`ibv_mr`) over a Python buffer.
#[pyclass(name = "MemoryRegion", module = "monel._monel", frozen)]
pub struct PyMemoryRegion {
    // Field order matters: the region deregisters before the buffer view is released.
    mr: std::sync::Mutex<Option<monel_verbs::MemoryRegion>>,
    buf: std::sync::Mutex<Option<PyBuffer<u8>>>,
}

impl PyMemoryRegion {
    fn with<R>(&self, f: impl FnOnce(&monel_verbs::MemoryRegion) -> PyResult<R>) -> PyResult<R> {
        let g = self
            .mr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match g.as_ref() {
            Some(mr) => f(mr),
            None => Err(invalid("the memory region was deregistered")),
        }
    }
    /// The SGE for `length` bytes at `offset` (the rest of the region when `length` is None).
    fn sge(&self, offset: usize, length: Option<usize>) -> PyResult<monel_verbs::Sge> {
        self.with(|mr| {
            let len = length.unwrap_or(mr.len().saturating_sub(offset));
            if offset.checked_add(len).is_none_or(|e| e > mr.len()) {
                return Err(invalid(format!(
                    "{len} bytes at offset {offset} exceed the {}-byte region",
                    mr.len()
                )));
            }
            Ok(mr.sge(offset, len))
        })
    }
}

#[pymethods]
impl PyMemoryRegion {
    /// The region's address (what a peer names in RDMA operations).
    #[getter]
    fn addr(&self) -> PyResult<u64> {
        self.with(|mr| Ok(mr.addr()))
    }
    /// Its length in bytes.
    #[getter]
    fn length(&self) -> PyResult<usize> {
        self.with(|mr| Ok(mr.len()))
    }
    /// Local key.
    #[getter]
    fn lkey(&self) -> PyResult<u32> {
        self.with(|mr| Ok(mr.lkey().0))
    }
    /// Remote key (random, never sequential).
    #[getter]
    fn rkey(&self) -> PyResult<u32> {
        self.with(|mr| Ok(mr.rkey().0))
    }
    /// Access flags it was registered with.
    #[getter]
    fn access(&self) -> PyResult<u32> {
        self.with(|mr| Ok(mr.access().0))
    }
    /// Deregisters it (`ibv_dereg_mr`): from now on the keys are invalid, peers using them get
    /// access errors, and the buffer is released.
    fn dereg(&self) {
        let mr = self
            .mr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(mr);
        let buf = self
            .buf
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(buf);
    }
}

/// A completion queue (`ibv_cq`).
#[pyclass(name = "CompletionQueue", module = "monel._monel", frozen)]
pub struct PyCompletionQueue {
    cq: CompletionQueue,
    _ctx: Py<PyContext>,
}

#[pymethods]
impl PyCompletionQueue {
    /// Up to `max` completions, without waiting (`ibv_poll_cq`).
    #[pyo3(signature = (max=16))]
    fn poll(&self, max: usize) -> Vec<PyWorkCompletion> {
        self.cq
            .poll(max)
            .into_iter()
            .map(PyWorkCompletion::from)
            .collect()
    }
    /// Waits, without the GIL, until `n` completions arrived or `timeout` seconds passed;
    /// returns those that did (fewer than `n` on a timeout).
    #[pyo3(signature = (n=1, timeout=10.0))]
    fn wait(&self, py: Python<'_>, n: usize, timeout: f64) -> PyResult<Vec<PyWorkCompletion>> {
        let t = timeout_of(timeout)?;
        let wcs = py.detach(|| self.cq.poll_n(n, t));
        Ok(wcs.into_iter().map(PyWorkCompletion::from).collect())
    }
    /// How many completions it holds at most.
    #[getter]
    fn capacity(&self) -> usize {
        self.cq.capacity()
    }
    /// True once it overflowed and lost a completion.
    #[getter]
    fn overflowed(&self) -> bool {
        self.cq.overflowed()
    }
}

/// A work completion (`ibv_wc`).
#[pyclass(name = "WorkCompletion", module = "monel._monel", frozen, get_all)]
pub struct PyWorkCompletion {
    /// The work request's id.
    wr_id: u64,
    /// `ibv_wc_status` number (0 is success).
    status: u32,
    /// The status by name: `success`, `rem_access_err`, `wr_flush_err`, ...
    status_name: &'static str,
    /// What completed: `send`, `rdma_write`, `rdma_read`, `comp_swap`, `fetch_add`, `recv`,
    /// `recv_rdma_with_imm`.
    opcode: &'static str,
    /// Bytes received (receives) or read.
    byte_len: u32,
    /// Immediate data, if the message carried some.
    imm: Option<u32>,
    /// The local QP.
    qp_num: u32,
    /// The sending QP (receives).
    src_qp: u32,
}

impl From<WorkCompletion> for PyWorkCompletion {
    fn from(wc: WorkCompletion) -> Self {
        Self {
            wr_id: wc.wr_id,
            status: wc.status as u32,
            status_name: status_name(wc.status),
            opcode: opcode_name(wc.opcode),
            byte_len: wc.byte_len,
            imm: wc.imm,
            qp_num: wc.qp_num.value(),
            src_qp: wc.src_qp.value(),
        }
    }
}

#[pymethods]
impl PyWorkCompletion {
    /// True when the work request succeeded.
    #[getter]
    fn ok(&self) -> bool {
        self.status == 0
    }
    fn __repr__(&self) -> String {
        format!(
            "WorkCompletion(wr_id={}, status={}, opcode={}, byte_len={}, imm={})",
            self.wr_id,
            self.status_name,
            self.opcode,
            self.byte_len,
            self.imm.map_or("None".to_string(), |i| i.to_string())
        )
    }
}

/// An RC queue pair (`ibv_qp`).
#[pyclass(name = "QueuePair", module = "monel._monel", frozen)]
pub struct PyQueuePair {
    qp: QueuePair,
    /// The PSN this side starts with when connected by hand.
    psn: Psn,
    _ctx: Py<PyContext>,
}

impl PyQueuePair {
    fn post(
        &self,
        wr_id: u64,
        op: SendOp,
        sg: Vec<monel_verbs::Sge>,
        signaled: bool,
    ) -> PyResult<()> {
        self.qp
            .post_send(SendWr {
                wr_id,
                op,
                sg_list: sg,
                flags: SendFlags {
                    signaled,
                    ..SendFlags::default()
                },
            })
            .map_err(verr)
    }
}

fn remote(addr: u64, rkey: u32) -> RemoteAddr {
    RemoteAddr {
        addr,
        rkey: RKey(rkey),
    }
}

#[pymethods]
impl PyQueuePair {
    /// The QP number.
    #[getter]
    fn qp_num(&self) -> u32 {
        self.qp.qp_num().value()
    }
    /// The state: `reset`, `init`, `rtr`, `rts`, `sqd`, `sqe` or `err` (`ibv_query_qp`).
    #[getter]
    fn state(&self) -> PyResult<String> {
        let (s, _) = self.qp.query().map_err(verr)?;
        Ok(format!("{s:?}").to_lowercase())
    }
    /// What a peer needs to connect to this QP by hand: qpn, psn, gid, udp_port.
    fn info(&self) -> PyResult<(u32, u32, String, u16)> {
        let gid = self.qp.device().gid(0).map_err(verr)?.gid;
        Ok((
            self.qp_num(),
            self.psn.value(),
            gid.to_string(),
            self.qp.local_udp_port(0).map_err(verr)?,
        ))
    }
    /// Brings the QP from RESET to RTS towards a peer whose `info()` arrived out of band.
    #[pyo3(signature = (qpn, psn, gid, udp_port=None, mtu=1024, access=None, ack_timeout=14, retry_cnt=7))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        &self,
        py: Python<'_>,
        qpn: u32,
        psn: u32,
        gid: &str,
        udp_port: Option<u16>,
        mtu: u32,
        access: Option<u32>,
        ack_timeout: u8,
        retry_cnt: u8,
    ) -> PyResult<()> {
        let ip: std::net::IpAddr = gid
            .parse()
            .map_err(|_| invalid(format!("gid {gid:?}: not an IPv4 or IPv6 address")))?;
        if !(2..=0xff_fffe).contains(&qpn) || psn > 0xff_ffff {
            return Err(invalid(format!(
                "qpn {qpn:#x} or psn {psn:#x} out of range"
            )));
        }
        let mut p = ConnectParams {
            local_psn: self.psn,
            mtu: mtu_of(mtu)?,
            udp_port,
            ..ConnectParams::default()
        };
        if let Some(a) = access {
            p.access = access_of(a)?;
        }
        Retry::new(ack_timeout, retry_cnt)?.apply(&mut p);
        let r = RemoteQp {
            qpn: Qpn::new(qpn),
            psn: Psn::new(psn),
            gid: Gid::from_ip(ip),
        };
        py.detach(|| self.qp.connect(&r, &p)).map_err(verr)
    }
    /// Posts a receive for `length` bytes of `mr` at `offset` (`ibv_post_recv`).
    #[pyo3(signature = (mr, offset=0, length=None, wr_id=0))]
    fn post_recv(
        &self,
        mr: &PyMemoryRegion,
        offset: usize,
        length: Option<usize>,
        wr_id: u64,
    ) -> PyResult<()> {
        let sge = mr.sge(offset, length)?;
        self.qp
            .post_recv(monel_verbs::RecvWr {
                wr_id,
                sg_list: vec![sge],
            })
            .map_err(verr)
    }
    /// Posts a SEND (with immediate data when `imm` is given).
    #[pyo3(signature = (mr, offset=0, length=None, wr_id=0, imm=None, signaled=true))]
    fn post_send(
        &self,
        mr: &PyMemoryRegion,
        offset: usize,
        length: Option<usize>,
        wr_id: u64,
        imm: Option<u32>,
        signaled: bool,
    ) -> PyResult<()> {
        let op = imm.map_or(SendOp::Send, SendOp::SendImm);
        self.post(wr_id, op, vec![mr.sge(offset, length)?], signaled)
    }
    /// Posts an RDMA WRITE of `mr[offset:offset+length]` to the peer's `remote_addr` under
    /// `rkey` (WRITE with immediate when `imm` is given: it consumes a receive there).
    #[pyo3(signature = (mr, remote_addr, rkey, offset=0, length=None, wr_id=0, imm=None, signaled=true))]
    #[allow(clippy::too_many_arguments)]
    fn post_write(
        &self,
        mr: &PyMemoryRegion,
        remote_addr: u64,
        rkey: u32,
        offset: usize,
        length: Option<usize>,
        wr_id: u64,
        imm: Option<u32>,
        signaled: bool,
    ) -> PyResult<()> {
        let r = remote(remote_addr, rkey);
        let op = match imm {
            Some(i) => SendOp::WriteImm(r, i),
            None => SendOp::Write(r),
        };
        self.post(wr_id, op, vec![mr.sge(offset, length)?], signaled)
    }
    /// Posts an RDMA READ of the peer's `remote_addr` under `rkey` into `mr` at `offset`.
    #[pyo3(signature = (mr, remote_addr, rkey, offset=0, length=None, wr_id=0, signaled=true))]
    #[allow(clippy::too_many_arguments)]
    fn post_read(
        &self,
        mr: &PyMemoryRegion,
        remote_addr: u64,
        rkey: u32,
        offset: usize,
        length: Option<usize>,
        wr_id: u64,
        signaled: bool,
    ) -> PyResult<()> {
        let op = SendOp::Read(remote(remote_addr, rkey));
        self.post(wr_id, op, vec![mr.sge(offset, length)?], signaled)
    }
    /// Posts a 64-bit fetch-and-add on the peer's `remote_addr`; the old value lands in the
    /// 8 bytes of `mr` at `offset`.
    #[pyo3(signature = (mr, remote_addr, rkey, add, offset=0, wr_id=0))]
    fn post_fetch_add(
        &self,
        mr: &PyMemoryRegion,
        remote_addr: u64,
        rkey: u32,
        add: u64,
        offset: usize,
        wr_id: u64,
    ) -> PyResult<()> {
        let op = SendOp::FetchAdd {
            remote: remote(remote_addr, rkey),
            add,
        };
        self.post(wr_id, op, vec![mr.sge(offset, Some(8))?], true)
    }
    /// Posts a 64-bit compare-and-swap on the peer's `remote_addr`; the old value lands in
    /// the 8 bytes of `mr` at `offset`.
    #[pyo3(signature = (mr, remote_addr, rkey, compare, swap, offset=0, wr_id=0))]
    #[allow(clippy::too_many_arguments)]
    fn post_compare_swap(
        &self,
        mr: &PyMemoryRegion,
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
        offset: usize,
        wr_id: u64,
    ) -> PyResult<()> {
        let op = SendOp::CompareSwap {
            remote: remote(remote_addr, rkey),
            compare,
            swap,
        };
        self.post(wr_id, op, vec![mr.sge(offset, Some(8))?], true)
    }
    /// This QP's counters by name (packets, retransmissions, NAKs, access errors, ...).
    fn stats(&self) -> PyResult<Vec<(&'static str, u64)>> {
        let s = self.qp.stats().map_err(verr)?;
        Ok(vec![
            ("tx_packets", s.tx_packets),
            ("tx_bytes", s.tx_bytes),
            ("rx_packets", s.rx_packets),
            ("retransmitted_packets", s.retransmitted_packets),
            ("timeouts", s.timeouts),
            ("seq_naks_sent", s.seq_naks_sent),
            ("seq_naks_received", s.seq_naks_received),
            ("rnr_naks_sent", s.rnr_naks_sent),
            ("rnr_naks_received", s.rnr_naks_received),
            ("duplicate_requests", s.duplicate_requests),
            ("out_of_sequence", s.out_of_sequence),
            ("access_errors", s.access_errors),
        ])
    }
}

/// A connection made by Monel's connection manager: the peer's QP, the buffer it offered,
/// and the setup stream (for `barrier`).
#[pyclass(name = "Connection", module = "monel._monel")]
pub struct PyConnection {
    conn: Connection,
}

#[pymethods]
impl PyConnection {
    /// The peer's QP number.
    #[getter]
    fn remote_qpn(&self) -> u32 {
        self.conn.remote.qpn.value()
    }
    /// The peer's GID.
    #[getter]
    fn remote_gid(&self) -> String {
        self.conn.remote.gid.to_string()
    }
    /// The buffer the peer offered: (addr, rkey, length), or None.
    #[getter]
    fn remote_buffer(&self) -> Option<(u64, u32, u64)> {
        self.conn.remote_buf.map(|b| (b.addr, b.rkey.0, b.len))
    }
    /// The negotiated path MTU in bytes.
    #[getter]
    fn mtu(&self) -> u32 {
        self.conn.mtu.bytes()
    }
    /// The negotiated packet protection: `"none"`, `"mac"` or `"encrypt"`.
    #[getter]
    fn auth(&self) -> String {
        self.conn.auth.to_string()
    }
    /// Waits, without the GIL, until the peer calls `barrier` too.
    fn barrier(&mut self, py: Python<'_>) -> PyResult<()> {
        let c = &mut self.conn;
        py.detach(|| c.barrier()).map_err(verr)
    }
}

/// How a connection retransmits: the ACK timeout exponent (4.096 µs << n; 14 is 67 ms) and
/// the retry count (7 retries forever, as rxe and the rdma-core tools use it).
#[derive(Clone, Copy)]
struct Retry {
    ack_timeout: u8,
    retry_cnt: u8,
}

impl Retry {
    fn new(ack_timeout: u8, retry_cnt: u8) -> PyResult<Self> {
        if !(1..=31).contains(&ack_timeout) || retry_cnt > 7 {
            return Err(invalid(format!(
                "ack_timeout {ack_timeout} (want 1..=31) or retry_cnt {retry_cnt} (want 0..=7) out of range"
            )));
        }
        Ok(Self {
            ack_timeout,
            retry_cnt,
        })
    }
    fn apply(self, p: &mut ConnectParams) {
        p.timeout = self.ack_timeout;
        p.retry_cnt = self.retry_cnt;
    }
}

/// The connection manager's settings from the Python arguments. `auth` (`"none"`, `"mac"`,
/// `"encrypt"`) defaults to `"mac"` with a secret and `"none"` without.
fn cm_config(
    secret: Option<&[u8]>,
    auth: Option<&str>,
    timeout: f64,
    mtu: u32,
    retry: Retry,
) -> PyResult<CmConfig> {
    let auth = match auth {
        Some(a) => PacketAuth::parse(a)
            .ok_or_else(|| invalid(format!("auth {a:?}: want none, mac or encrypt")))?,
        None if secret.is_some() => PacketAuth::Mac,
        None => PacketAuth::None,
    };
    if auth != PacketAuth::None && secret.is_none() {
        return Err(invalid(format!(
            "auth {auth} needs a shared secret (secret=...)"
        )));
    }
    let mut cfg = CmConfig {
        secret: secret.map(<[u8]>::to_vec),
        auth,
        mtu: mtu_of(mtu)?,
        timeout: timeout_of(timeout)?,
        ..CmConfig::default()
    };
    retry.apply(&mut cfg.params);
    Ok(cfg)
}

fn offer(mr: Option<&PyMemoryRegion>) -> PyResult<Option<BufferInfo>> {
    mr.map(|m| {
        m.with(|r| {
            Ok(BufferInfo {
                addr: r.addr(),
                rkey: r.rkey(),
                len: r.len() as u64,
            })
        })
    })
    .transpose()
}

fn sockaddr(address: &str) -> PyResult<SocketAddr> {
    address
        .parse()
        .map_err(|_| invalid(format!("address {address:?}: want IP:PORT")))
}

/// A listening connection manager (`rdma_listen`).
#[pyclass(name = "Listener", module = "monel._monel", frozen)]
pub struct PyListener {
    l: Listener,
}

#[pymethods]
impl PyListener {
    /// Listens on `address` (`"IP:PORT"`, port 0 for any free one).
    #[new]
    fn new(address: &str) -> PyResult<Self> {
        Ok(Self {
            l: Listener::bind(sockaddr(address)?).map_err(verr)?,
        })
    }
    /// The bound `"IP:PORT"`.
    #[getter]
    fn address(&self) -> PyResult<String> {
        Ok(self.l.local_addr().map_err(verr)?.to_string())
    }
    /// Accepts one peer for `qp` (in RESET), offering `mr` for its RDMA; brings `qp` to RTS.
    /// Serves connections until one completes the handshake, or `wait` seconds pass (then a
    /// timeout error): a garbled, silent or unauthenticated connection is dropped, logged and
    /// counted (`dropped`), never the end of the listener. With a `secret`, the peer must
    /// prove it holds the same one; `auth` asks for packet protection (see `connect`).
    /// `ack_timeout` and `retry_cnt` set how the QP retransmits (7: forever).
    #[pyo3(signature = (qp, mr=None, secret=None, timeout=10.0, mtu=4096, ack_timeout=14, retry_cnt=7, auth=None, wait=None))]
    #[allow(clippy::too_many_arguments)]
    fn accept(
        &self,
        py: Python<'_>,
        qp: &PyQueuePair,
        mr: Option<&PyMemoryRegion>,
        secret: Option<&[u8]>,
        timeout: f64,
        mtu: u32,
        ack_timeout: u8,
        retry_cnt: u8,
        auth: Option<&str>,
        wait: Option<f64>,
    ) -> PyResult<PyConnection> {
        let cfg = cm_config(
            secret,
            auth,
            timeout,
            mtu,
            Retry::new(ack_timeout, retry_cnt)?,
        )?;
        let wait = wait.map(timeout_of).transpose()?;
        let buf = offer(mr)?;
        let conn = py
            .detach(|| self.l.serve(&qp.qp, buf, &cfg, wait))
            .map_err(verr)?;
        Ok(PyConnection { conn })
    }
    /// Connections `accept` dropped so far (garbled, silent, unauthenticated).
    #[getter]
    fn dropped(&self) -> usize {
        self.l.dropped()
    }
}

/// Connects `qp` (in RESET) to a listening peer at `address` (`rdma_connect`), offering `mr`;
/// brings `qp` to RTS. `auth` asks for packet protection: `"mac"` (a tag on every packet,
/// the default with a `secret`), `"encrypt"` (AES-GCM) or `"none"`; the connection takes the
/// stronger side's (`Connection.auth`). `ack_timeout` and `retry_cnt` set how the QP
/// retransmits (7: forever).
#[pyfunction]
#[pyo3(signature = (address, qp, mr=None, secret=None, timeout=10.0, mtu=4096, ack_timeout=14, retry_cnt=7, auth=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect(
    py: Python<'_>,
    address: &str,
    qp: &PyQueuePair,
    mr: Option<&PyMemoryRegion>,
    secret: Option<&[u8]>,
    timeout: f64,
    mtu: u32,
    ack_timeout: u8,
    retry_cnt: u8,
    auth: Option<&str>,
) -> PyResult<PyConnection> {
    let addr = sockaddr(address)?;
    let cfg = cm_config(
        secret,
        auth,
        timeout,
        mtu,
        Retry::new(ack_timeout, retry_cnt)?,
    )?;
    let buf = offer(mr)?;
    let conn = py
        .detach(|| cm::connect(addr, &qp.qp, buf, &cfg))
        .map_err(verr)?;
    Ok(PyConnection { conn })
}

/// Adds the verbs classes and functions to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyDevice>()?;
    m.add_class::<PyContext>()?;
    m.add_class::<PyProtectionDomain>()?;
    m.add_class::<PyMemoryRegion>()?;
    m.add_class::<PyCompletionQueue>()?;
    m.add_class::<PyWorkCompletion>()?;
    m.add_class::<PyQueuePair>()?;
    m.add_class::<PyConnection>()?;
    m.add_class::<PyListener>()?;
    m.add_function(wrap_pyfunction!(device_list, m)?)?;
    m.add_function(wrap_pyfunction!(get_device, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add("VerbsError", py.get_type::<VerbsError>())?;
    m.add("ACCESS_LOCAL_WRITE", AccessFlags::LOCAL_WRITE.0)?;
    m.add("ACCESS_REMOTE_WRITE", AccessFlags::REMOTE_WRITE.0)?;
    m.add("ACCESS_REMOTE_READ", AccessFlags::REMOTE_READ.0)?;
    m.add("ACCESS_REMOTE_ATOMIC", AccessFlags::REMOTE_ATOMIC.0)?;
    Ok(())
}
