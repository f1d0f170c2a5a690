"""The tensors in an operation's arguments (a tensor, or lists and tuples of them, nested)."""

import torch


def tensors_in(x):
    """Yields the tensors in `x`."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors_in(y)
