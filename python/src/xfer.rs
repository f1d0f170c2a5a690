//! The transfer engine from Python: an agent over `monel-xfer`, its segments registered in
//! place from numpy arrays, CPU tensors and writable buffers (or allocated by the agent),
//! batched READ/WRITE with per-descriptor outcomes, and notifications. Errors are typed:
//! each `monel-xfer` error has an exception class of its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use monel_verbs::Device;
use monel_xfer::{
    Agent, AgentConfig, BatchId, Desc, DescState, Op, Registry, Transport, XferError as RsXferError,
};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{InvalidArgumentError, MonelError, PeerLostError};

create_exception!(
    _monel,
    XferError,
    MonelError,
    "A transfer-engine error (a segment, a descriptor, a batch or a peer)."
);
create_exception!(
    _monel,
    UnknownSegmentError,
    XferError,
    "No segment of this name, here or among what the peer published."
);
create_exception!(
    _monel,
    OutOfRangeError,
    XferError,
    "A range that does not lie inside one buffer of the segment."
);
create_exception!(
    _monel,
    XferTimeoutError,
    XferError,
    "A batch or a connection did not finish in time."
);
create_exception!(
    _monel,
    DuplicateNotificationError,
    XferError,
    "A notification the receiver already had (same sender, same or older number)."
);

/// The Python exception for a transfer-engine error: a lost peer is a `PeerLostError` (as
/// in the collectives), a bad count, name or batch number an `InvalidArgumentError`, the
/// rest an `XferError` (or a subclass naming what failed).
pub(crate) fn xerr(e: &RsXferError) -> PyErr {
    let msg = e.to_string();
    match e {
        RsXferError::UnknownSegment(_) => UnknownSegmentError::new_err(msg),
        RsXferError::OutOfRange { .. } => OutOfRangeError::new_err(msg),
        RsXferError::Timeout(_) => XferTimeoutError::new_err(msg),
        RsXferError::DuplicateNotification { .. } => DuplicateNotificationError::new_err(msg),
        RsXferError::PeerLost(_) | RsXferError::UnknownPeer(_) => PeerLostError::new_err(msg),
        RsXferError::TooLarge(_) | RsXferError::Duplicate(_) | RsXferError::UnknownBatch(_) => {
            InvalidArgumentError::new_err(msg)
        }
        _ => XferError::new_err(msg),
    }
}

fn invalid(msg: impl Into<String>) -> PyErr {
    InvalidArgumentError::new_err(msg.into())
}

fn seconds(t: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(t).map_err(|_| invalid(format!("timeout {t}: want seconds >= 0")))
}

/// An agent: segments, peers, batches, notifications.
#[pyclass(name = "XferAgent", module = "monel._monel", frozen)]
pub struct PyAgent {
    // Field order matters: the agent (and every registration) goes before the buffers it
    // registered in place are released.
    agent: Agent,
    pinned: Mutex<HashMap<String, PyBuffer<u8>>>,
}

