"""The data every framework example trains on: scikit-learn's handwritten digits (1,797 8x8
images shipped inside scikit-learn; nothing is downloaded), split and batched from a seed so
that every framework and every world size sees the same global batches.

Each global step takes `batch` samples; rank r of n trains on samples r, r+n, ... of it, so
the average of the ranks' gradients is the gradient of the global batch's mean loss.
"""

import hashlib

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
