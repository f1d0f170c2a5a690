//! `monel._monel`: the native half of Monel's Python package. A [`Comm`] owns a Monel
//! communicator and a queue of jobs that run in the order they were issued, without the GIL:
//! a worker thread of its own drains the queue, and a caller that waits on the job at its
//! head while nothing runs takes it and runs it itself (a blocking call on an idle
//! communicator costs no thread hop). Buffers arrive through the buffer protocol (the Python half hands
//! over contiguous byte views of numpy arrays and CPU tensors): no copy.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use monel_ccl::queue::{Completion, JobQueue, Start};
use monel_ccl::{
    CclError, Collective, CollectiveKind, CommConfig, Communicator, DataType, ErrorKind, GroupOp,
    Io, UniqueId, Window,
};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

mod kinds;
mod verbs;
mod xfer;

use kinds::{Coll, DType, ROp};

create_exception!(
    _monel,
    MonelError,
    PyRuntimeError,
    "Any error from Monel (a RuntimeError, as torch.distributed's own errors are)."
);
create_exception!(
    _monel,
    InvalidArgumentError,
    MonelError,
    "A bad argument on this rank (type, size, root, peer)."
);
create_exception!(
    _monel,
    MismatchError,
    MonelError,
    "Ranks called different operations, or the same with different arguments."
);
create_exception!(
    _monel,
    CommTimeoutError,
    MonelError,
    "An operation did not finish in time; `ranks` names the ranks that did not arrive."
);
create_exception!(
    _monel,
    PeerLostError,
    MonelError,
    "A peer died or its connection failed; `ranks` names it."
);
create_exception!(
    _monel,
    AbortedError,
    MonelError,
    "The communicator was aborted, here or by another rank."
);
create_exception!(
    _monel,
    BootstrapError,
    MonelError,
    "The communicator could not be set up (rendezvous, environment, unique id)."
);

/// The Python exception for a Monel error, with its `ranks` attribute set.
fn py_err(e: &CclError) -> PyErr {
    let msg = e.to_string();
    let err = match e.kind {
        ErrorKind::InvalidArgument => InvalidArgumentError::new_err(msg),
        ErrorKind::Mismatch => MismatchError::new_err(msg),
        ErrorKind::Timeout => CommTimeoutError::new_err(msg),
        ErrorKind::PeerLost => PeerLostError::new_err(msg),
        ErrorKind::RemoteAbort | ErrorKind::Aborted => AbortedError::new_err(msg),
        ErrorKind::Bootstrap => BootstrapError::new_err(msg),
        _ => MonelError::new_err(msg),
    };
    Python::attach(|py| {
        let _ = err.value(py).setattr("ranks", e.ranks.clone());
    });
    err
}

fn invalid(msg: impl Into<String>) -> PyErr {
    InvalidArgumentError::new_err(msg.into())
}

/// A byte range of a Python buffer, valid while the job that carries it holds the buffer.
#[derive(Clone, Copy)]
struct Region {
    ptr: usize,
    len: usize,
    readonly: bool,
}

