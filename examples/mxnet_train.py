"""Data-parallel training in MXNet Gluon on Monel: an MLP classifies the handwritten digits,
with Monel's DistributedTrainer (MXNet 1.9.1 with numpy < 1.24, in its own environment).

    monel launch -n 4 -- python examples/mxnet_train.py
    python examples/mxnet_train.py --backend none          # one process, the reference

Every world size follows the same loss curve up to float rounding (see digits.py). Prints
the loss per epoch and the median time per step; --json FILE writes the loss per step,
whether the ranks' parameters were bitwise equal after every step, and the accuracy.
"""

import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import digits


def main() -> None:
    a = digits.arguments("MXNet").parse_args()
    distributed = a.backend == "monel"
    if distributed:
        import monel.mxnet as mmx

        mmx.init()
        rank, world = mmx.rank(), mmx.size()
    else:
        rank, world = 0, 1
    digits.check_batch(a.batch, world)

    x, y = digits.load(a.digits)
    batches, test = digits.steps(a.epochs, a.batch, a.seed)
    mx.random.seed(a.seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(a.hidden, activation="relu", in_units=64),
            gluon.nn.Dense(10, in_units=a.hidden))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    opt = {"learning_rate": a.lr, "momentum": 0.9}
    if distributed:
        mmx.broadcast_parameters(params, root=0)
        trainer = mmx.DistributedTrainer(params, "sgd", opt)
    else:
        trainer = gluon.Trainer(params, "sgd", opt, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    log = digits.Log(a, "mxnet", rank, world, len(batches))
    for idx in batches:
        mine = idx[rank::world]
        xb, yb = mx.nd.array(x[mine]), mx.nd.array(y[mine])
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(xb), yb)
        loss.backward()
        trainer.step(len(mine))
        loss = loss.mean()
        mx.nd.waitall()
        seconds, same = time.perf_counter() - t0, None
        if distributed:
            loss = mmx.all_reduce(loss, op="avg")  # the global batch's loss
            d = digits.digest([p.data().asnumpy() for _, p in sorted(params.items())])
            same = digits.all_same(mmx.all_gather(mx.nd.array(d, dtype="uint8")).asnumpy(), world)
        log.step(float(loss.asscalar()), seconds, same)

    pred = net(mx.nd.array(x[test])).argmax(axis=1).asnumpy()
    log.finish(float(np.mean(pred == y[test])))


if __name__ == "__main__":
    main()
