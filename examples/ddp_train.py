"""Data-parallel training on Monel (or Gloo): an MLP classifies scikit-learn's handwritten
digits (1,797 8x8 images shipped inside the package; nothing is downloaded).

    torchrun --nproc-per-node 4 examples/ddp_train.py --backend monel
    torchrun --nproc-per-node 4 examples/ddp_train.py --backend gloo
    python examples/ddp_train.py --backend none          # one process, the reference
    torchrun --nproc-per-node 2 examples/ddp_train.py --backend monel --device cuda

Every step takes one global batch (--batch samples, the same on every run); rank r of n
trains on samples r, r+n, r+2n, ... of it, and DDP averages the gradients, so every world size
follows the same loss curve up to float rounding. Prints the loss per epoch and the median
time per step (forward, backward with DDP's gradient all-reduce, update); --check-grads
compares gradient digests across ranks after every backward (outside the timing), and
--json FILE writes the loss per step, that agreement and whether the ranks end with
bitwise-equal parameters. --device cuda trains on the GPU (every rank on the current one).
--digits FILE.npz reads the images (arrays x, y) where scikit-learn is not installed.
"""

import argparse
import hashlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def load_digits(path=None):
    """scikit-learn's 8x8 digits (images scaled to [0, 1], labels), or the same from an .npz."""
    if path:
        import numpy as np

        d = np.load(path)
        return torch.tensor(d["x"], dtype=torch.float32), torch.tensor(d["y"], dtype=torch.int64)
    from sklearn.datasets import load_digits as sk

    d = sk()
    return (torch.tensor(d.data, dtype=torch.float32) / 16.0,
            torch.tensor(d.target, dtype=torch.int64))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="monel", choices=["monel", "gloo", "none"])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=64, help="global batch (divisible by ranks)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hook", choices=["none", "fp16", "bf16"], default="none",
                   help="DDP communication hook: compress gradients to fp16/bf16")
    p.add_argument("--check-grads", action="store_true",
                   help="after every backward, compare gradient digests across ranks")
    p.add_argument("--json", help="write per-step losses and gradient agreement here")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--digits", help="the digits as an .npz (x, y) instead of scikit-learn's")
    a = p.parse_args()

    distributed = a.backend != "none"
    if distributed:
        if a.backend == "monel":
            import monel.torch  # noqa: F401  (registers the backend)
        dist.init_process_group(backend=a.backend)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    if a.batch % world:
        raise SystemExit(f"--batch {a.batch} must divide by {world} ranks")
    torch.set_num_threads(1)

    x, y = load_digits(a.digits)
    dev = torch.device(a.device)
    x, y = x.to(dev), y.to(dev)
    g = torch.Generator().manual_seed(a.seed)
    order = torch.randperm(len(x), generator=g)
    train = order[:1536]  # 24 global batches of 64

    torch.manual_seed(a.seed)
    model = nn.Sequential(nn.Linear(64, a.hidden), nn.ReLU(), nn.Linear(a.hidden, 10)).to(dev)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
        if a.hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks
            model.register_comm_hook(None, hooks.fp16_compress_hook if a.hook == "fp16"
                                     else hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    steps, step_times, grads_agree = [], [], []
    for epoch in range(a.epochs):
        perm = train[torch.randperm(len(train), generator=g)]
        epoch_loss = []
        for b in range(0, len(perm), a.batch):
            idx = perm[b:b + a.batch][rank::world].to(dev)
            t0 = time.perf_counter()
            opt.zero_grad()
            out = model(x[idx])
            loss = loss_fn(out, y[idx])
            loss.backward()
            t1 = time.perf_counter()
            if distributed and a.check_grads:
                h = hashlib.sha256()
                for prm in model.parameters():
                    h.update(prm.grad.cpu().numpy().tobytes())
                digests = [None] * world
                dist.all_gather_object(digests, h.hexdigest())
                grads_agree.append(len(set(digests)) == 1)
            t2 = time.perf_counter()
            opt.step()
            step_times.append(time.perf_counter() - t2 + t1 - t0)
            # The global batch's loss: the mean of the ranks' (equal-size) shard losses.
            global_loss = loss.detach().clone()
            if distributed:
                dist.all_reduce(global_loss)
                global_loss /= world
            steps.append(global_loss.item())
            epoch_loss.append(global_loss.item())
        if rank == 0:
            print(f"[{a.backend} x{world}] epoch {epoch + 1}: loss {statistics.mean(epoch_loss):.4f}",
                  flush=True)

    with torch.no_grad():
        test = order[1536:].to(dev)
        acc = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    same_params = True
    if distributed:
        h = hashlib.sha256()
        for prm in model.parameters():
            h.update(prm.detach().cpu().numpy().tobytes())
        digests = [None] * world
        dist.all_gather_object(digests, h.hexdigest())
        same_params = len(set(digests)) == 1
    med = statistics.median(step_times) * 1e3
    if rank == 0:
        print(f"[{a.backend} x{world}] test accuracy {acc:.3f}; median step {med:.3f} ms "
              f"(forward, backward with gradient all-reduce, update)", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"backend": a.backend, "world": world, "losses": steps,
                           "grads_agree": grads_agree, "accuracy": acc,
                           "same_params": same_params, "device": a.device,
                           "median_step_ms": med}, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