impl Region {
    fn of(b: &PyBuffer<u8>, writable: bool, what: &str) -> PyResult<Self> {
        if !b.is_c_contiguous() {
            return Err(invalid(format!("{what}: the buffer is not contiguous")));
        }
        if writable && b.readonly() {
            return Err(invalid(format!("{what}: the buffer is read-only")));
        }
        Ok(Self {
            ptr: b.buf_ptr() as usize,
            len: b.len_bytes(),
            readonly: b.readonly(),
        })
    }
    fn overlaps(self, o: Self) -> bool {
        self.len > 0 && o.len > 0 && self.ptr < o.ptr + o.len && o.ptr < self.ptr + self.len
    }
    // SAFETY (both): a Region is made from a contiguous PyBuffer that the job holding it keeps
    // alive (and so the exporter's memory in place) until the operation finished; regions of
    // one job never overlap unless they are the same region (checked by `io`).
    #[allow(unsafe_code)]
    fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: see above.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
    #[allow(unsafe_code)]
    fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: see above; the memory was checked writable.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

/// An operation's buffers: out of place, or one buffer in place: the same buffer passed
/// twice, or NCCL's in-place form where one buffer holds the other at this rank's slot
/// (all-gather's input inside its output, reduce-scatter's output inside its input, ...).
fn io<'a>(
    coll: Collective,
    c: &Communicator,
    count: usize,
    esize: usize,
    send: Option<Region>,
    recv: Region,
) -> Result<Io<'a>, CclError> {
    let Some(s) = send else {
        return Ok(Io::InPlace(recv.bytes_mut()));
    };
    if s.ptr == recv.ptr && s.len == recv.len {
        return Ok(Io::InPlace(recv.bytes_mut()));
    }
    if !s.overlaps(recv) {
        return Ok(Io::Separate {
            send: s.bytes(),
            recv: recv.bytes_mut(),
        });
    }
    let layout = coll.in_place_layout(c.size(), c.rank(), count);
    let inside = |whole: Region, part: Region, at: usize| {
        whole.len == layout.map_or(usize::MAX, |l| l.0 * esize)
            && part.ptr == whole.ptr + at * esize
            && part.ptr + part.len <= whole.ptr + whole.len
    };
    match layout {
        Some((_, at, 0)) if inside(recv, s, at) => Ok(Io::InPlace(recv.bytes_mut())),
        Some((_, 0, at)) if inside(s, recv, at) && !s.readonly => Ok(Io::InPlace(s.bytes_mut())),
        _ => Err(CclError::invalid(
            "input and output overlap without being the same buffer or NCCL's in-place layout \
             (this rank's slot of the larger one)",
        )),
    }
}

/// One point-to-point part of a group.
#[derive(Clone, Copy)]
struct P2p {
    send: bool,
    region: Region,
    count: usize,
    dtype: DataType,
    peer: usize,
    tag: u32,
}

enum Op {
    Collective {
        coll: Collective,
        dtype: DataType,
        count: usize,
        send: Option<Region>,
        recv: Region,
    },
    Group(Vec<P2p>),
    /// A receive matched by tag, from one source or any (`None`).
    RecvFrom {
        region: Region,
        count: usize,
        dtype: DataType,
        src: Option<usize>,
        tag: u32,
    },
    MonitoredBarrier {
        timeout: Duration,
        wait_all: bool,
    },
    SetTimeout(Duration),
    Split {
        color: Option<u32>,
        key: i64,
    },
    AllocWindow {
        len: usize,
    },
}

/// What a job hands back: nothing, a receive's source, a split's communicator, a window.
enum Outcome {
    Done,
    /// A receive's source rank.
    Source(usize),
    Split(Option<Box<Communicator>>),
    Window(Window),
}

fn run_op(c: &mut Communicator, op: Op) -> Result<Outcome, CclError> {
    match op {
        Op::Collective {
            coll,
            dtype,
            count,
            send,
            recv,
        } => c
            .collective(
                monel_ccl::Call::new(coll, dtype, count),
                io(coll, c, count, dtype.size(), send, recv)?,
            )
            .map(|()| Outcome::Done),
        Op::Group(parts) => {
            let ops = parts
                .into_iter()
                .map(|p| {
                    if p.send {
                        GroupOp::Send {
                            buf: p.region.bytes(),
                            count: p.count,
                            dtype: p.dtype,
                            peer: p.peer,
                            tag: p.tag,
                        }
                    } else {
                        GroupOp::Recv {
                            buf: p.region.bytes_mut(),
                            count: p.count,
                            dtype: p.dtype,
                            peer: p.peer,
                            tag: p.tag,
                        }
                    }
                })
                .collect();
            c.group(ops).map(|()| Outcome::Done)
        }
        Op::RecvFrom {
            region,
            count,
            dtype,
            src,
            tag,
        } => c
            .recv_tagged(region.bytes_mut(), count, dtype, src, tag)
            .map(Outcome::Source),
        Op::MonitoredBarrier { timeout, wait_all } => c
            .monitored_barrier(timeout, wait_all)
            .map(|()| Outcome::Done),
        Op::SetTimeout(t) => {
            c.set_timeout(t);
            Ok(Outcome::Done)
        }
        Op::Split { color, key } => c.split(color, key).map(|s| Outcome::Split(s.map(Box::new))),
        Op::AllocWindow { len } => c.alloc_window(len).map(Outcome::Window),
    }
}

