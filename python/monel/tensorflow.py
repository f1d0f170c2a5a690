"""Monel from TensorFlow: collectives on tf.Tensors (CPU), eagerly and inside `tf.function`,
a distributed gradient tape and a broadcast of variables (Horovod's shape).

    import monel.tensorflow as mtf
    mtf.init()                                      # the launch variables: monel launch, ...
    mtf.broadcast_variables(model.variables)        # rank 0's initial values everywhere
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        tape = mtf.DistributedGradientTape(tape)    # gradients averaged over the ranks
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

Eagerly, inputs are read in place through DLPack and results are aligned host buffers that
TensorFlow adopts through DLPack without a copy. Inside a graph the collective is a stateful
`tf.numpy_function` (TensorFlow orders stateful ops as written, so every rank runs its
collectives in program order); it does not compile under XLA (`jit_compile=True`). Small
tensors are fused into one call per type.

Errors: eagerly, a Monel error is raised as a class that is both Monel's and TensorFlow's
(`monel.CommTimeoutError` is also a `tf.errors.DeadlineExceededError`, `PeerLostError` an
`UnavailableError`, `MismatchError` and `InvalidArgumentError` TensorFlow's
`InvalidArgumentError`, `AbortedError` an `AbortedError`). In a graph TensorFlow rebuilds
the error from its Python type: bad input and mismatches become `tf.errors.
InvalidArgumentError`, the rest `tf.errors.UnknownError`, each message naming Monel's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

import monel
from monel import InvalidArgumentError
from monel import _frameworks as fw
from monel._frameworks import init, rank, shutdown, size

__all__ = [
    "DistributedGradientTape",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "broadcast_variables",
    "init",
    "rank",
    "reduce_scatter",
    "shutdown",
    "size",
]


def _tensor(x: Any, what: str) -> tf.Tensor:
    if isinstance(x, tf.Variable):
        x = x.value()
    elif isinstance(x, tf.IndexedSlices) or not isinstance(x, tf.Tensor):
        x = tf.convert_to_tensor(x)
    if x.device and "CPU" not in x.device.upper():
        raise InvalidArgumentError(
            f"{what}: a tensor on {x.device}; monel.tensorflow takes "
            "CPU tensors (with tf.device('/CPU:0'))"
        )
    return x


def _host(t: tf.Tensor) -> np.ndarray:
    """A host view of an eager tensor (no copy where DLPack carries its type)."""
    try:
        return np.from_dlpack(t)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return t.numpy()


def _adopt(a: np.ndarray) -> tf.Tensor:
    """A tensor on the memory of `a` (no copy where DLPack carries its type)."""
    try:
        return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
    except (BufferError, TypeError, ValueError, RuntimeError, tf.errors.OpError):
        return tf.convert_to_tensor(a)


# Monel's error types and the TensorFlow error each is also raised as (first match wins).
_AS_TF = (
    (monel.CommTimeoutError, tf.errors.DeadlineExceededError),
    (monel.PeerLostError, tf.errors.UnavailableError),
    (monel.BootstrapError, tf.errors.UnavailableError),
    (monel.MismatchError, tf.errors.InvalidArgumentError),
    (monel.InvalidArgumentError, tf.errors.InvalidArgumentError),
    (monel.AbortedError, tf.errors.AbortedError),
    (monel.MonelError, tf.errors.UnknownError),
)


def _as_tf(e: monel.MonelError) -> Exception:
    """`e` as a class that is both its Monel type and the matching `tf.errors` type."""
    base = next(t for m, t in _AS_TF if isinstance(e, m))
    return fw.as_framework_error(e, base, None, None, str(e))


def _in_graph(host_fn):
    """`host_fn` as a numpy_function body: bad input raises ValueError, which TensorFlow
    turns into its InvalidArgumentError (other errors become its UnknownError)."""

    def body(*xs):
        try:
            return host_fn(list(xs))
        except (monel.InvalidArgumentError, monel.MismatchError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from e

    return body


def _run(host_fn, tree, what: str, shape_of=lambda s: s):
    """Applies `host_fn` (a list of numpy arrays -> a list of numpy arrays) to the tensors in
    `tree`: directly when eager, as one stateful numpy_function in a graph."""
    leaves = tf.nest.flatten(tree)
    if not leaves:
        return tree
    if not tf.executing_eagerly():
        ts = [_tensor(x, what) for x in leaves]
        outs = tf.numpy_function(
            _in_graph(host_fn), ts, [t.dtype for t in ts], stateful=True, name=f"monel_{what}"
        )
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        for o, t in zip(outs, ts):
            o.set_shape(shape_of(t.shape))
        return tf.nest.pack_sequence_as(tree, outs)
    try:
        ts = [_tensor(x, what) for x in leaves]
        outs = [_adopt(a) for a in host_fn([_host(t) for t in ts])]
    except monel.MonelError as e:
        raise _as_tf(e) from e
    return tf.nest.pack_sequence_as(tree, outs)


def all_reduce(tree: Any, op: str = "sum") -> Any:
    """Reduces every tensor in `tree` (a tensor or a nest) across ranks ("sum", "avg",
    "min", "max", "prod"); returns the same structure. The ranks must pass the same
    structure, shapes and types."""
    return _run(lambda xs: fw.all_reduce_many(xs, op), tree, "all_reduce")


def broadcast(tree: Any, root: int = 0) -> Any:
    """The root's tensors on every rank (same structure)."""
    return _run(lambda xs: fw.broadcast_many(xs, root), tree, "broadcast")


