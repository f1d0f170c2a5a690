"""The CUDA checks of Monel's torch backend, run by scripts/gpu-check.sh under torchrun on a
machine with a GPU (every rank on the current one).

    torchrun --nproc-per-node 2 python/tests/gpu_check.py ops     # every operation, checked
    torchrun --nproc-per-node 2 python/tests/gpu_check.py fsdp    # FSDP2 against one process
    torchrun --nproc-per-node 2 python/tests/gpu_check.py race monel|gloo
    python python/tests/gpu_check.py comm                         # monel.Communicator, 2 ranks

`ops`: every operation the backend has, on CUDA tensors of several dtypes and sizes (1
element to 64 MiB), in place and out of place, async and blocking, each result compared
bit for bit with the same operation on CPU tensors; stream order (an operation sees the
work queued before it on the caller's stream, and work queued after `wait()` sees its
result); bad input (mixed devices, non-contiguous) refused with the communicator usable
after. `MONEL_CUDA_IPC=0` checks the path staged through host memory instead of CUDA IPC.
`fsdp`: FSDP2 on a CUDA module against the same model trained in one process. `comm`:
monel.Communicator on CUDA tensors, `__cuda_array_interface__` and DLPack objects. `race`:
float32 all_reduce, 1 KiB to 64 MiB, medians, on CUDA tensors (and on CPU tensors, for the
staging's cost). Rank 0 prints one JSON line per result.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.float64]


def data(n, dtype, salt):
    return ((torch.arange(n, dtype=torch.int64) * 7 + salt) % 23).to(dtype)


def same(got, want, what):
    got = got.cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:4].flatten().tolist()
        raise AssertionError(f"{what}: CUDA and CPU results differ at {bad}")


def each_op(dev, n, dtype, r, w, checks):
    """Runs every operation on `dev` tensors; returns their results on the CPU."""
    out = {}
    t = data(n, dtype, r).to(dev)
    dist.all_reduce(t)
    out["all_reduce"] = t
    t = data(n, dtype, r + 1).to(dev)
    dist.all_reduce(t, async_op=True).wait()
    out["all_reduce_async"] = t
    t = data(n, dtype, r).to(dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t
    t = data(n, dtype, r * 3).to(dev)
    dist.broadcast(t, src=w - 1)
    out["broadcast"] = t
    t = data(n, dtype, r).to(dev)
    dist.reduce(t, dst=0)
    out["reduce"] = t if r == 0 else torch.zeros(0)
    outs = [torch.zeros(n, dtype=dtype, device=dev) for _ in range(w)]
    dist.all_gather(outs, data(n, dtype, r).to(dev))
    out["all_gather"] = torch.cat(outs)
    flat = torch.zeros(w * n, dtype=dtype, device=dev)
    dist.all_gather_into_tensor(flat, data(n, dtype, r).to(dev))
    out["all_gather_into_tensor"] = flat
    flat = torch.zeros(w * n, dtype=dtype, device=dev)
    flat[r * n : (r + 1) * n] = data(n, dtype, r + 5).to(dev)
    dist.all_gather_into_tensor(flat, flat[r * n : (r + 1) * n])  # in place, as FSDP does
    out["all_gather_in_place"] = flat
    rs = torch.zeros(n, dtype=dtype, device=dev)
    dist.reduce_scatter(rs, [c.to(dev) for c in data(w * n, dtype, r).chunk(w)])
    out["reduce_scatter"] = rs
    rs = torch.zeros(n, dtype=dtype, device=dev)
    dist.reduce_scatter_tensor(rs, data(w * n, dtype, r + 2).to(dev))
    out["reduce_scatter_tensor"] = rs
    a2a = torch.zeros(w * n, dtype=dtype, device=dev)
    dist.all_to_all_single(a2a, data(w * n, dtype, r).to(dev))
    out["all_to_all_single"] = a2a
    # Uneven: rank q sends q + 1 + p elements to rank p.
    ins = data(sum(r + 1 + p for p in range(w)), dtype, r).to(dev)
    outu = torch.zeros(sum(q + 1 + r for q in range(w)), dtype=dtype, device=dev)
    dist.all_to_all_single(
        outu,
        ins,
        output_split_sizes=[q + 1 + r for q in range(w)],
        input_split_sizes=[r + 1 + p for p in range(w)],
    )
    out["all_to_all_uneven"] = outu
    outl = [torch.zeros(n, dtype=dtype, device=dev) for _ in range(w)]
    dist.all_to_all(outl, [data(n, dtype, r * 10 + p).to(dev) for p in range(w)])
    out["all_to_all"] = torch.cat(outl)
    g = [torch.zeros(n, dtype=dtype, device=dev) for _ in range(w)] if r == 0 else None
    dist.gather(data(n, dtype, r).to(dev), g, dst=0)
    out["gather"] = torch.cat(g) if r == 0 else torch.zeros(0)
    sc = torch.zeros(n, dtype=dtype, device=dev)
    dist.scatter(sc, [data(n, dtype, p).to(dev) for p in range(w)] if r == 0 else None, src=0)
    out["scatter"] = sc
    if r == 0:
        dist.send(data(n, dtype, 9).to(dev), dst=w - 1, tag=3)
        out["send_recv"] = torch.zeros(0)
    else:
        x = torch.zeros(n, dtype=dtype, device=dev)
        if r == w - 1:
            dist.recv(x, src=0, tag=3)
        out["send_recv"] = x
    if os.environ.get("GPU_CHECK_NO_BATCH"):
        print("batch_isend_irecv: LEFT OUT (GPU_CHECK_NO_BATCH)", file=sys.stderr, flush=True)
        dist.barrier()
        checks[0] += len(out)
        return {k: v.cpu() for k, v in out.items()}
    recv = torch.zeros(n, dtype=dtype, device=dev)
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.irecv, recv, (r - 1) % w),
            dist.P2POp(dist.isend, data(n, dtype, r).to(dev), (r + 1) % w),
        ]
    )
    for q in reqs:
        q.wait()
    out["batch_isend_irecv"] = recv
    dist.barrier()
    checks[0] += len(out)
    return {k: v.cpu() for k, v in out.items()}


def ops():
    import monel.torch  # noqa: F401

    dist.init_process_group("monel")
    r, w = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    checks = [0]
    for dtype in DTYPES:
        for n in (1, 1000, 4097):
            print(f"rank {r}: {dtype} x{n}", file=sys.stderr, flush=True)
            gpu = each_op(dev, n, dtype, r, w, checks)
            cpu = each_op(torch.device("cpu"), n, dtype, r, w, checks)
            for k in gpu:
                same(gpu[k], cpu[k], f"{k} {dtype} x{n}")
    # Large: 64 MiB of float32, 16 MiB of bfloat16, in place and out of place.
    for dtype, n in ((torch.float32, 16 << 20), (torch.bfloat16, 8 << 20)):
        t = data(n, dtype, r).to(dev)
        want = data(n, dtype, r)
        dist.all_reduce(t)
        dist.all_reduce(want)
        same(t, want, f"all_reduce {dtype} x{n}")
        flat = torch.zeros(w * n // 4, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(flat, data(n // 4, dtype, r).to(dev))
        wflat = torch.zeros(w * n // 4, dtype=dtype)
        dist.all_gather_into_tensor(wflat, data(n // 4, dtype, r))
        same(flat, wflat, f"all_gather_into_tensor {dtype} x{n // 4}")
        rs, wrs = torch.zeros(n // 2, dtype=dtype, device=dev), torch.zeros(n // 2, dtype=dtype)
        dist.reduce_scatter_tensor(rs, data(n, dtype, r + 3).to(dev))
        dist.reduce_scatter_tensor(wrs, data(n, dtype, r + 3))
        same(rs, wrs, f"reduce_scatter_tensor {dtype} x{n}")
        b = data(n, dtype, r + 4).to(dev)
        wb = data(n, dtype, r + 4)
        dist.broadcast(b, src=1)
        dist.broadcast(wb, src=1)
        same(b, wb, f"broadcast {dtype} x{n}")
        checks[0] += 4
    # Stream order: the input is written by work queued on the caller's stream after a
    # 20 ms spin; the result is read by work queued after wait(), with no synchronize.
    t = torch.zeros(1 << 20, device=dev)
    torch.cuda._sleep(40_000_000)
    t.fill_(r + 1)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    u = t * 2
    assert torch.equal(u.cpu(), torch.full((1 << 20,), float(2 * sum(range(1, w + 1))))), (
        "the all_reduce did not see the work queued before it, or wait() did not order after it"
    )
    fut = dist.all_reduce(t2 := torch.ones(1000, device=dev), async_op=True).get_future()
    assert torch.equal(fut.wait()[0].cpu(), torch.full((1000,), float(w))), "future's value"
    assert torch.equal(t2.cpu(), torch.full((1000,), float(w)))
    checks[0] += 3
    # Bad input: refused in words, and the communicator goes on.
    errors = []
    for what, call in (
        (
            "mixed devices",
            lambda: dist.all_gather(
                [torch.zeros(2, device=dev), torch.zeros(2)], torch.ones(2, device=dev)
            ),
        ),
        ("non-contiguous", lambda: dist.all_reduce(torch.zeros(4, 4, device=dev).t())),
    ):
        try:
            call()
            raise AssertionError(f"{what}: accepted")
        except RuntimeError as e:
            errors.append(f"{what}: {type(e).__name__}: {e}")
    t = torch.ones(3, device=dev)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((3,), float(w)))
    # An async work waited on from another stream orders that stream after the result.
    t = torch.zeros(1 << 18, device=dev)
    torch.cuda._sleep(20_000_000)
    t.fill_(r + 1)
    work = dist.all_reduce(t, async_op=True)
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        work.wait()
        u = t * 1
    other.synchronize()
    assert torch.equal(u.cpu(), torch.full((1 << 18,), float(sum(range(1, w + 1))))), (
        "wait() on another stream did not order it after the result"
    )
    checks[0] += 1
    pg = dist.group.WORLD._get_backend(dev)
    path = "cuda-ipc" if getattr(pg, "_cuda_ipc", None) not in (None, "unset") else "host staging"
    if r == 0:
        print(
            json.dumps(
                {
                    "phase": "ops",
                    "path": path,
                    "ranks": w,
                    "device": torch.cuda.get_device_name(),
                    "checks": checks[0],
                    "errors": errors,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def fsdp():
    """FSDP2 (fully_shard) on a CUDA module, on Monel, against the same model trained in
    one process on the whole batch: losses and final parameters agree to float rounding."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import monel.torch  # noqa: F401

    dist.init_process_group("monel")
    r, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda", (n,))
    torch.manual_seed(0)

    def net():
        return nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        ).cuda()

    model, ref = net(), net()
    ref.load_state_dict(model.state_dict())
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    worst_loss, losses = 0.0, []
    for step in range(8):
        g = torch.Generator().manual_seed(step)
        x, y = (
            torch.randn(8 * n, 64, generator=g).cuda(),
            torch.randint(0, 10, (8 * n,), generator=g).cuda(),
        )
        loss = nn.functional.cross_entropy(model(x[r * 8 : (r + 1) * 8]), y[r * 8 : (r + 1) * 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = nn.functional.cross_entropy(ref(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
        worst_loss = max(worst_loss, abs(mean.item() - ref_loss.item()))
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    worst_param = max((full[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    if r == 0:
        print(
            json.dumps(
                {
                    "phase": "fsdp",
                    "steps": len(losses),
                    "max_loss_diff": worst_loss,
                    "max_param_diff": worst_param,
                    "losses": losses,
                }
            ),
            flush=True,
        )
    assert worst_loss < 1e-4 and worst_param < 1e-4, (worst_loss, worst_param)
    dist.destroy_process_group()


class _Cai:
    """A CUDA array by the CUDA array interface alone (as CuPy's are)."""

    def __init__(self, t):
        self.__cuda_array_interface__ = t.__cuda_array_interface__


class _Dl:
    """A CUDA array by DLPack alone (as JAX's are on a GPU)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kw):
        return self._t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def comm_rank():
    """monel.Communicator (no torch.distributed) on CUDA memory, each result checked."""
    import monel

    c = monel.Communicator.from_env()
    r, w = c.rank, c.size
    dev = torch.device("cuda", 0)
    ar = torch.arange(1000, device=dev, dtype=torch.float32)
    x = ar + r
    c.all_reduce(x)
    assert torch.equal(x, sum(ar + k for k in range(w))), "all_reduce, torch CUDA tensor"
    y = torch.full((5000,), float(r + 1), dtype=torch.float64, device=dev)
    c.all_reduce(_Cai(y), op="max")
    assert torch.equal(y, torch.full_like(y, float(w))), "all_reduce, __cuda_array_interface__"
    z = torch.full((300,), 2 + r, dtype=torch.int32, device=dev)
    c.all_reduce(_Dl(z), op="prod")
    want = 1
    for k in range(w):
        want *= 2 + k
    assert torch.equal(z, torch.full_like(z, want)), "all_reduce, DLPack"
    out = torch.zeros(w * 100, dtype=torch.int64, device=dev)
    c.all_gather(torch.full((100,), r, dtype=torch.int64, device=dev), out)
    assert torch.equal(out.cpu(), torch.arange(w).repeat_interleave(100)), "all_gather"
    b = torch.full((77,), float(r), device=dev)
    c.broadcast(b, root=w - 1)
    assert torch.equal(b, torch.full_like(b, float(w - 1))), "broadcast"
    big = torch.ones(1 << 22, device=dev)
    wk = c.all_reduce(big, async_op=True)
    assert wk.wait()
    assert torch.equal(big, torch.full_like(big, float(w))), "async all_reduce"
    if r == 0:
        c.send(torch.arange(64, device=dev, dtype=torch.float16), 1, tag=5)
    elif r == 1:
        got = torch.zeros(64, device=dev, dtype=torch.float16)
        assert c.recv(got, 0, tag=5) == 0
        assert torch.equal(got, torch.arange(64, device=dev, dtype=torch.float16)), "send/recv"
    c.barrier()
    c.destroy()
    print(json.dumps({"phase": "comm", "rank": r, "checks": 8}), flush=True)


def comm(n=2):
    """Runs comm_rank in n processes (their own rendezvous: torchrun's port is its store's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(n):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(r),
            WORLD_SIZE=str(n),
            LOCAL_RANK=str(r),
            MONEL_TIMEOUT="60",
        )
        procs.append(subprocess.Popen([sys.executable, __file__, "comm-rank"], env=env))
    codes = [p.wait(timeout=150) for p in procs]
    assert codes == [0] * n, f"comm ranks exited {codes}"


def race(label):
    """`label`: gloo, monel, or monel-host (Monel with MONEL_CUDA_IPC=0: staged)."""
    backend = "gloo" if label == "gloo" else "monel"
    if backend == "monel":
        import monel.torch  # noqa: F401
    dist.init_process_group(backend)
    r, w = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    devices = ["cuda", "cpu"] if label == "monel" else ["cuda"]
    for size in [1 << k for k in range(10, 27, 2)]:  # 1 KiB .. 64 MiB
        n = size // 4
        for where in devices:
            t = torch.ones(n, device=dev if where == "cuda" else "cpu")
            reps = 30 if size <= 1 << 20 else 8
            times = []
            for i in range(reps + 3):
                if where == "cuda":
                    torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                if where == "cuda":
                    torch.cuda.synchronize()
                if i >= 3:
                    times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            if r == 0:
                print(
                    json.dumps(
                        {
                            "phase": "race",
                            "backend": label,
                            "tensors": where,
                            "bytes": size,
                            "median_us": med * 1e6,
                            "ranks": w,
                        }
                    ),
                    flush=True,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    import faulthandler

    if os.environ.get("GPU_CHECK_DUMP"):  # every thread's stack, while it seems stuck
        faulthandler.dump_traceback_later(int(os.environ["GPU_CHECK_DUMP"]), repeat=True)
    torch.cuda.set_device(0)
    {
        "ops": ops,
        "fsdp": fsdp,
        "comm": comm,
        "comm-rank": comm_rank,
        "race": lambda: race(sys.argv[2]),
    }[sys.argv[1]]()
