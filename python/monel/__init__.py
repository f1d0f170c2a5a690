"""Monel from Python: NCCL-style collectives over shared memory, a software RoCE NIC and TCP,
on numpy arrays, CPU torch tensors and any CPU array that speaks DLPack (JAX's, ...), without
copying them; CUDA arrays (torch, `__cuda_array_interface__`, CUDA DLPack) staged through
pinned host memory with torch.

    import monel
    comm = monel.Communicator.from_env()      # torchrun, Slurm, mpirun or MONEL_* variables
    comm.all_reduce(x)                        # in place, sum
    comm.all_gather(x, out)                   # out holds size * x.size elements
    w = comm.all_reduce(y, op="max", async_op=True); ...; w.wait()

`import monel.torch` registers the torch.distributed backend "monel".
"""

from __future__ import annotations

import atexit
import functools
import sys
import weakref
from collections.abc import Sequence
from typing import Any, Self

import numpy as np

from monel import _monel
from monel._monel import (
    AbortedError,
    BootstrapError,
    CommTimeoutError,
    InvalidArgumentError,
    MismatchError,
    MonelError,
    PeerLostError,
    Work,
    create_unique_id,
)

__all__ = [
    "AbortedError",
    "BootstrapError",
    "CommTimeoutError",
    "Communicator",
    "InvalidArgumentError",
    "MismatchError",
    "MonelError",
    "PeerLostError",
    "Work",
    "create_unique_id",
]

# The native module's element types by the package's names (`str()` of each is its name).
_DTYPES: dict[str, _monel.DType] = {
    str(d): d
    for d in (
        _monel.DType.INT8,
        _monel.DType.UINT8,
        _monel.DType.INT32,
        _monel.DType.UINT32,
        _monel.DType.INT64,
        _monel.DType.UINT64,
        _monel.DType.FLOAT16,
        _monel.DType.BFLOAT16,
        _monel.DType.FLOAT32,
        _monel.DType.FLOAT64,
        _monel.DType.FLOAT8E4M3,
        _monel.DType.FLOAT8E5M2,
    )
}


def _native_types(names: dict) -> dict:
    """`names` (a framework's type to the package's name) onto the native types."""
    return {k: _DTYPES[v] for k, v in names.items()}


_NUMPY_TYPES = _native_types(
    {
        np.dtype(np.int8): "int8",
        np.dtype(np.uint8): "uint8",
        np.dtype(np.int32): "int32",
        np.dtype(np.uint32): "uint32",
        np.dtype(np.int64): "int64",
        np.dtype(np.uint64): "uint64",
        np.dtype(np.float16): "float16",
        np.dtype(np.float32): "float32",
        np.dtype(np.float64): "float64",
    }
)

# ml_dtypes' types (JAX's and TensorFlow's bfloat16 and float8), by numpy dtype name.
_ML_TYPES = _native_types(
    {"bfloat16": "bfloat16", "float8_e4m3fn": "float8e4m3", "float8_e5m2": "float8e5m2"}
)

_OPS = ("sum", "prod", "min", "max", "avg")

# Communicators still open at exit are destroyed before the interpreter finalizes: their
# worker threads take the GIL to release buffers, which a finalizing interpreter forbids.
_LIVE: weakref.WeakSet[Communicator] = weakref.WeakSet()


@atexit.register
def _destroy_all() -> None:
    for c in list(_LIVE):
        c.destroy()


_TORCH_TYPES: dict = {}


def _torch_types() -> dict:
    if _TORCH_TYPES:
        return _TORCH_TYPES
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    t = {
        torch.int8: "int8",
        torch.uint8: "uint8",
        torch.int32: "int32",
        torch.int64: "int64",
        torch.float16: "float16",
        torch.bfloat16: "bfloat16",
        torch.float32: "float32",
        torch.float64: "float64",
    }
    for name, monel_name in (
        ("uint32", "uint32"),
        ("uint64", "uint64"),
        ("float8_e4m3fn", "float8e4m3"),
        ("float8_e5m2", "float8e5m2"),
    ):
        if hasattr(torch, name):
            t[getattr(torch, name)] = monel_name
    _TORCH_TYPES.update(_native_types(t))
    return _TORCH_TYPES


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


_TORCH_NUMPY: set = set()

# DLPack's device types (`DLDeviceType`): the CPU, and the CUDA memories.
_DL_CPU = 1
_DL_CUDA = {2: "CUDA", 3: "CUDA host", 13: "CUDA managed"}


