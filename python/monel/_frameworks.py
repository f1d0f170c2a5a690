"""What the framework modules (`monel.jax`, `monel.tensorflow`, `monel.keras`, `monel.mxnet`)
share: one communicator per process, joined from the launch variables, and collectives on
lists of numpy arrays with the small ones fused into one call per type (Horovod's tensor
fusion), results in 64-byte-aligned memory that JAX and TensorFlow adopt without a copy."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from monel import Communicator, InvalidArgumentError, MismatchError, MonelError

# Arrays under this many bytes travel in one fused buffer per type; larger ones alone.
FUSE_BELOW = 1 << 20
# XLA adopts host memory without a copy only at this alignment.
ALIGN = 64

_COMM: Communicator | None = None


def init(comm: Communicator | None = None) -> Communicator:
    """Joins the job (torchrun, Slurm, mpirun or MONEL_* variables, as `monel launch` sets
    them), or adopts `comm`; a second call returns the same communicator."""
    global _COMM
    if comm is not None:
        if _COMM is not None and _COMM is not comm:
            raise InvalidArgumentError("init: this process already has a communicator")
        _COMM = comm
    elif _COMM is None:
        _COMM = Communicator.from_env()
    return _COMM


def comm() -> Communicator:
    """The process's communicator (joined on first use)."""
    return _COMM if _COMM is not None else init()


def rank() -> int:
    """This process's rank."""
    return comm().rank


def size() -> int:
    """Ranks in the job."""
    return comm().size


def shutdown() -> None:
    """Finishes queued operations and leaves the job; `init` may join again."""
    global _COMM
    if _COMM is not None:
        _COMM.destroy()
        _COMM = None


_BOTH: dict = {}


def as_framework_error(e: MonelError, base: type, *args) -> Exception:
    """`e` as an instance of a class that is both its Monel type and the framework's
    exception `base` (built from `args`), so `except` clauses of either kind catch it."""
    kind = type(e)
    cls = _BOTH.get((kind, base))
    if cls is None:
        cls = _BOTH[(kind, base)] = type(
            kind.__name__, (base, kind), {"__module__": base.__module__}
        )
    err = cls(*args)
    if hasattr(e, "ranks"):
        err.ranks = e.ranks
    return err


def reduce_present(grads: Sequence, reduce) -> list:
    """`grads` with its non-None entries replaced by `reduce(list of them)` (a parameter
    without a gradient keeps None)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    out = list(grads)
    for i, g in zip(present, reduce([grads[i] for i in present])):
        out[i] = g
    return out


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dt = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip : skip + n].view(dt).reshape(shape)


def _contiguous(a) -> np.ndarray:
    """`a` as a C-contiguous array of its own shape (a copy only when it is not one;
    `np.ascontiguousarray` would turn a scalar into a vector)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class _Layout:
    """The check that every rank passed arrays of the same shapes and types in the same
    order: an 8-byte digest of this rank's list, all-gathered in flight beside the data (one
    small collective), so a mismatch is a typed error rather than silently mixed bytes."""

    def __init__(self, c: Communicator, arrays: Sequence[np.ndarray], what: str) -> None:
        self.key = [(a.shape, a.dtype.str) for a in arrays]
        self.what, self.rank = what, c.rank
        digest = hashlib.sha256(repr(self.key).encode()).digest()[:8]
        self.every = np.empty(c.size, np.int64)
        self.work = c.all_gather(np.frombuffer(digest, np.int64).copy(), self.every, async_op=True)

    def verify(self, works) -> None:
        """Waits for the check and for `works`; the check's failure comes first."""
        try:
            self.work.wait()
        except BaseException:
            _drain(works)
            raise
        odd = [r for r in range(len(self.every)) if self.every[r] != self.every[0]]
        if odd:
            _drain(works)
            raise MismatchError(
                f"{self.what}: ranks {odd} passed arrays of other shapes or types "
                f"than rank 0 (this rank, {self.rank}: {self.key})"
            )
        for w in works:
            w.wait()


def _drain(works) -> None:
    for w in works:
        try:
            w.wait()
        except Exception:
            pass


