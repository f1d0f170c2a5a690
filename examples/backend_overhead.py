"""What the torch.distributed backend costs over the monel package: a 1 MiB float32
all_reduce through `torch.distributed.all_reduce` (backend "monel") against the same call on
the same communicator through `monel` directly, interleaved in rounds; medians. The async
form (`async_op=True`, then `wait()`, as DDP issues its buckets) is measured too, against
the package's own async form.

    torchrun --nproc-per-node 2 examples/backend_overhead.py [--size BYTES] [--rounds N]
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import monel.torch  # noqa: F401


def timed(f, iters):
    t = time.perf_counter()
    for _ in range(iters):
        f()
    return (time.perf_counter() - t) / iters * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    dist.init_process_group("monel")
    comm = dist.distributed_c10d._get_default_group().comm
    t = torch.ones(a.size // 4)
    ways = {
        "direct": lambda: comm.all_reduce(t),
        "backend": lambda: dist.all_reduce(t),
        "direct_async": lambda: comm.all_reduce(t, async_op=True).wait(),
        "backend_async": lambda: dist.all_reduce(t, async_op=True).wait(),
    }
    times: dict = {k: [] for k in ways}
    for f in ways.values():  # warm up
        for _ in range(3):
            f()
    for _ in range(a.rounds):
        for k, f in ways.items():
            dist.barrier()
            times[k].append(timed(f, a.iters))
    m = {k: statistics.median(v) for k, v in times.items()}
    if dist.get_rank() == 0:
        d, b = m["direct"], m["backend"]
        da, ba = m["direct_async"], m["backend_async"]
        print(f"{a.size} B float32 all_reduce, {dist.get_world_size()} ranks, medians of "
              f"{a.rounds} rounds x {a.iters}: monel package {d:.1f} us, torch backend "
              f"{b:.1f} us, overhead {100 * (b / d - 1):+.1f}% (goal <= +10%); async and "
              f"wait: package {da:.1f} us, backend {ba:.1f} us, {100 * (ba / da - 1):+.1f}%")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