def _first_axis(n_of):
    def shape_of(s: tf.TensorShape) -> tf.TensorShape:
        if s.rank is None:
            return s
        if s.rank == 0:
            return tf.TensorShape([n_of(None)])
        return tf.TensorShape([n_of(s[0]), *s[1:]])

    return shape_of


def all_gather(tree: Any) -> Any:
    """Every rank's tensor concatenated along the first axis in rank order (a scalar becomes
    a vector of `size()` values)."""
    n = size()
    return _run(
        lambda xs: [fw.all_gather(x) for x in xs],
        tree,
        "all_gather",
        _first_axis(lambda d: n if d is None else n * d),
    )


def reduce_scatter(tree: Any, op: str = "sum") -> Any:
    """Reduces each tensor (first axis divisible by the ranks) and keeps this rank's block."""
    n = size()
    return _run(
        lambda xs: [fw.reduce_scatter(x, op) for x in xs],
        tree,
        "reduce_scatter",
        _first_axis(lambda d: None if d is None else d // n),
    )


def all_to_all(tree: Any) -> Any:
    """Block j of each tensor's first axis goes to rank j; block i of the result is rank
    i's."""
    return _run(lambda xs: [fw.all_to_all(x) for x in xs], tree, "all_to_all")


def broadcast_variables(variables, root: int = 0) -> None:
    """Assigns rank `root`'s values to `variables` on every rank (in a graph: the assign
    ops run when the function does)."""
    variables = list(variables)
    if not variables:
        return
    values = broadcast([v.value() for v in variables], root)
    for v, x in zip(variables, values):
        v.assign(x)


class DistributedGradientTape:
    """A `tf.GradientTape` whose `gradient()` reduces the gradients across ranks (by default
    their average, so every rank applies the gradient of the global batch's mean loss).
    Wrap the tape after its `with` block; everything else is the tape's."""

    def __init__(self, tape: tf.GradientTape, op: str = "avg") -> None:
        self._tape, self._op = tape, op

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat = fw.reduce_present(tf.nest.flatten(grads), lambda gs: all_reduce(gs, self._op))
        return tf.nest.pack_sequence_as(grads, flat)

    def __getattr__(self, name: str):
        return getattr(self._tape, name)
