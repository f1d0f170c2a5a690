"""Monel from MXNet (1.9, the last release): collectives on NDArrays (CPU), a distributed
`gluon.Trainer` and a broadcast of parameters (Horovod's shape).

    import monel.mxnet as mmx
    mmx.init()                                        # the launch variables: monel launch, ...
    net.initialize(...)
    mmx.broadcast_parameters(net.collect_params())    # rank 0's initial values everywhere
    trainer = mmx.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    ...
    loss.backward()
    trainer.step(local_batch)                         # gradients averaged over the ranks

NDArrays are read in place through DLPack; in-place results (`all_reduce_`, the trainer's
gradients, `broadcast_parameters`) are written straight into the NDArray's memory after
MXNet's engine is done with it (`MXNDArrayWaitToWrite`). New results are host buffers that
MXNet adopts without a copy. Small arrays are fused into one call per type: one copy in and
out of the fused buffer. Errors are raised as classes that are both Monel's and MXNet's
(`MXNetError`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, TypeAlias

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

import monel
from monel import InvalidArgumentError
from monel import _frameworks as fw
from monel._frameworks import init, rank, shutdown, size

__all__ = [
    "DistributedTrainer",
    "all_gather",
    "all_reduce",
    "all_reduce_",
    "all_to_all",
    "broadcast",
    "broadcast_",
    "broadcast_parameters",
    "init",
    "rank",
    "reduce_scatter",
    "shutdown",
    "size",
]

NDArrays: TypeAlias = mx.nd.NDArray | Sequence[mx.nd.NDArray]


def _as_mx(e: monel.MonelError) -> Exception:
    """`e` as a class that is both its Monel type and `mx.base.MXNetError`."""
    return fw.as_framework_error(e, mx.base.MXNetError, str(e))


def _surfaced(fn):
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except monel.MonelError as e:
            raise _as_mx(e) from e

    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    return run


def _check(x: Any, what: str) -> mx.nd.NDArray:
    if not isinstance(x, mx.nd.NDArray):
        raise InvalidArgumentError(f"{what}: want an mxnet NDArray, got {type(x).__name__}")
    if x.stype != "default":
        raise InvalidArgumentError(f"{what}: a {x.stype} NDArray; Monel takes dense ones")
    if x.context.device_type != "cpu":
        raise InvalidArgumentError(
            f"{what}: an NDArray on {x.context}; monel.mxnet takes CPU "
            "NDArrays (x.as_in_context(mx.cpu()))"
        )
    return x


class _Capsule:
    """A DLPack capsule as numpy's `from_dlpack` wants it."""

    def __init__(self, capsule) -> None:
        self.capsule = capsule

    def __dlpack__(self, stream=None):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def _read(x: mx.nd.NDArray) -> np.ndarray:
    """A read-only host view of `x` once MXNet has written it (no copy)."""
    x.wait_to_read()
    try:
        return np.from_dlpack(_Capsule(mx.nd.to_dlpack_for_read(x)))
    except (BufferError, TypeError, ValueError, RuntimeError, mx.base.MXNetError):
        return x.asnumpy()


def _write(x: mx.nd.NDArray) -> np.ndarray:
    """A writable host view of `x`'s own memory, once MXNet's pending reads and writes of it
    are done. numpy marks DLPack imports read-only, so this takes the data pointer (MXNet's
    C API `MXNDArrayGetData`); the view keeps `x` alive through its base chain."""
    check_call(_LIB.MXNDArrayWaitToWrite(x.handle))
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(x.handle, ctypes.byref(ptr)))
    nbytes = x.size * np.dtype(x.dtype).itemsize
    if not ptr.value or nbytes == 0:
        return np.empty(x.shape, x.dtype)
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
    buf._owner = x  # the memory belongs to x: keep it while any view lives
    return np.frombuffer(buf, np.uint8).view(x.dtype).reshape(x.shape)


