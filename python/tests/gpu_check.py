"""The CUDA checks of Monel's torch backend, run by scripts/gpu-check.sh under torchrun on a
machine with a GPU (every rank on the current one).

    torchrun --nproc-per-node 2 python/tests/gpu_check.py ops     # every operation, checked
    torchrun --nproc-per-node 2 python/tests/gpu_check.py race monel|gloo

`ops`: every operation the backend has, on CUDA tensors of several dtypes and sizes (1
element to 64 MiB), in place and out of place, async and blocking, each result compared
bit for bit with the same operation on CPU tensors; stream order (an operation sees the
work queued before it on the caller's stream, and work queued after `wait()` sees its
result); bad input (mixed devices, non-contiguous) refused with the communicator usable
after. `race`: float32 all_reduce, 1 KiB to 64 MiB, medians, on CUDA tensors (and on CPU
tensors, for the staging's cost). Rank 0 prints one JSON line per result.
"""

import json
import os
import statistics
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
    flat[r * n:(r + 1) * n] = data(n, dtype, r + 5).to(dev)
    dist.all_gather_into_tensor(flat, flat[r * n:(r + 1) * n])  # in place, as FSDP does
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
    dist.all_to_all_single(outu, ins, output_split_sizes=[q + 1 + r for q in range(w)],
                           input_split_sizes=[r + 1 + p for p in range(w)])
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
    reqs = dist.batch_isend_irecv([
        dist.P2POp(dist.irecv, recv, (r - 1) % w),
        dist.P2POp(dist.isend, data(n, dtype, r).to(dev), (r + 1) % w),
    ])
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
        checks[0] += 2
    # Stream order: the input is written by work queued on the caller's stream after a
    # 20 ms spin; the result is read by work queued after wait(), with no synchronize.
    t = torch.zeros(1 << 20, device=dev)
    torch.cuda._sleep(40_000_000)
    t.fill_(r + 1)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    u = t * 2
    assert torch.equal(u.cpu(), torch.full((1 << 20,), float(2 * sum(range(1, w + 1))))), \
        "the all_reduce did not see the work queued before it, or wait() did not order after it"
    fut = dist.all_reduce(t2 := torch.ones(1000, device=dev), async_op=True).get_future()
    assert torch.equal(fut.wait()[0].cpu(), torch.full((1000,), float(w))), "future's value"
    assert torch.equal(t2.cpu(), torch.full((1000,), float(w)))
    checks[0] += 3
    # Bad input: refused in words, and the communicator goes on.
    errors = []
    for what, call in (
        ("mixed devices", lambda: dist.all_gather([torch.zeros(2, device=dev), torch.zeros(2)],
                                                  torch.ones(2, device=dev))),
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
    if r == 0:
        print(json.dumps({"phase": "ops", "ranks": w, "device": torch.cuda.get_device_name(),
                          "checks": checks[0], "errors": errors}), flush=True)
    dist.destroy_process_group()


def race(backend):
    if backend == "monel":
        import monel.torch  # noqa: F401
    dist.init_process_group(backend)
    r, w = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    devices = ["cuda", "cpu"] if backend == "monel" else ["cuda"]
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
                print(json.dumps({"phase": "race", "backend": backend, "tensors": where,
                                  "bytes": size, "median_us": med * 1e6, "ranks": w}),
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import faulthandler

    if os.environ.get("GPU_CHECK_DUMP"):  # every thread's stack, while it seems stuck
        faulthandler.dump_traceback_later(int(os.environ["GPU_CHECK_DUMP"]), repeat=True)
    torch.cuda.set_device(0)
    if sys.argv[1] == "ops":
        ops()
    else:
        race(sys.argv[2])
