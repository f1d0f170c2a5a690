"""Monel for Keras 3 on its TensorFlow or JAX back end: `model.fit` data-parallel with two
changes (Horovod's shape).

    import monel.keras as mk
    mk.init()                                            # the launch variables
    model.compile(optimizer=mk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=...)
    model.fit(x_shard, y_shard, batch_size=global_batch // mk.size(),
              callbacks=[mk.BroadcastGlobalVariablesCallback(0)])

`DistributedOptimizer` averages the gradients over the ranks before the wrapped optimizer
applies them, inside the compiled train step (a host callback: `monel.tensorflow` or
`monel.jax`). On TensorFlow the step must not compile under XLA: Keras leaves XLA off on
machines without a GPU, and `jit_compile=False` keeps it off elsewhere.
"""

from __future__ import annotations

import importlib
from typing import Any

import keras

from monel import InvalidArgumentError
from monel import _frameworks as fw
from monel._frameworks import init, rank, shutdown, size

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "DistributedOptimizer",
    "all_gather",
    "all_reduce",
    "broadcast",
    "broadcast_variables",
    "init",
    "rank",
    "shutdown",
    "size",
]


def _backend():
    """The Monel module for Keras's back end."""
    name = keras.backend.backend()
    if name in ("tensorflow", "jax"):
        return importlib.import_module(f"monel.{name}")
    raise InvalidArgumentError(
        f"monel.keras runs on Keras's tensorflow and jax back ends, not {name!r} (on torch, "
        "use torch.distributed with monel.torch)"
    )


def all_reduce(tree: Any, op: str = "sum") -> Any:
    """`monel.tensorflow.all_reduce` or `monel.jax.all_reduce`, for Keras's back end."""
    return _backend().all_reduce(tree, op)


def all_gather(tree: Any) -> Any:
    """`all_gather` of the back end's Monel module."""
    return _backend().all_gather(tree)


def broadcast(tree: Any, root: int = 0) -> Any:
    """`broadcast` of the back end's Monel module."""
    return _backend().broadcast(tree, root)


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, op: str = "avg"):
    """A copy of `optimizer` (same class and configuration) that reduces the gradients over
    the ranks ("avg" by default, or "sum") before applying them. Pass it to `compile`."""
    if op not in ("avg", "sum"):
        raise InvalidArgumentError(f"DistributedOptimizer: op {op!r}, want 'avg' or 'sum'")
    base = type(optimizer)

    def apply(self, grads, trainable_variables=None):
        return base.apply(
            self, fw.reduce_present(grads, lambda gs: all_reduce(gs, op)), trainable_variables
        )

    cls: Any = type(
        base.__name__,
        (base,),
        {
            "apply": apply,
            "__module__": __name__,
            "__doc__": f"{base.__name__}, gradients reduced over the ranks by Monel.",
        },
    )
    return cls.from_config(optimizer.get_config())


def broadcast_variables(variables, root: int = 0) -> None:
    """Assigns rank `root`'s values of Keras `variables` on every rank."""
    variables = list(variables)
    if not variables:
        return
    values = fw.broadcast_many([keras.ops.convert_to_numpy(v.value) for v in variables], root)
    for v, x in zip(variables, values):
        v.assign(x)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, gives every rank rank `root`'s model (and any optimizer
    state already built), so all ranks start from the same values."""

    def __init__(self, root: int = 0) -> None:
        super().__init__()
        self.root = root

    def on_train_begin(self, logs: Any = None) -> None:
        broadcast_variables(self.model.variables, self.root)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and opt.built:
            broadcast_variables(opt.variables, self.root)
