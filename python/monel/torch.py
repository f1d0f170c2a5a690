"""torch.distributed backend "monel": `import monel.torch`, then
`torch.distributed.init_process_group(backend="monel")` under torchrun; DDP runs unmodified.

The process group is a Python `ProcessGroup` whose operations run on a Monel communicator
(shared memory between local ranks, the soft RoCE NIC or TCP between hosts). The ranks find
each other through torch's own store: rank 0 starts Monel's rendezvous and publishes its
unique id there. Every operation is issued to Monel at once (Monel runs them in order on its
own thread, without the GIL) and returns a `Work` whose `wait()` waits on Monel directly and
raises its error (timeouts name the ranks missing); `get_future()` (DDP's hooks) is completed
by a helper thread.
CPU and CUDA tensors (CUDA staged through pinned host memory in stream order: `monel._cuda`).
Point-to-point messages match by tag, and `recv(src=None)` takes any source;
per-call timeouts (`barrier(timeout=...)`, `Work.wait(timeout)`) hold; `monitored_barrier`
names the ranks that do not arrive; sparse tensors all-reduce with SUM, as on Gloo.
"""

from __future__ import annotations

import atexit
import functools
import os
import queue
import socket
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

import monel
from monel import _REDOPS, InvalidArgumentError, _monel
from monel._tensors import tensors_in

__all__ = ["BACKEND", "ProcessGroupMonel", "empty"]

BACKEND = "monel"

_ALL_REDUCE = _monel.Coll.ALL_REDUCE

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