#[pymethods]
impl PyAgent {
    /// An agent named `name` on `device` (an IP address, an interface or an RDMA device
    /// name), listening for peers on `listen` ("ip:port"; port 0 picks one). `secret` is
    /// the job's: every peer must prove it, and packets are tagged with keys from it.
    /// `transport`: "auto" (RDMA where it works, else TCP), "rdma" or "tcp". With `etcd`
    /// (an endpoint) the agent registers its name in job `job` and finds others by theirs.
    #[new]
    #[pyo3(signature = (name, device, listen, secret=None, udp_port=4791, timeout=10.0, transport="auto", etcd=None, job="default"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: &str,
        device: &str,
        listen: &str,
        secret: Option<Vec<u8>>,
        udp_port: u16,
        timeout: f64,
        transport: &str,
        etcd: Option<&str>,
        job: &str,
    ) -> PyResult<Self> {
        let dev = Device::from_arg(device).map_err(|e| invalid(e.to_string()))?;
        let listen: SocketAddr = listen
            .parse()
            .map_err(|_| invalid(format!("listen {listen:?}: want ip:port")))?;
        let mut cfg = AgentConfig::new(name, dev, listen, secret);
        cfg.udp_port = udp_port;
        cfg.timeout = seconds(timeout)?;
        cfg.transport = match transport {
            "auto" => Transport::Auto,
            "rdma" => Transport::Rdma,
            "tcp" => Transport::Tcp,
            "shm" => Transport::Shm,
            t => return Err(invalid(format!("transport {t:?}: auto, shm, rdma or tcp"))),
        };
        cfg.registry = etcd.map(|e| Registry::new(e, job));
        let agent = py.detach(|| Agent::new(cfg)).map_err(|e| xerr(&e))?;
        Ok(Self {
            agent,
            pinned: Mutex::new(HashMap::new()),
        })
    }

    /// This agent's name.
    #[getter]
    fn name(&self) -> String {
        self.agent.name().to_string()
    }

    /// Where peers connect ("ip:port").
    #[getter]
    fn address(&self) -> String {
        self.agent.address().to_string()
    }

    /// Registers segment `name`: a writable buffer (the Python half passes a flat byte view
    /// of a numpy array or CPU tensor) in place, or `size` zeroed bytes of the agent's own.
    /// Peers READ and WRITE the buffer directly; do not touch it while a transfer on it
    /// may run. The segment keeps the buffer alive until `deregister`.
    fn register(&self, name: &str, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(size) = buffer.extract::<usize>() {
            return self.agent.register(name, size).map_err(|e| xerr(&e));
        }
        let buf = PyBuffer::<u8>::get(buffer)?;
        if !buf.is_c_contiguous() {
            return Err(invalid(format!("register {name:?}: not contiguous")));
        }
        if buf.readonly() {
            return Err(invalid(format!(
                "register {name:?}: the buffer is read-only (peers write into segments)"
            )));
        }
        let mut pinned = self.pinned.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `buf` pins the exporter's memory (it cannot be freed or resized while the
        // view exists) and is kept in `pinned` until the segment is deregistered, or until
        // the agent (declared first, so dropped first) has deregistered every segment; the
        // buffer is writable (checked above).
        #[allow(unsafe_code)]
        unsafe {
            self.agent
                .register_in_place(name, buf.buf_ptr().cast::<u8>(), buf.len_bytes())
        }
        .map_err(|e| xerr(&e))?;
        pinned.insert(name.to_string(), buf);
        Ok(())
    }

    /// Withdraws segment `name`: peers are told, and a buffer registered in place is the
    /// caller's alone again.
    fn deregister(&self, name: &str) -> PyResult<()> {
        let mut pinned = self.pinned.lock().unwrap_or_else(PoisonError::into_inner);
        self.agent.deregister(name).map_err(|e| xerr(&e))?;
        pinned.remove(name);
        Ok(())
    }

    /// Copies `data` into this agent's segment `name` at `offset`.
    fn write_local(&self, name: &str, offset: usize, data: &[u8]) -> PyResult<()> {
        self.agent
            .write_local(name, offset, data)
            .map_err(|e| xerr(&e))
    }

    /// `length` bytes of this agent's segment `name` at `offset`.
    fn read_local<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        offset: usize,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = vec![0u8; length];
        self.agent
            .read_local(name, offset, &mut out)
            .map_err(|e| xerr(&e))?;
        Ok(PyBytes::new(py, &out))
    }

    /// Connects to the agent at `address` ("ip:port"); returns its name once its segment
    /// table has arrived.
    fn connect(&self, py: Python<'_>, address: &str) -> PyResult<String> {
        let addr: SocketAddr = address
            .parse()
            .map_err(|_| invalid(format!("address {address:?}: want ip:port")))?;
        py.detach(|| self.agent.connect(addr)).map_err(|e| xerr(&e))
    }

    /// Connects to the agent registered as `name` in the job (etcd); returns its name.
    fn connect_name(&self, py: Python<'_>, name: &str) -> PyResult<String> {
        py.detach(|| self.agent.connect_name(name))
            .map_err(|e| xerr(&e))
    }

    /// The agents registered in the job now, by name.
    fn registered(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.agent.registered()).map_err(|e| xerr(&e))
    }

    /// The link peer `peer` is reached over: "shm", "rdma" or "tcp".
    fn transport(&self, peer: &str) -> PyResult<&'static str> {
        self.agent
            .transport(peer)
            .map(|k| k.setting())
            .map_err(|e| xerr(&e))
    }

    /// The peers that introduced themselves and are not lost.
    fn peers(&self) -> Vec<String> {
        self.agent.peers()
    }

    /// What peer `peer` publishes: {segment name: length in bytes}.
    fn remote_segments(&self, peer: &str) -> PyResult<HashMap<String, u64>> {
        Ok(self
            .agent
            .remote_segments(peer)
            .map_err(|e| xerr(&e))?
            .into_iter()
            .map(|s| {
                let len = s.len();
                (s.name, len)
            })
            .collect())
    }

    /// Starts a batch with `peer`: `descs` is a list of (op, local segment, local offset,
    /// remote segment, remote offset, length), op "read" or "write". `notification` (bytes)
    /// reaches the peer after every descriptor's data is in place. Returns the batch's id.
    #[pyo3(signature = (peer, descs, notification=None))]
    fn transfer(
        &self,
        peer: &str,
        descs: Vec<(String, String, u64, String, u64, u64)>,
        notification: Option<Vec<u8>>,
    ) -> PyResult<u32> {
        let ops = descs
            .iter()
            .map(|d| match d.0.as_str() {
                "read" => Ok(Op::Read),
                "write" => Ok(Op::Write),
                o => Err(invalid(format!("op {o:?}: read or write"))),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let descs: Vec<Desc<'_>> = descs
            .iter()
            .zip(ops)
            .map(|(d, op)| Desc {
                op,
                local: &d.1,
                local_offset: d.2,
                remote: &d.3,
                remote_offset: d.4,
                len: d.5,
            })
            .collect();
        self.agent
            .transfer(peer, &descs, notification)
            .map(BatchId::get)
            .map_err(|e| xerr(&e))
    }

    /// Each descriptor's state now: "pending", "done", or the exception it failed with.
    fn status(&self, py: Python<'_>, batch: u32) -> PyResult<Vec<Py<PyAny>>> {
        let states = self
            .agent
            .status(BatchId::new(batch))
            .map_err(|e| xerr(&e))?;
        states_of(py, &states)
    }

    /// Waits (without the GIL) until the batch ends; returns each descriptor's outcome:
    /// "done", or the exception it failed with. The batch is then forgotten.
    #[pyo3(signature = (batch, timeout=30.0))]
    fn wait(&self, py: Python<'_>, batch: u32, timeout: f64) -> PyResult<Vec<Py<PyAny>>> {
        let t = seconds(timeout)?;
        let states = py
            .detach(|| self.agent.wait(BatchId::new(batch), t))
            .map_err(|e| xerr(&e))?;
        states_of(py, &states)
    }

    /// The notifications received and not yet taken, oldest first: (sender, number, bytes).
    fn notifications<'py>(&self, py: Python<'py>) -> Vec<(String, u64, Bound<'py, PyBytes>)> {
        self.agent
            .notifications()
            .into_iter()
            .map(|n| (n.from, n.seq, PyBytes::new(py, &n.payload)))
            .collect()
    }

    /// Waits (without the GIL) until a notification is unread, or `timeout` seconds;
    /// returns the unread ones (none on a timeout).
    #[pyo3(signature = (timeout=30.0))]
    fn wait_notifications<'py>(
        &self,
        py: Python<'py>,
        timeout: f64,
    ) -> PyResult<Vec<(String, u64, Bound<'py, PyBytes>)>> {
        let t = seconds(timeout)?;
        let got = py.detach(|| self.agent.wait_notifications(t));
        Ok(got
            .into_iter()
            .map(|n| (n.from, n.seq, PyBytes::new(py, &n.payload)))
            .collect())
    }

    /// Waits (without the GIL) until every message sent to a live peer was delivered (the
    /// agent does this when it goes, too).
    #[pyo3(signature = (timeout=10.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = seconds(timeout)?;
        py.detach(|| self.agent.flush(t)).map_err(|e| xerr(&e))
    }

    /// What peers sent that was refused without cutting them off, as exceptions.
    fn refused(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.agent
            .refused()
            .iter()
            .map(|e| xerr(e).into_value(py).into_any())
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "XferAgent({:?}, address={:?})",
            self.agent.name(),
            self.agent.address().to_string()
        )
    }
}

fn states_of(py: Python<'_>, states: &[DescState]) -> PyResult<Vec<Py<PyAny>>> {
    states
        .iter()
        .map(|s| {
            Ok(match s {
                DescState::Pending => "pending".into_pyobject(py)?.into_any().unbind(),
                DescState::Done => "done".into_pyobject(py)?.into_any().unbind(),
                DescState::Failed(e) => xerr(e).into_value(py).into_any(),
            })
        })
        .collect()
}

/// Adds the engine's classes and exceptions to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyAgent>()?;
    m.add("XferError", py.get_type::<XferError>())?;
    m.add("UnknownSegmentError", py.get_type::<UnknownSegmentError>())?;
    m.add("OutOfRangeError", py.get_type::<OutOfRangeError>())?;
    m.add("XferTimeoutError", py.get_type::<XferTimeoutError>())?;
    m.add(
        "DuplicateNotificationError",
        py.get_type::<DuplicateNotificationError>(),
    )?;
    Ok(())
}
