"""What every framework example shares: the data, scikit-learn's handwritten digits (1,797 8x8
images shipped inside scikit-learn; nothing is downloaded), split and batched from a seed so
that every framework and every world size sees the same global batches; the command line;
and the log of losses and parameter agreement.

Each global step takes `batch` samples; rank r of n trains on samples r, r+n, ... of it, so
the average of the ranks' gradients is the gradient of the global batch's mean loss.
"""

import argparse
import hashlib
import json
import statistics

import numpy as np

TRAIN = 1536  # 24 global batches of 64


def load(path=None):
    """Images scaled to [0, 1] (float32, 1797 x 64) and labels (int32), from scikit-learn or
    from an .npz with arrays x and y."""
    if path:
        d = np.load(path)
        return d["x"].astype(np.float32), d["y"].astype(np.int32)
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int32)


def steps(epochs, batch, seed):
    """The global batches, as index arrays, for every step of every epoch; and the test
    indices."""
    rng = np.random.RandomState(seed)
    order = rng.permutation(1797)
    train, test = order[:TRAIN], order[TRAIN:]
    out = []
    for _ in range(epochs):
        perm = train[rng.permutation(TRAIN)]
        out += [perm[b:b + batch] for b in range(0, TRAIN, batch)]
    return out, test


def digest(arrays) -> np.ndarray:
    """A 32-byte digest of arrays' bytes (uint8), to compare parameters across ranks."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return np.frombuffer(h.digest(), np.uint8).copy()


def all_same(gathered: np.ndarray, world: int) -> bool:
    """Whether every rank's block of an all-gathered digest is the same."""
    blocks = np.asarray(gathered).reshape(world, -1)
    return bool((blocks == blocks[0]).all())


def arguments(framework: str) -> argparse.ArgumentParser:
    """The command line every framework example shares."""
    ap = argparse.ArgumentParser(description=f"The digits MLP, data-parallel in {framework}")
    ap.add_argument("--backend", default="monel", choices=["monel", "none"],
                    help="none: one process without Monel, the reference")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="global batch (divisible by ranks)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write per-step losses and parameter agreement here")
    ap.add_argument("--digits", help="the digits as an .npz (x, y) instead of scikit-learn's")
    return ap


def check_batch(batch: int, world: int) -> None:
    if batch % world:
        raise SystemExit(f"--batch {batch} must divide by {world} ranks")


class Log:
    """Per-step losses and parameter agreement; prints each epoch's mean loss on rank 0 and
    the summary (and --json) at the end."""

    def __init__(self, a, name: str, rank: int, world: int, steps: int) -> None:
        self.a, self.rank, self.world = a, rank, world
        self.tag = f"[{name} {a.backend} x{world}]"
        self.name, self.per_epoch = name, steps // a.epochs
        self.losses, self.same, self.times = [], [], []

    def step(self, loss: float, seconds: float, same=None) -> None:
        self.losses.append(loss)
        self.times.append(seconds)
        if same is not None:
            self.same.append(same)
        done = len(self.losses)
        if self.rank == 0 and done % self.per_epoch == 0:
            mean = statistics.mean(self.losses[-self.per_epoch:])
            print(f"{self.tag} epoch {done // self.per_epoch}: loss {mean:.4f}", flush=True)

    def finish(self, accuracy: float) -> None:
        med = statistics.median(self.times[1:]) * 1e3
        if self.rank != 0:
            return
        print(f"{self.tag} test accuracy {accuracy:.3f}; median step {med:.3f} ms "
              "(forward, backward with gradient all-reduce, update)", flush=True)
        if self.a.json:
            with open(self.a.json, "w") as f:
                json.dump({"framework": self.name, "backend": self.a.backend,
                           "world": self.world, "losses": self.losses,
                           "same_params": self.same, "accuracy": accuracy,
                           "median_step_ms": med}, f)