/// A handle on an operation in flight (`async_op=True`).
#[pyclass(module = "monel._monel")]
struct Work {
    done: Arc<Completion<Outcome>>,
    queue: Weak<Queue>,
}

/// A communicator's jobs (`monel_ccl::queue`): the Python operations run on it in order.
type Queue = JobQueue<Communicator, Outcome>;

impl Work {
    /// Waits for the job; with no timeout, runs it (and the jobs ahead of it) here when no
    /// other thread has taken it.
    fn finish(&self, timeout: Option<Duration>) -> Option<Result<(), CclError>> {
        match self.queue.upgrade() {
            Some(q) => q.finish(&self.done, timeout),
            None => self.done.wait(timeout),
        }
    }
}

#[pymethods]
impl Work {
    /// Waits for the operation (without the GIL) and raises its error, if any. With a
    /// timeout in seconds, returns False if it has not finished by then.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let t = timeout
            .map(|s| {
                Duration::try_from_secs_f64(s)
                    .map_err(|_| invalid(format!("timeout {s}: want seconds >= 0")))
            })
            .transpose()?;
        match py.detach(|| self.finish(t)) {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(py_err(&e)),
        }
    }
    /// True once the operation finished (successfully or not).
    fn is_completed(&self) -> bool {
        if let Some(q) = self.queue.upgrade() {
            q.kick(&self.done);
        }
        self.done.is_done()
    }
    /// The rank a finished receive took its message from (`None` before it finished, or
    /// for other operations).
    #[getter]
    fn source(&self) -> Option<usize> {
        self.done.peek(|v| match v {
            Some(Outcome::Source(r)) => Some(*r),
            _ => None,
        })
    }
    /// True if the operation finished without error.
    fn is_success(&self) -> bool {
        self.done.succeeded()
    }
}

/// A communicator: this rank's membership of a group of ranks (the native object behind
/// `monel.Communicator`).
#[pyclass(module = "monel._monel")]
struct Comm {
    rank: usize,
    size: usize,
    paths: Vec<String>,
    queue: Option<Arc<Queue>>,
    thread: Option<JoinHandle<()>>,
}

impl Comm {
    fn start(c: Communicator) -> Self {
        let (rank, size, paths) = (c.rank(), c.size(), c.paths().to_vec());
        let (queue, thread) = Queue::start(c, format!("monel-rank{rank}"));
        Self {
            rank,
            size,
            paths,
            queue: Some(queue),
            thread,
        }
    }

    fn submit(
        &self,
        py: Python<'_>,
        op: Op,
        bufs: Vec<PyBuffer<u8>>,
        async_op: bool,
        defer: bool,
    ) -> PyResult<Work> {
        let q = self
            .queue
            .as_ref()
            .ok_or_else(|| AbortedError::new_err("the communicator was destroyed"))?;
        let start = match (async_op, defer) {
            (false, _) => Start::Caller,
            (true, false) => Start::Now,
            (true, true) => Start::Deferred,
        };
        let task = move |c: &mut Communicator| {
            let r = run_op(c, op);
            // Release the buffers before anyone learns the operation finished.
            Python::attach(|_| drop(bufs));
            r
        };
        // A closed queue drops the task here, where the caller holds the GIL its buffers
        // need.
        let done = q
            .push(task, start)
            .ok_or_else(|| AbortedError::new_err("the communicator's worker stopped"))?;
        let w = Work {
            done,
            queue: Arc::downgrade(q),
        };
        if !async_op {
            w.wait(py, None)?;
        }
        Ok(w)
    }
}

