"""Data-parallel training in JAX on Monel: an MLP classifies the handwritten digits, the
gradient all-reduce inside the jitted step.

    monel launch -n 4 -- python examples/jax_train.py
    python examples/jax_train.py --backend none          # one process, the reference

Every world size follows the same loss curve up to float rounding (see digits.py). Prints
the loss per epoch and the median time per step; --json FILE writes the loss per step,
whether the ranks' parameters were bitwise equal after every step, and the accuracy.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import digits


def init_params(seed, hidden):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    lim1, lim2 = (6 / (64 + hidden)) ** 0.5, (6 / (hidden + 10)) ** 0.5
    return {"w1": jax.random.uniform(k1, (64, hidden), minval=-lim1, maxval=lim1),
            "b1": jnp.zeros(hidden),
            "w2": jax.random.uniform(k2, (hidden, 10), minval=-lim2, maxval=lim2),
            "b2": jnp.zeros(10)}


def logits(p, x):
    return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def loss_fn(p, x, y):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits(p, x)), y[:, None], 1))


def main() -> None:
    a = digits.arguments("JAX").parse_args()
    distributed = a.backend == "monel"
    if distributed:
        import monel.jax as mj

        mj.init()
        rank, world = mj.rank(), mj.size()
    else:
        rank, world = 0, 1
    digits.check_batch(a.batch, world)

    x, y = digits.load(a.digits)
    batches, test = digits.steps(a.epochs, a.batch, a.seed)
    params = init_params(a.seed, a.hidden)
    if distributed:
        params = mj.broadcast_parameters(params)
    mom = jax.tree.map(jnp.zeros_like, params)

    @jax.jit
    def step(params, mom, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        if distributed:
            grads = mj.all_reduce(grads, op="avg")  # an ordered host callback inside jit
        mom = jax.tree.map(lambda m, g: 0.9 * m + g, mom, grads)
        params = jax.tree.map(lambda p, m: p - a.lr * m, params, mom)
        return params, mom, loss

    log = digits.Log(a, "jax", rank, world, len(batches))
    for idx in batches:
        mine = idx[rank::world]
        xb, yb = jnp.asarray(x[mine]), jnp.asarray(y[mine])
        t0 = time.perf_counter()
        params, mom, loss = step(params, mom, xb, yb)
        loss.block_until_ready()
        seconds, same = time.perf_counter() - t0, None
        if distributed:
            loss = mj.all_reduce(loss, op="avg")  # the global batch's loss
            leaves = [np.asarray(p) for p in jax.tree.leaves(params)]
            same = digits.all_same(mj.all_gather(jnp.asarray(digits.digest(leaves))), world)
        log.step(float(loss), seconds, same)

    log.finish(float(jnp.mean(jnp.argmax(logits(params, jnp.asarray(x[test])), 1) == y[test])))


if __name__ == "__main__":
    main()
