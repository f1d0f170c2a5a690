"""torch.distributed backend "monel": `import monel.torch`, then
`torch.distributed.init_process_group(backend="monel")` under torchrun; DDP runs unmodified.

The process group is a Python `ProcessGroup` whose operations run on a Monel communicator
(shared memory between local ranks, the soft RoCE NIC or TCP between hosts). The ranks find
each other through torch's own store: rank 0 starts Monel's rendezvous and publishes its
unique id there. Every operation is issued to Monel at once (Monel runs them in order on its
own thread, without the GIL) and returns a `Work` whose `wait()` waits on Monel directly and
raises its error (timeouts name the ranks missing); `get_future()` (DDP's hooks) is completed
by a helper thread.
CPU tensors only.
"""

from __future__ import annotations

import atexit
import os
import queue
import socket
import threading
import weakref
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch.futures import Future

import monel
from monel import InvalidArgumentError

__all__ = ["ProcessGroupMonel", "BACKEND", "empty"]

BACKEND = "monel"

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


_SUM = dist.ReduceOp.SUM


def _op(reduce_op) -> str:
    if reduce_op == _SUM:
        return "sum"
    for k, v in _OPS.items():
        if reduce_op == k:
            return v
    raise InvalidArgumentError(f"reduction {reduce_op} is not supported by monel")


def _root_ip() -> str:
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


class _Work(dist._Work):
    """Monel operations behind one torch Work: `wait()` waits on them directly (and runs them
    on the waiting thread when Monel has not started them yet); a future, for DDP's hooks
    and `get_future()`, is made only when asked for and completed by the completer thread."""

    def __init__(self, completer: "_Completer", works, value, after=None):
        super().__init__()
        self._completer, self._works, self._value, self._after = completer, works, value, after
        self._future: Optional[Future] = None

    def _finish(self) -> None:
        for w in self._works:
            w.wait()
        if self._after is not None:
            with _AFTER_LOCK:  # the waiter and the completer may both get here
                after, self._after = self._after, None
            if after is not None:
                after()

    def wait(self, timeout=None) -> bool:
        self._finish()
        fut = self._future
        if fut is not None:
            fut.wait()  # done once wait() returns, as torch's own backends do
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def get_future(self) -> Future:
        with _AFTER_LOCK:
            if self._future is None:
                self._future = Future()
                self._completer.complete(self, self._future)
            return self._future

    def result(self):
        return self._value

    def _source_rank(self) -> int:
        """The rank a receive from any source took its message from (after `wait()`)."""
        self._finish()
        for w in self._works:
            if w.source is not None:
                return w.source
        raise RuntimeError("monel: this work is not a receive from any source")

    source_rank = _source_rank


_AFTER_LOCK = threading.Lock()

class _Completer:
    """Completes the futures asked of works, in order, on one daemon thread."""

    def __init__(self) -> None:
        self._q: queue.Queue = queue.Queue()
        self._t = threading.Thread(target=self._run, name="monel-completer", daemon=True)
        self._t.start()
        _COMPLETERS.add(self)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            work, fut = item
            try:
                work._finish()
                fut.set_result(work._value)
            except BaseException as e:  # the error goes to whoever waits on the future
                fut.set_exception(e)

    def complete(self, work: _Work, fut: Future) -> None:
        self._q.put((work, fut))

    def track(self, works, value, after=None) -> _Work:
        return _Work(self, works, value, after)

    def done(self, value) -> _Work:
        return _Work(self, [], value)

    def stop(self) -> None:
        """Ends the thread and waits for it: a daemon thread still inside torch's C++ when
        the interpreter finalizes would be torn down mid-call (std::terminate)."""
        if self._t.is_alive():
            self._q.put(None)
            if threading.current_thread() is not self._t:
                self._t.join()


_COMPLETERS: "weakref.WeakSet[_Completer]" = weakref.WeakSet()


@atexit.register
def _stop_completers() -> None:
    for c in list(_COMPLETERS):
        c.stop()