def _from_dlpack(x: Any, what: str) -> np.ndarray | None:
    """A numpy view (no copy) of an array that speaks DLPack on the CPU (a JAX array, ...);
    None if `x` does not speak it."""
    device = getattr(x, "__dlpack_device__", None)
    if device is None or not hasattr(x, "__dlpack__"):
        return None
    try:
        kind = int(device()[0])
    except Exception as e:
        raise InvalidArgumentError(f"{what}: __dlpack_device__ failed: {e}") from e
    name = type(x).__name__
    if kind != _DL_CPU:
        where = _DL_CUDA.get(kind, f"DLPack device type {kind}")
        raise InvalidArgumentError(
            f"{what}: a {name} in {where} memory; group() takes CPU memory "
            "(the collectives, send and recv stage CUDA arrays)"
        )
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, ValueError, RuntimeError) as e:
        raise InvalidArgumentError(f"{what}: a {name} numpy cannot view: {e}") from e


def _u8_view(x: Any, what: str) -> np.ndarray:
    """A uint8 view of the memory of `x` (no copy), whatever its element type.

    `x` is a numpy array or a CPU torch tensor, and it must be contiguous: a copy would hide
    the result from the caller. Tensors of a type numpy has, with no autograd, are exported
    directly (about a microsecond); the rest go through a uint8 tensor view first.
    """
    if _is_tensor(x):
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"{what}: a {x.device.type} tensor; Monel takes CPU tensors")
        if not x.is_contiguous():
            raise InvalidArgumentError(f"{what}: the tensor is not contiguous (call .contiguous())")
        if not _TORCH_NUMPY:
            torch = sys.modules["torch"]
            _TORCH_NUMPY.update(
                (
                    torch.int8,
                    torch.uint8,
                    torch.int32,
                    torch.int64,
                    torch.float16,
                    torch.float32,
                    torch.float64,
                    torch.bool,
                )
            )
        if x.dtype in _TORCH_NUMPY and not x.requires_grad and x.dim():
            return x.numpy().view(np.uint8)
        d = x.detach()
        if d.dim() == 0:
            d = d.reshape(1)
        # A uint8 view of the same memory (the buffer protocol wants no more than C order).
        return d.view(_torch_u8()).numpy()
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise InvalidArgumentError(
                f"{what}: the array is not C-contiguous (use np.ascontiguousarray)"
            )
        return x.view(np.uint8) if x.ndim else x.reshape(1).view(np.uint8)
    raise InvalidArgumentError(
        f"{what}: want a numpy array or a CPU torch tensor, got {type(x).__name__}"
    )


def as_bytes(x: Any, what: str, writable: bool = False) -> tuple[np.ndarray, _monel.DType, int]:
    """A flat uint8 view of `x`'s memory (no copy), its Monel type (`str()`: its name) and
    element count.

    `x` is a numpy array, a CPU torch tensor or a CPU array that speaks DLPack (a JAX
    array: read-only, so an input only); it must be contiguous and of a type Monel reduces.
    """
    if _is_tensor(x):
        dtype = _torch_types().get(x.dtype)
        if dtype is None and x.device.type == "cpu":
            raise InvalidArgumentError(f"{what}: torch type {x.dtype} is not supported")
        view = _u8_view(x, what)
        if dtype is None:
            raise InvalidArgumentError(f"{what}: torch type {x.dtype} is not supported")
        return view, dtype, x.numel()
    if isinstance(x, np.ndarray):
        dtype = _NUMPY_TYPES.get(x.dtype)
        if dtype is None:
            dtype = _ML_TYPES.get(x.dtype.name)
        if dtype is None:
            raise InvalidArgumentError(f"{what}: numpy type {x.dtype} is not supported")
        if writable and x.flags.c_contiguous and not x.flags.writeable:
            raise InvalidArgumentError(f"{what}: the array is read-only")
        return _u8_view(x, what), dtype, x.size
    a = _from_dlpack(x, what)
    if a is not None:
        if writable and not a.flags.writeable:
            raise InvalidArgumentError(
                f"{what}: the {type(x).__name__} is read-only (JAX arrays are immutable: "
                "give a numpy array as the output)"
            )
        return as_bytes(a, what, writable)
    raise InvalidArgumentError(
        f"{what}: want a numpy array, a CPU torch tensor or a CPU array that speaks DLPack, "
        f"got {type(x).__name__}"
    )


def _torch_u8():
    return sys.modules["torch"].uint8


_REDOPS: dict[str, _monel.RedOp] = {
    str(o): o
    for o in (
        _monel.RedOp.SUM,
        _monel.RedOp.PROD,
        _monel.RedOp.MIN,
        _monel.RedOp.MAX,
        _monel.RedOp.AVG,
    )
}