/// Runs a communicator's (blocking) setup without the GIL and starts its worker.
fn join(
    py: Python<'_>,
    make: impl FnOnce() -> Result<Communicator, CclError> + Send,
) -> PyResult<Comm> {
    py.detach(make).map(Comm::start).map_err(|e| py_err(&e))
}

fn config(timeout: Option<f64>) -> PyResult<CommConfig> {
    let mut cfg = CommConfig::from_env().map_err(|e| py_err(&e))?;
    if let Some(t) = timeout {
        cfg.timeout = Duration::try_from_secs_f64(t)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| invalid(format!("timeout {t}: want seconds > 0")))?;
    }
    Ok(cfg)
}

#[pymethods]
impl Comm {
    /// Joins communicator `unique_id` as `rank` of `size` (`ncclCommInitRank`); `MONEL_*`
    /// variables configure it, `timeout` (seconds) overrides `MONEL_TIMEOUT`.
    #[new]
    #[pyo3(signature = (size, rank, unique_id, timeout=None))]
    fn new(
        py: Python<'_>,
        size: usize,
        rank: usize,
        unique_id: &str,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let id: UniqueId = unique_id
            .parse()
            .map_err(|e: CclError| BootstrapError::new_err(e.to_string()))?;
        let cfg = config(timeout)?;
        join(py, move || Communicator::init_rank(size, rank, &id, cfg))
    }

    /// Joins from the launcher's variables (torchrun, Slurm, mpirun, `MONEL_*`; the timeout
    /// is `MONEL_TIMEOUT`).
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Self> {
        join(py, Communicator::from_env)
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }
    /// Ranks in all.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }
    /// One line per connection: the path it took (SHM, RoCE soft-RNIC, TCP) and why.
    #[getter]
    fn paths(&self) -> Vec<String> {
        self.paths.clone()
    }

