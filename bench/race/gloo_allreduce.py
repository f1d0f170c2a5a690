"""torch.distributed's Gloo backend (CPU), in-place float32 all_reduce, timed the way
`monel bench` times Monel: per size, warm-up calls, a batch sized to take about TARGET_MS,
the slowest rank's mean time per call. Run one process per rank with torchrun's variables
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as `monel launch` sets them.
Prints "size_bytes time_us" lines on rank 0.
Usage: gloo_allreduce.py MIN_BYTES MAX_BYTES FACTOR TARGET_MS"""
import sys
import time

import torch
import torch.distributed as dist


def main():
    lo, hi, factor = (int(a) for a in sys.argv[1:4])
    target = float(sys.argv[4]) / 1e3
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    size = lo
    while size <= hi:
        count = size // 4
        t = torch.full((count,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(t)
        want = float(n * (n + 1) // 2)
        if count and not bool((t == want).all()):
            print(f"size {size}: wrong result", file=sys.stderr)
            sys.exit(1)
        dist.barrier()
        for _ in range(3):
            dist.all_reduce(t)
        # Batches doubling until one takes a tenth of the target (the slowest rank's time
        # decides, so every rank stops alike) and the batches together took half the
        # target: the batch size.
        k, spent = 1, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t)
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            spent += took.item()
            long_enough = took.item() >= target / 10
            if (long_enough and spent >= target / 2) or k >= 1 << 20:
                per = took.item() / k
                break
            if not long_enough:
                k *= 2
        iters = min(1_000_000, max(3, int(target / per)))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        us = torch.tensor([(time.perf_counter() - t0) * 1e6 / iters], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"{size} {us.item():.3f}", flush=True)
        size *= factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