def _redop(op: str) -> _monel.RedOp:
    r = _REDOPS.get(op)
    if r is None:
        raise InvalidArgumentError(f"unknown reduction {op!r}: want one of {', '.join(_OPS)}")
    return r


def _tag(tag) -> int:
    """A message tag as it travels: 32 bits (negative tags, as C ints, wrap)."""
    if not isinstance(tag, int) or isinstance(tag, bool) or not -(1 << 31) <= tag < 1 << 32:
        raise InvalidArgumentError(f"tag {tag!r}: want an integer in -2**31 .. 2**32 - 1")
    return tag & 0xFFFFFFFF


def _on_cuda(x: Any) -> bool:
    if x is None or isinstance(x, (np.ndarray, int, str)):
        return False
    if _is_tensor(x):
        return x.device.type == "cuda"
    from monel._cuda_arrays import on_cuda

    return on_cuda(x)


def _stages_cuda(writes):
    """A collective that takes CUDA arrays too: staged through pinned host memory with torch
    (`monel._cuda_arrays`). `writes(arguments)` names the arguments that receive results."""

    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            if any(_on_cuda(a) for a in args) or any(_on_cuda(v) for v in kwargs.values()):
                from monel import _cuda_arrays

                return _cuda_arrays.call(method, self, args, kwargs, writes)
            return method(self, *args, **kwargs)

        return run

    return wrap


def _out_or_x(a: dict) -> tuple:
    return ("x",) if a.get("out") is None else ("out",)


def _out(a: dict) -> tuple:
    return ("out",)


def _nothing(a: dict) -> tuple:
    return ()


