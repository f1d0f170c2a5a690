"""Data-parallel training in TensorFlow on Monel: an MLP classifies the handwritten digits,
the step a tf.function with Monel's DistributedGradientTape.

    monel launch -n 4 -- python examples/tf_train.py
    python examples/tf_train.py --backend none          # one process, the reference

Every world size follows the same loss curve up to float rounding (see digits.py). Prints
the loss per epoch and the median time per step; --json FILE writes the loss per step,
whether the ranks' parameters were bitwise equal after every step, and the accuracy.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import digits  # noqa: E402


def main() -> None:
    a = digits.arguments("TensorFlow").parse_args()
    distributed = a.backend == "monel"
    if distributed:
        import monel.tensorflow as mtf

        mtf.init()
        rank, world = mtf.rank(), mtf.size()
    else:
        rank, world = 0, 1
    digits.check_batch(a.batch, world)
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

    log = digits.Log(a, "tensorflow", rank, world, len(batches))
    for idx in batches:
        mine = idx[rank::world]
        xb, yb = tf.constant(x[mine]), tf.constant(y[mine])
        t0 = time.perf_counter()
        loss = step(xb, yb)
        loss.numpy()
        seconds, same = time.perf_counter() - t0, None
        if distributed:
            loss = mtf.all_reduce(loss, op="avg")  # the global batch's loss
            d = digits.digest([p.numpy() for p in params])
            same = digits.all_same(mtf.all_gather(tf.constant(d)).numpy(), world)
        log.step(float(loss), seconds, same)

    pred = tf.argmax(logits(tf.constant(x[test])), 1).numpy()
    log.finish(float(np.mean(pred == y[test])))


if __name__ == "__main__":
    main()
