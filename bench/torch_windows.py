"""Monel's torch.distributed backend, in-place float32 all_reduce on ordinary tensors and on
tensors in symmetric memory windows (`monel.torch.empty`), timed as gloo_allreduce.py times
Gloo: per size, warm-up calls, a batch sized to take about TARGET_MS, the slowest rank's mean
time per call. Run one process per rank with torchrun's variables (`monel launch -n 4 --
python bench/torch_windows.py 33554432 33554432 4 300`).
Prints "size_bytes ordinary_us window_us" lines on rank 0.
Usage: torch_windows.py MIN_BYTES MAX_BYTES FACTOR TARGET_MS"""
import sys
import time

import torch
import torch.distributed as dist

import monel.torch


def timed(t, target):
    n = dist.get_world_size()
    t.fill_(float(dist.get_rank() + 1))
    dist.all_reduce(t)
    if t.numel() and not bool((t == n * (n + 1) // 2).all()):
        print("wrong result", file=sys.stderr)
        sys.exit(1)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(t)
    per = (time.perf_counter() - t0) / 3
    iters = torch.tensor([min(20000, max(3, int(target / per)))])
    dist.broadcast(iters, 0)
    iters = int(iters.item())
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    us = torch.tensor([(time.perf_counter() - t0) * 1e6 / iters], dtype=torch.float64)
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()


def main():
    lo, hi, factor = (int(a) for a in sys.argv[1:4])
    target = float(sys.argv[4]) / 1e3
    torch.set_num_threads(1)
    dist.init_process_group("monel")
    # One window for every size, as nccl-tests' -R registers the largest buffer once.
    win = monel.torch.empty(hi // 4)
    size = lo
    while size <= hi:
        count = size // 4
        ordinary = timed(torch.empty(count), target)
        window = timed(win[:count], target)
        if dist.get_rank() == 0:
            print(f"{size} {ordinary:.3f} {window:.3f}", flush=True)
        size *= factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