    /// Runs collective `name` on byte buffers (the Python half checks shapes and types).
    /// Blocking calls run on the calling thread when nothing else is queued; `async_op`
    /// returns a [`Work`] at once, the worker starting the job now, or with `defer` after
    /// 5 ms (`monel_ccl::queue::DEFER`) unless a `wait()` runs it first.
    #[pyo3(signature = (coll, dtype, count, send, recv, *, op=ROp::SUM, root=0, async_op=false, defer=false))]
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        py: Python<'_>,
        coll: Coll,
        dtype: DType,
        count: usize,
        send: Option<PyBuffer<u8>>,
        recv: PyBuffer<u8>,
        op: ROp,
        root: usize,
        async_op: bool,
        defer: bool,
    ) -> PyResult<Work> {
        let coll = CollectiveKind::from(coll).with(op.into(), root);
        let s = send
            .as_ref()
            .map(|b| Region::of(b, false, "input"))
            .transpose()?;
        let r = Region::of(&recv, true, "output")?;
        let mut bufs = vec![recv];
        bufs.extend(send);
        self.submit(
            py,
            Op::Collective {
                coll,
                dtype: dtype.into(),
                count,
                send: s,
                recv: r,
            },
            bufs,
            async_op,
            defer,
        )
    }

    /// Runs sends and receives as one group: `ops` holds `(is_send, buffer, count, dtype,
    /// peer, tag)` tuples. `async_op` and `defer` as for [`Comm::collective`].
    #[pyo3(signature = (ops, *, async_op=false, defer=false))]
    fn group(
        &self,
        py: Python<'_>,
        ops: Vec<(bool, PyBuffer<u8>, usize, DType, usize, u32)>,
        async_op: bool,
        defer: bool,
    ) -> PyResult<Work> {
        let mut parts = Vec::with_capacity(ops.len());
        let mut bufs = Vec::with_capacity(ops.len());
        for (send, b, count, dtype, peer, tag) in ops {
            let region = Region::of(
                &b,
                !send,
                if send {
                    "send buffer"
                } else {
                    "receive buffer"
                },
            )?;
            if !send && parts.iter().any(|p: &P2p| p.region.overlaps(region)) {
                return Err(invalid(
                    "a receive buffer overlaps another buffer of the group",
                ));
            }
            parts.push(P2p {
                send,
                region,
                count,
                dtype: dtype.into(),
                peer,
                tag,
            });
            bufs.push(b);
        }
        for p in parts.iter().filter(|p| p.send) {
            if parts.iter().any(|q| !q.send && q.region.overlaps(p.region)) {
                return Err(invalid(
                    "a send buffer overlaps a receive buffer of the group",
                ));
            }
        }
        self.submit(py, Op::Group(parts), bufs, async_op, defer)
    }

    /// Receives into `buffer` the first message from `src` (`None`: any rank) that carries
    /// `tag`; the work's `source` names the sender once done. `async_op` and `defer` as for
    /// [`Comm::collective`].
    #[pyo3(signature = (buffer, count, dtype, src, tag, *, async_op=false, defer=false))]
    #[allow(clippy::too_many_arguments)]
    fn recv_from(
        &self,
        py: Python<'_>,
        buffer: PyBuffer<u8>,
        count: usize,
        dtype: DType,
        src: Option<usize>,
        tag: u32,
        async_op: bool,
        defer: bool,
    ) -> PyResult<Work> {
        let region = Region::of(&buffer, true, "receive buffer")?;
        let op = Op::RecvFrom {
            region,
            count,
            dtype: dtype.into(),
            src,
            tag,
        };
        self.submit(py, op, vec![buffer], async_op, defer)
    }

    /// A barrier that names the ranks that do not arrive within `timeout` seconds (torch's
    /// `monitored_barrier`): rank 0 raises naming the first (or, with `wait_all`, every)
    /// missing rank; the others raise that rank 0 did not release them.
    #[pyo3(signature = (timeout, *, wait_all=false, async_op=false))]
    fn monitored_barrier(
        &self,
        py: Python<'_>,
        timeout: f64,
        wait_all: bool,
        async_op: bool,
    ) -> PyResult<Work> {
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|_| invalid(format!("timeout {timeout}: want seconds >= 0")))?;
        let op = Op::MonitoredBarrier { timeout, wait_all };
        self.submit(py, op, Vec::new(), async_op, false)
    }

    /// Sets how long each later operation may wait, in seconds, in order with the
    /// operations already issued (torch's per-call timeouts set it around one call).
    fn set_timeout(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        let t = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| invalid(format!("timeout {seconds}: want seconds > 0")))?;
        self.submit(py, Op::SetTimeout(t), Vec::new(), true, false)
            .map(drop)
    }

    /// Splits (`ncclCommSplit`): ranks passing the same `color` form a new communicator,
    /// ordered by `key`; `color=None` takes part and joins none (returns None).
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<Self>> {
        let w = self.submit(py, Op::Split { color, key }, Vec::new(), false, false)?;
        let c = match w.done.take() {
            Some(Outcome::Split(c)) => c,
            _ => None,
        };
        Ok(c.map(|c| Self::start(*c)))
    }

    /// Allocates a symmetric memory window of `nbytes` (collective: every rank calls it, in
    /// the same order as its other operations). Collectives whose buffers lie in windows on
    /// every rank of a one-host communicator run directly between the ranks' memory.
    fn alloc_window(&self, py: Python<'_>, nbytes: usize) -> PyResult<Win> {
        let w = self.submit(
            py,
            Op::AllocWindow { len: nbytes },
            Vec::new(),
            false,
            false,
        )?;
        let Some(Outcome::Window(win)) = w.done.take() else {
            return Err(invalid("alloc_window: no window came back"));
        };
        Ok(Win { w: win })
    }

    /// Destroys the communicator: waits for queued operations, then closes its connections.
    fn destroy(&mut self, py: Python<'_>) {
        if let Some(q) = self.queue.take() {
            q.close();
        }
        if let Some(t) = self.thread.take() {
            py.detach(move || {
                let _ = t.join();
            });
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Some(q) = self.queue.take() {
            q.close();
        }
        if let Some(t) = self.thread.take() {
            // Without the GIL when Python is still running: the worker may need it.
            Python::attach(|py| {
                py.detach(move || {
                    let _ = t.join();
                });
            });
        }
    }
}