def all_reduce_many(
    arrays: Sequence[np.ndarray], op: str = "sum", inplace: bool = False
) -> list[np.ndarray]:
    """Reduces each array across ranks; returns new aligned arrays of the same shapes, or
    with `inplace` the (writable) arrays themselves, reduced.

    Arrays under `FUSE_BELOW` bytes are copied into one buffer per type, reduced in one
    call, and returned as aligned views of it (copied back in place); larger ones are
    reduced straight from the caller's memory. All calls are in flight together."""
    c = comm()
    arrays = [_contiguous(a) for a in arrays]
    layout = _Layout(c, arrays, "all_reduce")
    out: list = [None] * len(arrays)
    works = []
    fused: dict = {}
    for i, a in enumerate(arrays):
        if a.nbytes >= FUSE_BELOW:
            r = a if inplace else aligned_empty(a.shape, a.dtype)
            works.append(c.all_reduce(a, None if inplace else r, op=op, async_op=True))
            out[i] = r
        else:
            fused.setdefault(a.dtype, []).append(i)
    for dt, idx in fused.items():
        offsets, at = [], 0
        for i in idx:
            offsets.append(at)
            at += _padded(arrays[i].nbytes)
        buf = aligned_empty((at // dt.itemsize,), dt)
        raw = buf.view(np.uint8)
        raw[:] = 0
        for i, off in zip(idx, offsets):
            raw[off : off + arrays[i].nbytes] = arrays[i].reshape(-1).view(np.uint8)
        works.append(c.all_reduce(buf, op=op, async_op=True))
        for i, off in zip(idx, offsets):
            a = arrays[i]
            out[i] = raw[off : off + a.nbytes].view(dt).reshape(a.shape)
    layout.verify(works)
    if inplace:
        for i, a in enumerate(arrays):
            if out[i] is not a:
                a[...] = out[i]
                out[i] = a
    return out


def broadcast_many(
    arrays: Sequence[np.ndarray], root: int = 0, inplace: bool = False
) -> list[np.ndarray]:
    """The root's arrays on every rank: new aligned arrays, or with `inplace` the (writable)
    arrays themselves, overwritten. The ranks' shapes must agree."""
    c = comm()
    arrays = [_contiguous(a) for a in arrays]
    layout = _Layout(c, arrays, "broadcast")
    out = []
    works = []
    for a in arrays:
        r = a if inplace else aligned_empty(a.shape, a.dtype)
        if c.rank == root and not inplace:
            r[...] = a
        works.append(c.broadcast(r, root=root, async_op=True))
        out.append(r)
    layout.verify(works)
    return out


def all_gather(a: np.ndarray) -> np.ndarray:
    """Every rank's `a` concatenated along the first axis, in rank order: shape
    (size * a.shape[0], ...), or (size,) for a scalar."""
    c = comm()
    a = _contiguous(a)
    shape = (c.size * a.shape[0], *a.shape[1:]) if a.ndim else (c.size,)
    out = aligned_empty(shape, a.dtype)
    c.all_gather(a, out)
    return out


def reduce_scatter(a: np.ndarray, op: str = "sum") -> np.ndarray:
    """Reduces `a` (first axis divisible by the ranks) and keeps this rank's block."""
    c = comm()
    a = _contiguous(a)
    if a.ndim == 0 or a.shape[0] % c.size:
        raise InvalidArgumentError(
            f"reduce_scatter: the first axis ({a.shape}) must divide by {c.size} ranks"
        )
    out = aligned_empty((a.shape[0] // c.size, *a.shape[1:]), a.dtype)
    c.reduce_scatter(a, out, op=op)
    return out


def all_to_all(a: np.ndarray) -> np.ndarray:
    """Block j of `a`'s first axis goes to rank j; block i of the result came from rank i."""
    c = comm()
    a = _contiguous(a)
    if a.ndim == 0 or a.shape[0] % c.size:
        raise InvalidArgumentError(
            f"all_to_all: the first axis ({a.shape}) must divide by {c.size} ranks"
        )
    out = aligned_empty(a.shape, a.dtype)
    c.all_to_all(a, out)
    return out