class ProcessGroupMonel(dist.ProcessGroup):
    """A torch process group over one Monel communicator."""

    def __init__(self, store, rank: int, size: int, timeout: Optional[timedelta] = None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        key = "monel/unique_id"
        if rank == 0:
            uid = monel.create_unique_id(f"{_root_ip()}:0")
            store.set(key, uid)
        else:
            uid = store.get(key).decode()
        secs = timeout.total_seconds() if timeout is not None else None
        if os.environ.get("MONEL_TIMEOUT"):
            secs = None  # the user's MONEL_TIMEOUT wins
        self.comm = monel.Communicator(size, rank, uid, timeout=secs)
        # torch issues every operation asynchronously and waits for most at once: a wait()
        # within 50 us runs the operation on the waiting thread, without a thread hop.
        self.comm._defer = True
        self._native = self.comm._c
        self._done = _Completer()
        self._coalesced: Optional[list] = None
        self._group_name = self._group_desc = ""

    # -- identity --------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    # torch names groups through their C++ backends, and a Python process group has none:
    # keep the name and description here (DeviceMesh and FSDP look groups up by name).
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    # -- collectives -----------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = "sum" if opts is None else _op(opts.reduceOp)
        # The hot path of DDP: straight to the native call (the checks are as_bytes's).
        coll = self._native.collective
        if opts is not None and not getattr(opts, "asyncOp", True) and len(tensors) == 1:
            # A blocking torch call (`dist.all_reduce(t)`): run it here, on this thread with
            # the GIL released, and return no work, which torch reads as "synchronized by the
            # backend" (its collectives wait only on a work that is not None).
            v, dtype, n = monel.as_bytes(tensors[0], "tensor", True)
            coll("all_reduce", dtype, n, None, v, op, 0, False, False)
            return None
        works = []
        for t in tensors:
            v, dtype, n = monel.as_bytes(t, "tensor", True)
            works.append(coll("all_reduce", dtype, n, None, v, op, 0, True, True))
        return _Work(self._done, works, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        works = [self.comm.broadcast(t, root=opts.rootRank, async_op=True) for t in tensors]
        return self._done.track(works, tensors)

    def reduce(self, tensors, opts):
        works = [
            self.comm.reduce(t, root=opts.rootRank, op=_op(opts.reduceOp), async_op=True)
            for t in tensors
        ]
        return self._done.track(works, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        works, copies = [], []
        for outs, inp in zip(output_tensors, input_tensors):
            flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype)
            works.append(self.comm.all_gather(inp.contiguous(), flat, async_op=True))
            copies.append((outs, flat, inp.shape))

        def scatter_back():
            for outs, flat, shape in copies:
                for o, part in zip(outs, flat.chunk(self._size)):
                    o.copy_(part.view(shape))

        return self._done.track(works, output_tensors, scatter_back)

    def all_gather_single(self, output, input, opts=None):
        w = self.comm.all_gather(input.contiguous(), output, async_op=True)
        return self._done.track([w], output)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.comm.all_gather(i.contiguous(), o, async_op=True) for o, i in zip(outputs, inputs)]
        return self._done.track(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        works = []
        for out, parts in zip(output_tensors, input_lists):
            flat = torch.cat([p.reshape(-1) for p in parts])
            works.append(self.comm.reduce_scatter(flat, out, op=op, async_op=True))
        return self._done.track(works, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        w = self.comm.reduce_scatter(input.contiguous(), output, op=op, async_op=True)
        return self._done.track([w], output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        works = [
            self.comm.reduce_scatter(i.contiguous(), o, op=op, async_op=True)
            for o, i in zip(outputs, inputs)
        ]
        return self._done.track(works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self._size
        if not output_split_sizes and not input_split_sizes:
            w = self.comm.all_to_all(input.contiguous(), output, async_op=True)
            return self._done.track([w], output)
        # Uneven splits (along dim 0): one group of sends and receives.
        ins = self._split(input.contiguous(), input_split_sizes)
        outs = self._split(output, output_split_sizes)
        ops = [("send", ins[p], p) for p in range(n) if ins[p].numel()]
        ops += [("recv", outs[p], p) for p in range(n) if outs[p].numel()]
        w = self.comm.group(ops, async_op=True)
        return self._done.track([w], output)

    alltoall_base = all_to_all_single

    def _split(self, t, sizes):
        if not sizes:
            return list(t.chunk(self._size))
        return list(t.split(list(sizes)))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._size
        ops = [("send", input_tensors[p].contiguous(), p) for p in range(n) if input_tensors[p].numel()]
        staged = [o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
                  for o in output_tensors]
        ops += [("recv", staged[p], p) for p in range(n) if staged[p].numel()]
        w = self.comm.group(ops, async_op=True)

        def back():
            for o, s in zip(output_tensors, staged):
                if o is not s:
                    o.copy_(s)

        return self._done.track([w], output_tensors, back)

    def gather(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        inp = input_tensors[0].contiguous()
        if self._rank == root:
            flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype)
            w = self.comm.gather(inp, flat, root=root, async_op=True)

            def back():
                for o, part in zip(output_tensors[0], flat.chunk(self._size)):
                    o.copy_(part.view(o.shape))

            return self._done.track([w], output_tensors, back)
        w = self.comm.gather(inp, None, root=root, async_op=True)
        return self._done.track([w], output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        out = output_tensors[0]
        flat = None
        if self._rank == root:
            flat = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        w = self.comm.scatter(flat, out, root=root, async_op=True)
        return self._done.track([w], output_tensors)

    def barrier(self, opts=None):
        return self._done.track([self.comm.barrier(async_op=True)], None)

    # -- point to point --------------------------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        if self._coalesced is not None:
            self._coalesced += [("send", t.contiguous(), dst, tag) for t in tensors]
            return self._done.done(tensors)
        works = [self.comm.send(t.contiguous(), dst, async_op=True, tag=tag) for t in tensors]
        return self._done.track(works, tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        """Receives the first message from `src` that carries `tag` (as Gloo matches)."""
        if self._coalesced is not None:
            self._coalesced += [("recv", t, src, tag) for t in tensors]
            return self._done.done(tensors)
        works = [self.comm.recv(t, src, async_op=True, tag=tag) for t in tensors]
        return self._done.track(works, tensors)

    def recv_anysource(self, tensors, tag: int = 0):
        """`recv(src=None)`: the first message with `tag` from any rank; the work's
        `_source_rank()` names it."""
        works = [self.comm.recv(t, None, async_op=True, tag=tag) for t in tensors]
        return self._done.track(works, tensors)

    # -- coalescing (batch_isend_irecv): the sends and receives run as one Monel group, so
    # any exchange pattern completes; the work that counts is the one end_coalescing returns.

    def _get_backend(self, device):
        return self

    @property
    def supports_coalescing(self) -> bool:
        return True

    def start_coalescing(self, device) -> None:
        self._coalesced = []

    def end_coalescing(self, device):
        ops, self._coalesced = self._coalesced or [], None
        if not ops:
            return self._done.done(None)
        return self._done.track([self.comm.group(ops, async_op=True)], None)

    # -- lifetime --------------------------------------------------------------------------

    def shutdown(self) -> None:
        self.comm.destroy()
        self._done.stop()

    def abort(self) -> None:
        self.shutdown()


def empty(size, dtype: torch.dtype = torch.float32, group=None) -> torch.Tensor:
    """A CPU tensor of `size` and `dtype` in a symmetric memory window of the Monel process
    group `group` (default: the world). Collective: every rank of the group calls it, in the
    same order as its other operations. Collectives on such tensors (or slices of them) run
    directly between the ranks' memory when the group's ranks share one host (NCCL's
    `ncclMemAlloc`, torch's symmetric memory); the tensor keeps its window mapped."""
    pg = group if group is not None else dist.group.WORLD
    get = getattr(pg, "_get_backend", None)
    backend = get(torch.device("cpu")) if get is not None else None
    if not isinstance(backend, ProcessGroupMonel):
        raise InvalidArgumentError(
            "monel.torch.empty: the group is not a Monel process group "
            "(init_process_group(backend='monel'))"
        )
    size = (int(size),) if isinstance(size, int) else tuple(int(d) for d in size)
    n = 1
    for d in size:
        n *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    w = backend.comm.alloc_window(n * itemsize)
    if n == 0:
        return torch.empty(size, dtype=dtype)
    return torch.frombuffer(w, dtype=dtype, count=n).view(size)


def _create(store, rank, size, timeout):
    return ProcessGroupMonel(store, rank, size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
