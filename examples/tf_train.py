"""Data-parallel training in TensorFlow on Monel: an MLP classifies the handwritten digits,
the step a tf.function with Monel's DistributedGradientTape.

    monel launch -n 4 -- python examples/tf_train.py
    python examples/tf_train.py --backend none          # one process, the reference

Every world size follows the same loss curve up to float rounding (see digits.py). Prints
the loss per epoch and the median time per step; --json FILE writes the loss per step,
whether the ranks' parameters were bitwise equal after every step, and the accuracy.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import digits  # noqa: E402


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
        import monel.tensorflow as mtf

        mtf.init()
        rank, world = mtf.rank(), mtf.size()
    else:
        rank, world = 0, 1
    if a.batch % world:
        raise SystemExit(f"--batch {a.batch} must divide by {world} ranks")
    tf.config.threading.set_intra_op_parallelism_threads(1)

    x, y = digits.load(a.digits)
    batches, test = digits.steps(a.epochs, a.batch, a.seed)
    lim1, lim2 = (6 / (64 + a.hidden)) ** 0.5, (6 / (a.hidden + 10)) ** 0.5
    params = [
        tf.Variable(tf.random.stateless_uniform((64, a.hidden), (a.seed, 1), -lim1, lim1)),
        tf.Variable(tf.zeros(a.hidden)),
        tf.Variable(tf.random.stateless_uniform((a.hidden, 10), (a.seed, 2), -lim2, lim2)),
        tf.Variable(tf.zeros(10)),
    ]
    if distributed:
        mtf.broadcast_variables(params, root=0)
    mom = [tf.Variable(tf.zeros_like(p)) for p in params]

    def logits(xb):
        w1, b1, w2, b2 = params
        return tf.nn.relu(xb @ w1 + b1) @ w2 + b2

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits(xb)))
        if distributed:
            tape = mtf.DistributedGradientTape(tape)  # averages the gradients over the ranks
        grads = tape.gradient(loss, params)
        for p, m, g in zip(params, mom, grads):
            m.assign(0.9 * m + g)
            p.assign_sub(a.lr * m)
        return loss

    losses, same, times = [], [], []
    per_epoch = len(batches) // a.epochs
    for i, idx in enumerate(batches):
        mine = idx[rank::world]
        xb, yb = tf.constant(x[mine]), tf.constant(y[mine])
        t0 = time.perf_counter()
        loss = step(xb, yb)
        loss.numpy()
        times.append(time.perf_counter() - t0)
        if distributed:
            loss = mtf.all_reduce(loss, op="avg")  # the global batch's loss
            d = digits.digest([p.numpy() for p in params])
            same.append(digits.all_same(mtf.all_gather(tf.constant(d)).numpy(), world))
        losses.append(float(loss))
        if rank == 0 and (i + 1) % per_epoch == 0:
            print(f"[tensorflow {a.backend} x{world}] epoch {(i + 1) // per_epoch}: "
                  f"loss {statistics.mean(losses[-per_epoch:]):.4f}", flush=True)

    pred = tf.argmax(logits(tf.constant(x[test])), 1).numpy()
    acc = float(np.mean(pred == y[test]))
    med = statistics.median(times[1:]) * 1e3
    if rank == 0:
        print(f"[tensorflow {a.backend} x{world}] test accuracy {acc:.3f}; median step "
              f"{med:.3f} ms (forward, backward with gradient all-reduce, update)", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"framework": "tensorflow", "backend": a.backend, "world": world,
                           "losses": losses, "same_params": same, "accuracy": acc,
                           "median_step_ms": med}, f)


if __name__ == "__main__":
    main()