class Communicator:
    """This process's rank in a group of ranks (`ncclComm_t`).

    Operations run in the order issued, with the GIL released: a blocking call on the calling
    thread (no thread hop) unless earlier operations are still queued, an `async_op` one on
    the communicator's worker thread. Blocking calls return when the operation finished; with
    `async_op=True` they return a `Work` whose `wait()` raises the operation's error. Until
    then the buffers must not be touched. Errors are `MonelError` subclasses; a timeout
    (`MONEL_TIMEOUT`, default 300 s) or a dead peer raises on every surviving rank, and the
    exception's `ranks` names the ranks that did not arrive.
    """

    # Async operations start on the worker after 5 ms unless a wait() runs them first (set
    # by the torch backend, whose blocking calls are async operations waited for at once).
    _defer = False

    def __init__(self, size: int, rank: int, unique_id: str, timeout: float | None = None):
        """Joins the communicator `unique_id` names (from `create_unique_id` on one rank)."""
        self._c = _monel.Comm(size, rank, unique_id, timeout)
        _LIVE.add(self)

    @classmethod
    def from_env(cls) -> Communicator:
        """Joins from torchrun (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), Slurm, mpirun or
        MONEL_* variables."""
        self = cls.__new__(cls)
        self._c = _monel.Comm.from_env()
        _LIVE.add(self)
        return self

    @classmethod
    def _wrap(cls, c) -> Communicator:
        self = cls.__new__(cls)
        self._c = c
        _LIVE.add(self)
        return self

    @property
    def rank(self) -> int:
        """This rank."""
        return self._c.rank

    @property
    def size(self) -> int:
        """Ranks in all."""
        return self._c.size

    @property
    def paths(self) -> list[str]:
        """One line per connection: the transport it took and why."""
        return self._c.paths

    def __repr__(self) -> str:
        return f"<monel.Communicator rank {self.rank} of {self.size}>"

    # -- helpers ---------------------------------------------------------------------------

    def _pair(self, x, out, what_out="out"):
        xb, xt, xn = as_bytes(x, "input")
        if out is None:
            return xb, xt, xn, None, None, None
        ob, ot, on = as_bytes(out, what_out, writable=True)
        if ot != xt:
            raise InvalidArgumentError(f"input is {xt} but {what_out} is {ot}")
        return xb, xt, xn, ob, ot, on

    def _root(self, root: int) -> int:
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise InvalidArgumentError(f"root {root!r} is not a rank (0..{self.size - 1})")
        return root

    # -- collectives -----------------------------------------------------------------------

    @_stages_cuda(_out_or_x)
    def all_reduce(self, x, out=None, op: str = "sum", async_op: bool = False) -> Work | None:
        """Reduces `x` across ranks into `out` (in place into `x` without `out`)."""
        xb, t, n, ob, _, on = self._pair(x, out)
        if ob is not None and on != n:
            raise InvalidArgumentError(f"out has {on} elements, input {n}")
        w = self._c.collective(
            _monel.Coll.ALL_REDUCE,
            t,
            n,
            None if ob is None else xb,
            xb if ob is None else ob,
            op=_redop(op),
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    @_stages_cuda(_out_or_x)
    def broadcast(self, x, root: int = 0, out=None, async_op: bool = False) -> Work | None:
        """Copies the root's `x` to every rank's `out` (in place into `x` without `out`)."""
        xb, t, n, ob, _, on = self._pair(x, out)
        if ob is not None and on != n:
            raise InvalidArgumentError(f"out has {on} elements, input {n}")
        w = self._c.collective(
            _monel.Coll.BROADCAST,
            t,
            n,
            None if ob is None else xb,
            xb if ob is None else ob,
            root=self._root(root),
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    @_stages_cuda(_out_or_x)
    def reduce(
        self, x, root: int = 0, out=None, op: str = "sum", async_op: bool = False
    ) -> Work | None:
        """Reduces `x` across ranks into the root's `out` (in place into `x` without `out`)."""
        xb, t, n, ob, _, on = self._pair(x, out)
        if ob is not None and on != n:
            raise InvalidArgumentError(f"out has {on} elements, input {n}")
        w = self._c.collective(
            _monel.Coll.REDUCE,
            t,
            n,
            None if ob is None else xb,
            xb if ob is None else ob,
            op=_redop(op),
            root=self._root(root),
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    @_stages_cuda(_out)
    def all_gather(self, x, out, async_op: bool = False) -> Work | None:
        """Concatenates every rank's `x` (rank order) into `out` (size * x.size elements)."""
        xb, t, n, ob, _, on = self._pair(x, out)
        if on != n * self.size:
            raise InvalidArgumentError(f"out has {on} elements, want {self.size} x {n}")
        w = self._c.collective(
            _monel.Coll.ALL_GATHER, t, n, xb, ob, async_op=async_op, defer=self._defer
        )
        return w if async_op else None

    @_stages_cuda(_out)
    def reduce_scatter(self, x, out, op: str = "sum", async_op: bool = False) -> Work | None:
        """Reduces `x` (size * out.size elements) and leaves rank r's block in `out`."""
        xb, t, n, ob, _, on = self._pair(x, out)
        if n != on * self.size:
            raise InvalidArgumentError(f"input has {n} elements, want {self.size} x {on}")
        w = self._c.collective(
            _monel.Coll.REDUCE_SCATTER,
            t,
            on,
            xb,
            ob,
            op=_redop(op),
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    @_stages_cuda(_out)
    def all_to_all(self, x, out, async_op: bool = False) -> Work | None:
        """Sends block j of `x` to rank j; block i of `out` comes from rank i (equal blocks)."""
        xb, t, n, ob, _, on = self._pair(x, out)
        if n != on or n % self.size:
            raise InvalidArgumentError(
                f"input and out must have the same size, divisible by {self.size} (got {n}, {on})"
            )
        w = self._c.collective(
            _monel.Coll.ALL_TO_ALL,
            t,
            n // self.size,
            xb,
            ob,
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    @_stages_cuda(_out)
    def gather(self, x, out=None, root: int = 0, async_op: bool = False) -> Work | None:
        """Concatenates every rank's `x` into the root's `out` (size * x.size elements)."""
        root = self._root(root)
        xb, t, n, ob, _, on = self._pair(x, out)
        if self.rank == root and on != n * self.size:
            raise InvalidArgumentError(f"out has {on} elements, want {self.size} x {n}")
        if ob is None:
            ob = np.empty(0, np.uint8)
        w = self._c.collective(
            _monel.Coll.GATHER,
            t,
            n,
            xb,
            ob,
            root=root,
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    @_stages_cuda(_out)
    def scatter(self, x, out, root: int = 0, async_op: bool = False) -> Work | None:
        """Gives rank r block r of the root's `x` (size * out.size elements) in `out`."""
        root = self._root(root)
        ob, t, on = as_bytes(out, "out", writable=True)
        if x is None:
            xb = np.empty(0, np.uint8)
        else:
            xb, xt, n = as_bytes(x, "input")
            if xt != t:
                raise InvalidArgumentError(f"input is {xt} but out is {t}")
            if self.rank == root and n != on * self.size:
                raise InvalidArgumentError(f"input has {n} elements, want {self.size} x {on}")
        w = self._c.collective(
            _monel.Coll.SCATTER,
            t,
            on,
            xb,
            ob,
            root=root,
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    def barrier(self, async_op: bool = False) -> Work | None:
        """Returns once every rank called it."""
        w = self._c.collective(
            _monel.Coll.BARRIER,
            _monel.DType.UINT8,
            0,
            None,
            np.empty(0, np.uint8),
            async_op=async_op,
            defer=self._defer,
        )
        return w if async_op else None

    # -- point to point --------------------------------------------------------------------

    @_stages_cuda(_nothing)
    def send(self, x, peer: int, async_op: bool = False, tag: int = 0) -> Work | None:
        """Sends `x` to `peer` (`ncclSend`), the message carrying `tag`; a large message waits
        for the receive, so two ranks that send to each other must use `group`."""
        return self.group([("send", x, peer, tag)], async_op)

    @_stages_cuda(_out)
    def recv(self, out, peer: int | None = None, async_op: bool = False, tag: int = 0):
        """Receives into `out` the first message from `peer` (`None`: from any rank) that
        carries `tag`; messages with other tags that arrive first wait for their own
        receives. The sizes must agree: a message of another size is an error, and it stays
        for a receive of its size. Returns the sender's rank, or with `async_op` a work
        whose `source` names it once done."""
        if peer is not None:
            self._peer(peer)
        b, t, n = as_bytes(out, "recv", writable=True)
        w = self._c.recv_from(b, n, t, peer, _tag(tag), async_op=async_op, defer=self._defer)
        return w if async_op else w.source

    def _peer(self, peer) -> int:
        if not isinstance(peer, int) or isinstance(peer, bool) or not 0 <= peer < self.size:
            raise InvalidArgumentError(f"peer {peer!r} is not a rank (0..{self.size - 1})")
        return peer

    def group(self, ops: Sequence[tuple], async_op: bool = False) -> Work | None:
        """Runs ("send", x, peer[, tag]) and ("recv", out, peer[, tag]) operations as one
        group, so any exchange pattern completes (`ncclGroupStart` .. `ncclGroupEnd`). A
        receive in a group takes the next message from its peer (or one with its tag set
        aside by an earlier `recv`); a next message with another tag is an error."""
        parts = []
        for o in ops:
            if len(o) not in (3, 4) or o[0] not in ("send", "recv"):
                raise InvalidArgumentError(
                    f"group operation {o!r}: want ('send'|'recv', buffer, peer[, tag])"
                )
            kind, buf, peer = o[:3]
            tag = _tag(o[3] if len(o) == 4 else 0)
            self._peer(peer)
            b, t, n = as_bytes(buf, kind, writable=kind == "recv")
            parts.append((kind == "send", b, n, t, peer, tag))
        w = self._c.group(parts, async_op=async_op, defer=self._defer)
        return w if async_op else None

    # -- symmetric memory --------------------------------------------------------------------

    def alloc_window(self, nbytes: int) -> _monel.Win:
        """Allocates a symmetric memory window of `nbytes` bytes (NCCL's `ncclMemAlloc` with
        `ncclCommWindowRegister`). Collective: every rank calls it, with the same size, in the
        same order as its other operations. The window exports writable bytes through the
        buffer protocol (`numpy.frombuffer(w, dtype)`, `torch.frombuffer(w, dtype=...)`), and
        every view keeps it mapped. When all ranks share this host (shared-memory connections
        between every pair), collectives whose buffers lie in windows on every rank, from
        4 KiB per rank, run directly between the ranks' memory (`w.shared`); otherwise the
        window is private memory and they take the ordinary path."""
        if int(nbytes) < 0:
            raise InvalidArgumentError(f"alloc_window: {nbytes} bytes")
        return self._c.alloc_window(int(nbytes))

    def empty(self, shape, dtype: Any = np.float32) -> np.ndarray:
        """A numpy array of `shape` and `dtype` (a numpy dtype) in a window of its own:
        `alloc_window` of its size, viewed. Collective, like `alloc_window`."""
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(d) for d in shape)
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        w = self.alloc_window(n * dt.itemsize)
        return np.frombuffer(w, dtype=dt, count=n).reshape(shape)

    # -- lifetime --------------------------------------------------------------------------

    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """`ncclCommSplit`: ranks with the same color form a new communicator ordered by
        key; `color=None` joins none and returns None. Every rank must call it."""
        c = self._c.split(color, key)
        return None if c is None else Communicator._wrap(c)

    def destroy(self) -> None:
        """Finishes queued operations and closes the connections."""
        self._c.destroy()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