def _call_timeout(opts) -> float | None:
    """A per-call timeout in seconds from torch's options (`None`: unset, the group's)."""
    t = getattr(opts, "timeout", None)
    if t is None:
        return None
    secs = t.total_seconds()
    return secs if secs > 0 else None


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

    def __init__(self, completer: _Completer, works, value, after=None):
        super().__init__()
        self._completer, self._works, self._value, self._after = completer, works, value, after
        self._future: Future | None = None

    def _finish(self) -> None:
        for w in self._works:
            w.wait()
        if self._after is not None:
            with _AFTER_LOCK:  # the waiter and the completer may both get here
                after, self._after = self._after, None
            if after is not None:
                after()

    def wait(self, timeout=None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if secs is not None and secs > 0:
            # torch's Work.wait(timeout): raise if it has not finished by then.
            end = time.monotonic() + secs
            for w in self._works:
                if not w.wait(max(end - time.monotonic(), 0.0)):
                    raise monel.CommTimeoutError(
                        f"monel: Timed out waiting {secs * 1000:.0f} ms for the operation"
                    )
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


_COMPLETERS: weakref.WeakSet[_Completer] = weakref.WeakSet()


@atexit.register
def _stop_completers() -> None:
    for c in list(_COMPLETERS):
        c.stop()


class _Batch:
    """Sends and receives held until something needs them; `works` once issued."""

    def __init__(self) -> None:
        self.ops: list = []
        self.works: list | None = None


class _LazyWork(_Work):
    """A send or receive held in a batch: asking about it issues the batch."""

    def __init__(self, pg: ProcessGroupMonel, batch: _Batch, value) -> None:
        super().__init__(pg._done, [], value)
        self._pg, self._batch = pg, batch

    def _issue(self) -> None:
        if self._batch.works is None:
            self._pg._flush_p2p()
        self._works = self._batch.works

    def _finish(self) -> None:
        self._issue()
        super()._finish()

    def wait(self, timeout=None) -> bool:
        self._issue()
        return super().wait(timeout)

    def is_completed(self) -> bool:
        self._issue()
        return super().is_completed()

    def is_success(self) -> bool:
        self._issue()
        return super().is_success()


class ProcessGroupMonel(dist.ProcessGroup):
    """A torch process group over one Monel communicator."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta | None = None):
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
        self._timeout = secs if secs is not None else float(os.environ.get("MONEL_TIMEOUT") or 300)
        # torch issues every operation asynchronously and waits for most at once: a wait()
        # within 5 ms runs the operation on the waiting thread, without a thread hop.
        self.comm._defer = True
        self._native = self.comm._c
        self._done = _Completer()
        self._coalesced: list | None = None
        self._coalesced_cuda = None  # CUDA receives of a coalesced group, landed at its end
        self._cuda_device = None  # the CUDA device this group works on (its first tensor's)
        self._cuda_ipc: Any = "unset"  # CUDA IPC between this host's ranks: set up, or None
        self._pending: _Batch | None = None  # isend/irecv not issued yet
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

    # A Python process group registers no backend with torch: say which device it serves,
    # as a registered backend would (monitored_barrier and new_group look).
    @property
    def _device_types(self):
        cuda = torch.cuda.is_available()
        return [torch.device("cpu")] + ([torch.device("cuda")] if cuda else [])

    def _timed(self, opts, issue):
        """Runs `issue()` (which issues Monel operations) under the call's own timeout, if
        torch gave one: the communicator's timeout is set around it, in order with the
        other operations."""
        t = _call_timeout(opts)
        if t is None or t == self._timeout:
            return issue()
        self.comm._c.set_timeout(t)
        try:
            return issue()
        finally:
            self.comm._c.set_timeout(self._timeout)

    # -- collectives -----------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if any(t.is_sparse for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        return self._allreduce(tensors, opts)

    def _sparse_allreduce(self, tensors, opts):
        """Sparse COO tensors, summed as Gloo does: every rank's indices and values are
        gathered, and each rank adds them up (the result is coalesced)."""
        if opts is not None and _op(opts.reduceOp) != "sum":
            raise InvalidArgumentError("monel: sparse tensors reduce with SUM only")
        n = self._size
        for t in tensors:
            t_c = t.coalesce()
            idx, val = t_c.indices().contiguous(), t_c.values().contiguous()
            counts = torch.zeros(n, dtype=torch.int64)
            self.comm.all_gather(torch.tensor([idx.shape[1]], dtype=torch.int64), counts)
            most = int(counts.max())
            pad_i = torch.zeros((idx.shape[0], most), dtype=torch.int64)
            pad_i[:, : idx.shape[1]] = idx
            pad_v = torch.zeros((most,) + tuple(val.shape[1:]), dtype=val.dtype)
            pad_v[: val.shape[0]] = val
            all_i = torch.empty((n,) + tuple(pad_i.shape), dtype=torch.int64)
            all_v = torch.empty((n,) + tuple(pad_v.shape), dtype=val.dtype)
            self.comm.all_gather(pad_i, all_i)
            self.comm.all_gather(pad_v, all_v)
            k = [int(c) for c in counts]
            ii = torch.cat([all_i[r][:, : k[r]] for r in range(n)], dim=1)
            vv = torch.cat([all_v[r][: k[r]] for r in range(n)])
            total = torch.sparse_coo_tensor(ii, vv, t.shape).coalesce()
            t.copy_(total)
        return self._done.done(tensors)

    def _allreduce(self, tensors, opts=None):
        op = "sum" if opts is None else _op(opts.reduceOp)
        # The hot path of DDP: straight to the native call (the checks are as_bytes's).
        coll = self._native.collective
        if opts is not None and not getattr(opts, "asyncOp", True) and len(tensors) == 1:
            # A blocking torch call (`dist.all_reduce(t)`): run it here, on this thread with
            # the GIL released, and return no work, which torch reads as "synchronized by the
            # backend" (its collectives wait only on a work that is not None).
            v, dtype, n = monel.as_bytes(tensors[0], "tensor", True)
            coll(_ALL_REDUCE, dtype, n, None, v, op=_REDOPS[op])
            return None
        works = []
        for t in tensors:
            v, dtype, n = monel.as_bytes(t, "tensor", True)
            works.append(
                coll(
                    _ALL_REDUCE,
                    dtype,
                    n,
                    None,
                    v,
                    op=_REDOPS[op],
                    async_op=True,
                    defer=True,
                )
            )
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
        works = [
            self.comm.all_gather(i.contiguous(), o, async_op=True) for o, i in zip(outputs, inputs)
        ]
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
        ops = [
            ("send", input_tensors[p].contiguous(), p) for p in range(n) if input_tensors[p].numel()
        ]
        staged = [
            o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
            for o in output_tensors
        ]
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

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False):
        """Rank 0 waits for every rank within `timeout` and names the first missing one
        (every one with `wait_all_ranks`); the others learn if rank 0 gave up."""
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        self._flush_p2p()
        w = self.comm._c.monitored_barrier(
            self._timeout if secs is None else max(float(secs), 0.0),
            wait_all=wait_all_ranks,
            async_op=True,
        )
        w.wait()

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][i] gets rank r's input_list[i] (one dtype, as torch checks): the
        inputs travel as one all-gather."""
        if not input_list:
            return self._done.done(output_lists)
        flat = torch.cat([t.reshape(-1) for t in input_list])
        gathered = torch.empty(self._size * flat.numel(), dtype=flat.dtype)
        works = [self.comm.all_gather(flat, gathered, async_op=True)]

        def scatter_back():
            for r, part in enumerate(gathered.split(flat.numel())):
                at = 0
                for out in output_lists[r]:
                    out.copy_(part[at : at + out.numel()].view(out.shape))
                    at += out.numel()

        return self._done.track(works, output_lists, scatter_back)

    # -- point to point --------------------------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        if self._coalesced is not None:
            self._coalesced += [("send", t.contiguous(), dst, tag) for t in tensors]
            return self._done.done(tensors)
        return self._lazy([("send", t.contiguous(), dst, tag) for t in tensors], tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        """Receives the first message from `src` that carries `tag` (as Gloo matches)."""
        if self._coalesced is not None:
            self._coalesced += [("recv", t, src, tag) for t in tensors]
            return self._done.done(tensors)
        return self._lazy([("recv", t, src, tag) for t in tensors], tensors)

    # -- isend/irecv: Monel runs operations in order, so a receive issued before a send it
    # depends on (`irecv` then `isend`, as batch_isend_irecv does without coalescing) would
    # wait forever. Sends and receives are held until something needs them (a wait, any
    # other operation), then issued together: as one group when each peer has at most one
    # receive among them (any exchange completes), else one by one, sends first (receives
    # from one peer with several tags keep their matching by tag).

    def _lazy(self, ops, value):
        batch = self._pending
        if batch is None:
            batch = self._pending = _Batch()
        batch.ops += ops
        return _LazyWork(self, batch, value)

    def _flush_p2p(self) -> None:
        batch, self._pending = self._pending, None
        if batch is None or batch.works is not None:
            return
        ops = batch.ops
        peers = [p for k, _, p, _ in ops if k == "recv"]
        if len(ops) > 1 and len(peers) == len(set(peers)):
            batch.works = [self.comm.group(ops, async_op=True)]
            return
        order = [o for o in ops if o[0] == "send"] + [o for o in ops if o[0] == "recv"]
        batch.works = [
            (self.comm.send if k == "send" else self.comm.recv)(t, p, async_op=True, tag=tag)
            for k, t, p, tag in order
        ]

    def recv_anysource(self, tensors, tag: int = 0):
        """`recv(src=None)`: the first message with `tag` from any rank; the work's
        `_source_rank()` names it."""
        self._flush_p2p()
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
        self._flush_p2p()
        self._coalesced = []
        self._coalesced_cuda = None

    def end_coalescing(self, device):
        ops, self._coalesced = self._coalesced or [], None
        if not ops:
            return self._done.done(None)
        work = self._done.track([self.comm.group(ops, async_op=True)], None)
        staged, self._coalesced_cuda = self._coalesced_cuda, None
        return staged.finish(work) if staged is not None else work

    # -- lifetime --------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._flush_p2p()
        if self._cuda_ipc not in ("unset", None):
            self._cuda_ipc.close()
        self.comm.destroy()
        self._done.stop()

    def abort(self) -> None:
        self.shutdown()


# Every operation the backend has, and where its results land (argument indices; None: in
# place, every argument; () for none).
_OUTPUTS = {
    "allreduce": None,
    "broadcast": None,
    "reduce": None,
    "allgather": (0,),
    "all_gather_single": (0,),
    "_allgather_base": (0,),
    "allgather_into_tensor_coalesced": (0,),
    "allgather_coalesced": (0,),
    "reduce_scatter": (0,),
    "reduce_scatter_single": (0,),
    "_reduce_scatter_base": (0,),
    "reduce_scatter_tensor_coalesced": (0,),
    "alltoall": (0,),
    "all_to_all_single": (0,),
    "alltoall_base": (0,),
    "gather": (0,),
    "scatter": (0,),
    "barrier": (),
    "send": (),
    "recv": (0,),
    "recv_anysource": (0,),
}
# Sends and receives join the held batch (recv_anysource issues it itself).
_P2P = ("send", "recv", "recv_anysource")


def _entry(method, name: str):
    """Every operation's way in: held sends and receives go before any other operation;
    torch's per-call timeout (`opts.timeout`) holds for it; CUDA tensors are staged through
    host memory (`monel._cuda`, imported only when a CUDA tensor arrives)."""
    outputs = _OUTPUTS[name]
    p2p = name in _P2P

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if not p2p and self._pending is not None:
            self._flush_p2p()
        opts = kwargs.get("opts", args[-1] if args else None)
        op = method
        if _call_timeout(opts) is not None:

            def op(pg, *a, **k):
                return pg._timed(opts, lambda: method(pg, *a, **k))

        if not any(t.is_cuda for a in args for t in tensors_in(a)):
            return op(self, *args, **kwargs)
        from monel import _cuda

        if self._coalesced is not None and name in ("send", "recv"):
            return _cuda.staged_coalesced(self, op, args, outputs, name)
        red = getattr(opts, "reduceOp", None)
        return _cuda.run(self, name, op, args, kwargs, outputs, None if red is None else _op(red))

    return run


for _name in _OUTPUTS:
    setattr(ProcessGroupMonel, _name, _entry(getattr(ProcessGroupMonel, _name), _name))


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
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    # torch's flight recorder hooks into a group through a C++ backend, which a Python
    # process group does not have (it skips one that reports no device): keep it off
    # Monel's groups, which report the CPU device.
    _fr = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(_fr, set):
        _fr.add(BACKEND)
