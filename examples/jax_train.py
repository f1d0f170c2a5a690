"""Data-parallel training in JAX on Monel: an MLP classifies the handwritten digits, the
gradient all-reduce inside the jitted step.

    monel launch -n 4 -- python examples/jax_train.py
    python examples/jax_train.py --backend none          # one process, the reference

Every world size follows the same loss curve up to float rounding (see digits.py). Prints
the loss per epoch and the median time per step; --json FILE writes the loss per step,
whether the ranks' parameters were bitwise equal after every step, and the accuracy.
"""

import argparse
import json
import statistics
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
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="monel", choices=["monel", "none"])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="global batch (divisible by ranks)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write per-step losses and parameter agreement here")
    ap.add_argument("--digits", help="the digits as an .npz (x, y) instead of scikit-learn's")
    a = ap.parse_args()

    distributed = a.backend == "monel"
    if distributed:
        import monel.jax as mj

        mj.init()
        rank, world = mj.rank(), mj.size()
    else:
        rank, world = 0, 1
    if a.batch % world:
        raise SystemExit(f"--batch {a.batch} must divide by {world} ranks")

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

    losses, same, times = [], [], []
    per_epoch = len(batches) // a.epochs
    for i, idx in enumerate(batches):
        mine = idx[rank::world]
        xb, yb = jnp.asarray(x[mine]), jnp.asarray(y[mine])
        t0 = time.perf_counter()
        params, mom, loss = step(params, mom, xb, yb)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
        if distributed:
            loss = mj.all_reduce(loss, op="avg")  # the global batch's loss
            leaves = [np.asarray(p) for p in jax.tree.leaves(params)]
            same.append(digits.all_same(mj.all_gather(jnp.asarray(digits.digest(leaves))),
                                        world))
        losses.append(float(loss))
        if rank == 0 and (i + 1) % per_epoch == 0:
            ep = losses[-per_epoch:]
            print(f"[jax {a.backend} x{world}] epoch {(i + 1) // per_epoch}: "
                  f"loss {statistics.mean(ep):.4f}", flush=True)

    acc = float(jnp.mean(jnp.argmax(logits(params, jnp.asarray(x[test])), 1) == y[test]))
    med = statistics.median(times[1:]) * 1e3
    if rank == 0:
        print(f"[jax {a.backend} x{world}] test accuracy {acc:.3f}; median step {med:.3f} ms "
              "(forward, backward with gradient all-reduce, update)", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"framework": "jax", "backend": a.backend, "world": world,
                           "losses": losses, "same_params": same, "accuracy": acc,
                           "median_step_ms": med}, f)


if __name__ == "__main__":
    main()