/// A symmetric memory window (the native object behind `Communicator.alloc_window`): bytes
/// that every rank of the communicator maps when they share one host. It exports them through
/// the buffer protocol, writable (`memoryview(w)`, `numpy.frombuffer(w, dtype)`,
/// `torch.frombuffer(w, dtype=...)`); every view holds the window, so the mapping outlives the
/// last one.
#[pyclass(module = "monel._monel", frozen)]
struct Win {
    w: Window,
}

#[pymethods]
impl Win {
    /// Bytes in the window.
    fn __len__(&self) -> usize {
        self.w.len()
    }
    /// True when every rank maps every rank's window (collectives on it run directly);
    /// otherwise it is private memory and collectives on it take the ordinary path.
    #[getter]
    fn shared(&self) -> bool {
        self.w.is_shared()
    }
    /// The window's number in its communicator (allocation order).
    #[getter]
    fn id(&self) -> usize {
        self.w.id()
    }

    /// Exports the window's bytes, writable.
    #[allow(unsafe_code)]
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let (ptr, len) = {
            let w = &slf.get().w;
            (w.as_ptr().cast_mut(), w.len())
        };
        let len = isize::try_from(len).map_err(|_| invalid("window too large to export"))?;
        // SAFETY: `view` is the caller's Py_buffer to fill (the buffer protocol's contract);
        // `ptr..ptr + len` is the window's mapping, which lives as long as this object, and
        // PyBuffer_FillInfo takes a reference to it (the view's `obj`) until the view is
        // released. Writers race only as with any buffer a collective is given.
        let r =
            unsafe { pyo3::ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast(), len, 0, flags) };
        if r == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    #[allow(unsafe_code)]
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    fn __repr__(&self) -> String {
        format!(
            "<monel window {} of {} bytes, {}>",
            self.w.id(),
            self.w.len(),
            if self.w.is_shared() {
                "shared"
            } else {
                "private"
            }
        )
    }
}

/// Starts a rendezvous on `bind` ("ip:port", port 0 picks one) served by this process, and
/// returns the unique id every rank passes to `Communicator(size, rank, unique_id)`.
#[pyfunction]
#[pyo3(signature = (bind="127.0.0.1:0"))]
fn create_unique_id(bind: &str) -> PyResult<String> {
    let addr = bind
        .parse()
        .map_err(|_| invalid(format!("bind {bind:?}: want ip:port")))?;
    UniqueId::create(addr)
        .map(|id| id.to_string())
        .map_err(|e| py_err(&e))
}

/// The native module.
#[pymodule]
fn _monel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Comm>()?;
    m.add_class::<Work>()?;
    m.add_class::<Win>()?;
    m.add_function(wrap_pyfunction!(create_unique_id, m)?)?;
    m.add("MonelError", py.get_type::<MonelError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add("CommTimeoutError", py.get_type::<CommTimeoutError>())?;
    m.add("PeerLostError", py.get_type::<PeerLostError>())?;
    m.add("AbortedError", py.get_type::<AbortedError>())?;
    m.add("BootstrapError", py.get_type::<BootstrapError>())?;
    kinds::register(m)?;
    verbs::register(m)?;
    xfer::register(m)?;
    Ok(())
}
