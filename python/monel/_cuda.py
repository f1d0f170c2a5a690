"""CUDA tensors through Monel's torch backend, staged through pinned host memory.

An operation on CUDA tensors is ordered after the work already queued on the caller's
current stream: a copy stream waits for it, uploads the operation's inputs into pinned host
buffers, and the CPU waits for that copy alone (never for the whole device). Monel then runs
the operation on the host buffers. The results go back on the copy stream, and the caller's
stream, not the CPU, waits for them: `Work.wait()` returns once they are queued, and a
work's future completes with events on them (a CUDA-aware future).

Staging buffers are pinned once and reused across calls, by power-of-two size, up to
`MONEL_CUDA_STAGING` bytes (default 1 GiB) kept; a buffer returns to the pool once the copy
that reads it has finished. An all_reduce of at least two pieces of `MONEL_CUDA_CHUNK` bytes
(default 4 MiB) is pipelined: piece k+1 goes down while Monel reduces piece k, and piece k
comes back up while Monel reduces piece k+1.

Where every rank of the group is on this host, the operations DDP and FSDP use most go
through CUDA IPC instead and never leave the GPU (`monel._cuda_ipc`). A process group works
on one CUDA device, the first its tensors were on (NCCL's rule); a tensor on another is
refused. This module is imported only when a CUDA tensor reaches the backend.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.futures import Future

from monel import CommTimeoutError, InvalidArgumentError
from monel._tensors import tensors_in

_POOL_BYTES = int(os.environ.get("MONEL_CUDA_STAGING") or (1 << 30))
_CHUNK = int(os.environ.get("MONEL_CUDA_CHUNK") or (4 << 20))


def _replace(x, host: dict):
    if isinstance(x, torch.Tensor):
        return host.get(id(x), x)
    if isinstance(x, list):
        return [_replace(y, host) for y in x]
    if isinstance(x, tuple):
        return tuple(_replace(y, host) for y in x)
    return x


class Staging:
    """Pinned host buffers, reused by power-of-two size, and one copy stream per device."""

    def __init__(self, limit: int = _POOL_BYTES) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[torch.Tensor]] = {}
        self._pending: list[tuple[torch.cuda.Event, list[torch.Tensor]]] = []
        self._kept = 0
        self._limit = limit
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def stream(self, device: torch.device, up: bool = False) -> torch.cuda.Stream:
        """The copy stream down to the host (`up`: the one back, for pipelined copies)."""
        with self._lock:
            s = self._streams.get((device, up))
            if s is None:
                s = self._streams[(device, up)] = torch.cuda.Stream(device=device)
            return s

    def take(self, nbytes: int) -> torch.Tensor:
        size = 1 << max(nbytes - 1, 4095).bit_length()
        with self._lock:
            self._reclaim()
            free = self._free.get(size)
            if free:
                self._kept -= size
                return free.pop()
        return torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def give_after(self, event: torch.cuda.Event, bufs: list[torch.Tensor]) -> None:
        """Returns `bufs` to the pool once `event` (the last copy that reads them) is done."""
        with self._lock:
            self._pending.append((event, bufs))
            self._reclaim()

    def _reclaim(self) -> None:
        keep = []
        for ev, bufs in self._pending:
            if not ev.query():
                keep.append((ev, bufs))
                continue
            for b in bufs:
                if self._kept + b.numel() <= self._limit:
                    self._free.setdefault(b.numel(), []).append(b)
                    self._kept += b.numel()
        self._pending = keep


STAGING = Staging()


def group_device(bound: torch.device | None, device: torch.device, what: str) -> torch.device:
    """The process group's device: the first one its CUDA tensors were on; a tensor on
    another is refused, as NCCL does."""
    if bound is not None and device != bound:
        raise InvalidArgumentError(
            f"monel {what}: a tensor on {device}, but this process group works on {bound}: "
            "move the tensor there, or use a process group made for that device"
        )
    return device


def _check(cuda: list[torch.Tensor], what: str, args) -> torch.device:
    device = cuda[0].device
    for t in cuda:
        if t.device != device:
            raise InvalidArgumentError(
                f"monel {what}: tensors on {device} and {t.device} in one call: put them on one device"
            )
        if t.is_sparse:
            raise InvalidArgumentError(
                f"monel {what}: a sparse CUDA tensor: reduce sparse tensors on the CPU"
            )
        if not t.is_contiguous():
            raise InvalidArgumentError(
                f"monel {what}: a CUDA tensor of shape {tuple(t.shape)} is not contiguous (call .contiguous())"
            )
    for t in (t for a in args for t in tensors_in(a)):
        if not t.is_cuda and t.numel():
            raise InvalidArgumentError(
                f"monel {what}: a CPU tensor and CUDA tensors on {device} in one call: put them on one device"
            )
    return device


def _stage(args: tuple, outputs, what: str, device: torch.device | None = None):
    """Uploads the CUDA tensors of `args` that are inputs into pinned host buffers on the
    copy stream (ordered after the caller's stream) and waits for that copy; returns the
    device, the copy stream, the host stand-ins by tensor id, the buffers, and the
    (device tensor, host tensor) pairs results land from. `device`: the call's, if its
    tensors were checked already."""
    if device is None:
        device = _check([t for a in args for t in tensors_in(a) if t.is_cuda], what, args)
    out_args = range(len(args)) if outputs is None else outputs
    outs = {id(t): t for i in out_args if i < len(args) for t in tensors_in(args[i]) if t.is_cuda}
    ins = {
        id(t): t
        for i, a in enumerate(args)
        if outputs is None or i not in outputs
        for t in tensors_in(a)
        if t.is_cuda
    }
    caller = torch.cuda.current_stream(device)
    copy = STAGING.stream(device)
    copy.wait_stream(caller)
    host, bufs = {}, []
    with torch.cuda.stream(copy):
        for t in {**outs, **ins}.values():
            nbytes = t.numel() * t.element_size()
            buf = STAGING.take(nbytes)
            bufs.append(buf)
            h = buf[:nbytes].view(t.dtype).view(t.shape)
            if id(t) in ins:
                h.copy_(t, non_blocking=True)
            t.record_stream(copy)
            host[id(t)] = h
        uploaded = torch.cuda.Event()
        uploaded.record(copy)
    uploaded.synchronize()  # this operation's inputs, not the device
    landing = [(t, host[id(t)]) for t in outs.values()]
    return device, copy, host, bufs, landing


def run(pg, name: str, method: Callable, args: tuple, kwargs: dict, outputs, op: str | None):
    """Runs the backend's operation `name` on CUDA tensors: through CUDA IPC where the
    group can, else staged through host memory (pipelined for a large all_reduce).
    `op`: the reduction's name, for the operations that reduce."""
    cuda = [t for a in args for t in tensors_in(a) if t.is_cuda]
    device = _check(cuda, name, args)
    pg._cuda_device = group_device(pg._cuda_device, device, name)
    from monel import _cuda_ipc

    if _cuda_ipc.eligible(name, args, op):
        if pg._cuda_ipc == "unset":
            pg._cuda_ipc = _cuda_ipc.setup(pg, device)
        if pg._cuda_ipc is not None and _cuda_ipc.wanted(pg._cuda_ipc, args):
            opts = args[-1] if len(args) > 1 else None
            return pg._timed(opts, lambda: _cuda_ipc.run(pg._cuda_ipc, name, args, op))
    if name == "allreduce" and len(args[0]) == 1 and op is not None:
        t = args[0][0]
        if t.numel() * t.element_size() >= 2 * _CHUNK:
            return _pipelined_allreduce(pg, t, op, args[1] if len(args) > 1 else None)
    return staged(pg, method, args, kwargs, outputs, name, device)


def _pipelined_allreduce(pg, t: torch.Tensor, op: str, opts):
    """A large all_reduce in pieces: each goes down on the copy stream, is reduced by Monel
    as soon as it is on the host, and goes back up on a second stream once reduced."""
    device = t.device
    caller = torch.cuda.current_stream(device)
    down = STAGING.stream(device)
    down.wait_stream(caller)
    nbytes = t.numel() * t.element_size()
    buf = STAGING.take(nbytes)
    host, flat = buf[:nbytes].view(t.dtype), t.view(-1)
    m = max(_CHUNK // t.element_size(), 1)
    pieces = []
    with torch.cuda.stream(down):
        for a in range(0, flat.numel(), m):
            b = min(flat.numel(), a + m)
            host[a:b].copy_(flat[a:b], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(down)
            pieces.append((a, b, ev))
    t.record_stream(down)
    works = []

    def issue():
        for a, b, ev in pieces:
            ev.synchronize()  # this piece is on the host; the next ones are still going down
            works.append(pg.comm.all_reduce(host[a:b], op=op, async_op=True))

    pg._timed(opts, issue)
    work = PipelinedWork(
        device, STAGING.stream(device, up=True), flat, host, pieces, works, [buf], [t]
    )
    if opts is not None and not getattr(opts, "asyncOp", True):
        work.wait()
        return None
    return work


def staged(pg, method: Callable, args: tuple, kwargs: dict, outputs, what: str, device):
    """Runs `method(pg, *args)` with every CUDA tensor staged through host memory (the
    call's tensors checked, on `device`). `outputs`: the indices of the arguments whose
    tensors receive results (`None`: every argument, for operations in place)."""
    device, copy, host, bufs, landing = _stage(args, outputs, what, device)
    inner = method(pg, *_replace(list(args), host), **kwargs)
    work = CudaWork(pg, inner, landing, device, copy, bufs, args[0])
    if inner is None:  # finished here (a blocking call): the caller's stream waits
        work.wait()
        return None
    return work


class Coalesced:
    """The CUDA sends and receives of one coalesced group (`batch_isend_irecv`): staged as
    they are added, landed once the group's work is done."""

    def __init__(self) -> None:
        self.device = self.copy = None
        self.landing: list = []
        self.bufs: list = []

    def finish(self, work) -> CudaWork:
        return CudaWork(None, work, self.landing, self.device, self.copy, self.bufs, None)


def staged_coalesced(pg, method: Callable, args: tuple, outputs, what: str):
    """A send or receive inside a coalesced group: staged now, landed by the group's work."""
    device, copy, host, bufs, landing = _stage(args, outputs, what)
    group = pg._coalesced_cuda
    if group is None:
        group = pg._coalesced_cuda = Coalesced()
    if group.device not in (None, device):
        raise InvalidArgumentError(
            f"monel {what}: a coalesced group on {group.device} and {device}: use one device"
        )
    group.device, group.copy = device, copy
    group.landing += landing
    group.bufs += bufs
    return method(pg, *_replace(list(args), host))


class CudaWork(dist._Work):
    """A staged operation: `wait()` waits for Monel on the CPU, queues the results' copy
    back, and makes the caller's current stream wait for it."""

    def __init__(self, pg, inner, landing, device, copy, bufs, value) -> None:
        super().__init__()
        self._inner, self._landing = inner, landing
        self._device, self._copy, self._bufs, self._value = device, copy, bufs, value
        self._landed: torch.cuda.Event | None = None
        self._lock = threading.Lock()
        self._future: Future | None = None

    def _land(self) -> torch.cuda.Event:
        with self._lock:
            if self._landed is not None:
                return self._landed
            if self._inner is not None:
                self._inner.wait()
            with torch.cuda.stream(self._copy):
                for t, h in self._landing:
                    t.copy_(h, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self._copy)
            STAGING.give_after(ev, self._bufs)
            self._landed = ev
            return ev

    def _finish(self) -> None:
        torch.cuda.current_stream(self._device).wait_event(self._land())

    def wait(self, timeout=None) -> bool:
        if timeout is not None and self._inner is not None:
            self._inner.wait(timeout)
        self._finish()
        return True

    def is_completed(self) -> bool:
        done = self._inner is None or self._inner.is_completed()
        return done and self._landed is not None and self._landed.query()

    def is_success(self) -> bool:
        return self._inner is None or self._inner.is_success()

    def get_future(self) -> Future:
        with self._lock:
            if self._future is None:
                self._future = Future(devices=[self._device])
                threading.Thread(target=self._complete, daemon=True).start()
            return self._future

    def _complete(self) -> None:
        fut = self._future
        assert fut is not None, "the future is made before this thread starts"
        try:
            self._finish()  # this thread's stream waits for the results; the future's
            fut.set_result(self._value)  # events are recorded after them
        except BaseException as e:  # the error goes to whoever waits on the future
            fut.set_exception(e)

    def result(self):
        return self._value

    def _source_rank(self) -> int:
        return self._inner._source_rank()

    source_rank = _source_rank


class PipelinedWork(CudaWork):
    """A pipelined all_reduce: each piece goes back up as soon as Monel has reduced it."""

    def __init__(self, device, up, flat, host, pieces, works, bufs, value) -> None:
        super().__init__(None, None, [], device, up, bufs, value)
        self._flat, self._host, self._pieces, self._works = flat, host, pieces, works

    def _land(self) -> torch.cuda.Event:
        with self._lock:
            if self._landed is not None:
                return self._landed
            for (a, b, _), w in zip(self._pieces, self._works):
                w.wait()
                with torch.cuda.stream(self._copy):
                    self._flat[a:b].copy_(self._host[a:b], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self._copy)
            self._flat.record_stream(self._copy)
            STAGING.give_after(ev, self._bufs)
            self._landed = ev
            return ev

    def wait(self, timeout=None) -> bool:
        if timeout is not None:
            secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            for w in self._works:
                if not w.wait(secs):
                    raise CommTimeoutError(
                        f"monel: Timed out waiting {secs * 1000:.0f} ms for the operation"
                    )
        self._finish()
        return True

    def is_completed(self) -> bool:
        return (
            all(w.is_completed() for w in self._works)
            and self._landed is not None
            and self._landed.query()
        )

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)