def _adopt(a: np.ndarray) -> mx.nd.NDArray:
    """An NDArray on the memory of `a` (MXNet's `from_numpy(zero_copy=True)`; it marks `a`
    read-only, which suits a result nobody else holds)."""
    try:
        return mx.nd.from_numpy(a, zero_copy=True)
    except (TypeError, ValueError, mx.base.MXNetError):
        return mx.nd.array(a, dtype=a.dtype)


def _listed(x: NDArrays, what: str) -> tuple[list, bool]:
    one = isinstance(x, mx.nd.NDArray)
    xs = [x] if one else list(x)
    return [_check(t, what) for t in xs], one


@_surfaced
def all_reduce(x: NDArrays, op: str = "sum") -> NDArrays:
    """Reduces `x` (an NDArray or a list) across ranks ("sum", "avg", "min", "max", "prod")
    into new NDArrays."""
    xs, one = _listed(x, "all_reduce")
    outs = [_adopt(a) for a in fw.all_reduce_many([_read(t) for t in xs], op)]
    return outs[0] if one else outs


@_surfaced
def all_reduce_(x: NDArrays, op: str = "sum") -> None:
    """Reduces `x` (an NDArray or a list) across ranks in place."""
    xs, _ = _listed(x, "all_reduce_")
    fw.all_reduce_many([_write(t) for t in xs], op, inplace=True)


@_surfaced
def broadcast(x: NDArrays, root: int = 0) -> NDArrays:
    """The root's `x` (an NDArray or a list) on every rank, as new NDArrays."""
    xs, one = _listed(x, "broadcast")
    outs = [_adopt(a) for a in fw.broadcast_many([_read(t) for t in xs], root)]
    return outs[0] if one else outs


@_surfaced
def broadcast_(x: NDArrays, root: int = 0) -> None:
    """Overwrites `x` (an NDArray or a list) with the root's values, in place."""
    xs, _ = _listed(x, "broadcast_")
    fw.broadcast_many([_write(t) for t in xs], root, inplace=True)


def broadcast_parameters(params, root: int = 0) -> None:
    """Gives every rank rank `root`'s values of `params` (a gluon ParameterDict, a dict of
    Parameters or NDArrays, or a list of them), in place, on every context each lives on."""
    if hasattr(params, "items"):
        items = [v for _, v in sorted(params.items())]
    else:
        items = list(params)
    arrays: list[mx.nd.NDArray] = []
    for p in items:
        arrays += p.list_data() if isinstance(p, mx.gluon.Parameter) else [p]
    broadcast_(arrays, root)


def _per_array(fn, x, what):
    xs, one = _listed(x, what)
    outs = [_adopt(fn(_read(t))) for t in xs]
    return outs[0] if one else outs


@_surfaced
def all_gather(x: NDArrays) -> NDArrays:
    """Every rank's NDArray concatenated along the first axis in rank order."""
    return _per_array(fw.all_gather, x, "all_gather")


@_surfaced
def reduce_scatter(x: NDArrays, op: str = "sum") -> NDArrays:
    """Reduces each NDArray (first axis divisible by the ranks) and keeps this rank's
    block."""
    return _per_array(lambda a: fw.reduce_scatter(a, op), x, "reduce_scatter")


@_surfaced
def all_to_all(x: NDArrays) -> NDArrays:
    """Block j of each NDArray's first axis goes to rank j; block i of the result is rank
    i's."""
    return _per_array(fw.all_to_all, x, "all_to_all")


class DistributedTrainer(mx.gluon.Trainer):
    """`gluon.Trainer` whose gradients are summed over the ranks by Monel before the update,
    with the optimizer's gradient scale divided by the ranks: `step(local_batch)` applies
    the gradient of the global batch's mean loss. No kvstore is used."""

    def __init__(self, params, optimizer, optimizer_params=None) -> None:
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._scale /= size()

    def _allreduce_grads(self) -> None:
        grads = [g for p in self._params if p.grad_req != "null" for g in p.list_grad()]
        if any(len(p.list_grad()) > 1 for p in self._params if p.grad_req != "null"):
            raise InvalidArgumentError(
                "DistributedTrainer: parameters on several contexts; give each rank one"
            )
        all_reduce_(grads, "sum")
