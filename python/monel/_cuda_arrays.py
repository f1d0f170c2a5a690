"""CUDA arrays in `monel.Communicator`: torch CUDA tensors, and any array that exposes
`__cuda_array_interface__` (CuPy, Numba) or CUDA DLPack (JAX on a GPU), viewed by torch
without a copy and staged through pinned host memory (`monel._cuda`'s pool).

An operation is ordered after the work queued on torch's current stream (the copy down
waits for it), and its results are in the caller's arrays when the call returns (or, with
`async_op=True`, when `wait()` returns). Imported only when a CUDA array reaches a
communicator; needs torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from monel import InvalidArgumentError

_DL_CUDA = (2, 13)  # DLPack: CUDA, CUDA managed


def on_cuda(x: Any) -> bool:
    """Whether `x` is an array in CUDA memory (cheap for numpy arrays and CPU tensors)."""
    dev = getattr(x, "device", None)
    if getattr(dev, "type", None) == "cuda":
        return True
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return True
        dl = getattr(x, "__dlpack_device__", None)
        return dl is not None and int(dl()[0]) in _DL_CUDA
    except Exception:
        return False


def _as_torch(x: Any, what: str):
    try:
        import torch
    except ImportError as e:
        raise InvalidArgumentError(
            f"{what}: a CUDA array needs torch installed to be staged"
        ) from e
    try:
        if isinstance(x, torch.Tensor):
            t = x
        elif hasattr(x, "__cuda_array_interface__"):
            t = torch.as_tensor(x)
        else:
            t = torch.from_dlpack(x)
    except Exception as e:
        raise InvalidArgumentError(f"{what}: torch cannot view this CUDA array: {e}") from e
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"{what}: the CUDA array is not contiguous (make it contiguous first)"
        )
    return t


class StagedWork:
    """An operation on CUDA arrays in flight: `wait()` waits for Monel, then copies the
    results back into the caller's arrays."""

    def __init__(self, inner, landing: list, bufs: list) -> None:
        self._inner, self._landing, self._bufs = inner, landing, bufs

    def wait(self, timeout: float | None = None) -> bool:
        if not self._inner.wait(timeout):
            return False
        if self._landing:
            for dev, host in self._landing:
                dev.copy_(host)  # from pinned memory, synchronous
            self._landing = []
            _give_back(self._bufs)
        return True

    def is_completed(self) -> bool:
        return self._inner.is_completed() and not self._landing

    def is_success(self) -> bool:
        return self._inner.is_success()

    @property
    def source(self) -> int | None:
        return self._inner.source


def _give_back(bufs: list) -> None:
    import torch

    from monel._cuda import STAGING

    ev = torch.cuda.Event()
    ev.record()
    STAGING.give_after(ev, bufs)


def call(method: Callable, self, args: tuple, kwargs: dict, writes: Callable):
    """Runs `method` with every CUDA array argument staged on the host. `writes(bound)`
    names the arguments whose arrays receive results."""
    from monel._cuda import STAGING

    bound = inspect.signature(method).bind(self, *args, **kwargs)
    bound.apply_defaults()
    out_names = writes(bound.arguments)
    landing, bufs = [], []
    for name, v in list(bound.arguments.items()):
        if name == "self" or v is None or not on_cuda(v):
            continue
        t = _as_torch(v, name)
        nbytes = t.numel() * t.element_size()
        buf = STAGING.take(nbytes)
        bufs.append(buf)
        host = buf[:nbytes].view(t.dtype).view(t.shape)
        if name != "out":
            host.copy_(t)  # down to pinned memory: waits for the current stream's work
        bound.arguments[name] = host
        if name in out_names:
            landing.append((t, host))
    res = method(*bound.args, **bound.kwargs)
    if bound.arguments.get("async_op"):
        return StagedWork(res, landing, bufs)
    for dev, host in landing:
        dev.copy_(host)
    _give_back(bufs)
    return res
