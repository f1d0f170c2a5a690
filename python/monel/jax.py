"""Monel from JAX: collectives on jax arrays and pytrees (CPU), eagerly and inside `jax.jit`.

    import monel.jax as mj
    mj.init()                                   # the launch variables: monel launch, torchrun, ...
    params = mj.broadcast_parameters(params)    # rank 0's initial values everywhere
    @jax.jit
    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        grads = mj.all_reduce(grads, op="avg")  # inside jit: an ordered host callback
        return jax.tree.map(lambda p, g: p - lr * g, params, grads)

Eagerly, inputs are read in place through DLPack and results are 64-byte-aligned host
buffers that JAX adopts without a copy. Inside a traced function the collective is an
ordered `jax.experimental.io_callback`: XLA hands the callback host buffers and copies its
results back (one copy each way), and ordering keeps every rank's collectives in program
order. Small leaves are fused into one call per type. Errors are Monel's (`MonelError`
subclasses); inside `jit`, JAX re-raises a callback's error as its runtime error, whose
message names Monel's.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import io_callback

from monel import InvalidArgumentError
from monel import _frameworks as fw
from monel._frameworks import init, rank, shutdown, size

__all__ = [
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "broadcast_parameters",
    "init",
    "rank",
    "reduce_scatter",
    "shutdown",
    "size",
]


def _traced(leaves) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in leaves)


def _host(x: Any, what: str) -> np.ndarray:
    """A host view of `x` (no copy for a jax array on the CPU)."""
    if isinstance(x, jax.Array):
        platforms = {d.platform for d in x.devices()}
        if platforms != {"cpu"}:
            raise InvalidArgumentError(
                f"{what}: a jax array on {', '.join(sorted(platforms))}; monel.jax takes CPU "
                "arrays (jax.device_put(x, jax.devices('cpu')[0]))"
            )
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, ValueError, RuntimeError):
            return np.asarray(x)  # a type DLPack does not carry (bfloat16, float8): a copy
    return np.asarray(x)


def _adopt(a: np.ndarray) -> jax.Array:
    """A jax array on the host memory of `a` (no copy when aligned and of a DLPack type)."""
    if a.ctypes.data % fw.ALIGN == 0:
        try:
            return jax.dlpack.from_dlpack(a)
        except (BufferError, TypeError, ValueError, RuntimeError):
            pass
    return jax.numpy.asarray(a)


def _run(host_fn, tree, what: str, shapes=None):
    """Applies `host_fn` (a list of numpy arrays -> a list of numpy arrays) to the leaves of
    `tree`: directly when eager, through an ordered host callback when traced."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return tree
    if _traced(leaves):
        if shapes is None:
            shapes = [jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)) for x in leaves]

        def callback(*xs):
            return [np.asarray(r, dtype=s.dtype) for r, s in zip(host_fn(list(xs)), shapes)]

        outs = io_callback(callback, shapes, *leaves, ordered=True)
        return jax.tree_util.tree_unflatten(treedef, list(outs))
    outs = host_fn([_host(x, what) for x in leaves])
    return jax.tree_util.tree_unflatten(treedef, [_adopt(a) for a in outs])


def all_reduce(tree: Any, op: str = "sum") -> Any:
    """Reduces every leaf across ranks ("sum", "avg", "min", "max", "prod"); returns the same
    structure. The ranks must pass the same structure, shapes and types."""
    return _run(lambda xs: fw.all_reduce_many(xs, op), tree, "all_reduce")


def broadcast(tree: Any, root: int = 0) -> Any:
    """The root's leaves on every rank (same structure)."""
    return _run(lambda xs: fw.broadcast_many(xs, root), tree, "broadcast")


def broadcast_parameters(params: Any, root: int = 0) -> Any:
    """Rank `root`'s parameters (a pytree) on every rank: call it once after initialising,
    so every rank starts from the same values."""
    return broadcast(params, root)


def _per_leaf(fn, tree, what, shape_of):
    leaves = jax.tree_util.tree_leaves(tree)
    shapes = None
    if _traced(leaves):
        shapes = [
            jax.ShapeDtypeStruct(shape_of(np.shape(x)), jax.numpy.result_type(x)) for x in leaves
        ]
    return _run(lambda xs: [fn(x) for x in xs], tree, what, shapes)


def _blocks(shape: tuple, what: str) -> int:
    n = size()
    if not shape or shape[0] % n:
        raise InvalidArgumentError(f"{what}: the first axis of {shape} must divide by {n} ranks")
    return shape[0] // n


def all_gather(tree: Any) -> Any:
    """Every rank's leaf concatenated along the first axis in rank order (a scalar becomes a
    vector of `size()` values)."""
    n = size()
    return _per_leaf(fw.all_gather, tree, "all_gather", lambda s: (n * s[0], *s[1:]) if s else (n,))


def reduce_scatter(tree: Any, op: str = "sum") -> Any:
    """Reduces each leaf (first axis divisible by the ranks) and keeps this rank's block."""
    return _per_leaf(
        lambda x: fw.reduce_scatter(x, op),
        tree,
        "reduce_scatter",
        lambda s: (_blocks(s, "reduce_scatter"), *s[1:]),
    )


def all_to_all(tree: Any) -> Any:
    """Block j of each leaf's first axis goes to rank j; block i of the result is rank i's."""
    return _per_leaf(fw.all_to_all, tree, "all_to_all", lambda s: s)
