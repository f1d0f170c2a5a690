"""Data-parallel training in MXNet Gluon on Monel: an MLP classifies the handwritten digits,
with Monel's DistributedTrainer (MXNet 1.9.1 with numpy < 1.24, in its own environment).

    monel launch -n 4 -- python examples/mxnet_train.py
    python examples/mxnet_train.py --backend none          # one process, the reference

Every world size follows the same loss curve up to float rounding (see digits.py). Prints
the loss per epoch and the median time per step; --json FILE writes the loss per step,
whether the ranks' parameters were bitwise equal after every step, and the accuracy.
"""

import argparse
import json
import statistics
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import digits


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
        import monel.mxnet as mmx

        mmx.init()
        rank, world = mmx.rank(), mmx.size()
    else:
        rank, world = 0, 1
    if a.batch % world:
        raise SystemExit(f"--batch {a.batch} must divide by {world} ranks")

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

    losses, same, times = [], [], []
    per_epoch = len(batches) // a.epochs
    for i, idx in enumerate(batches):
        mine = idx[rank::world]
        xb, yb = mx.nd.array(x[mine]), mx.nd.array(y[mine])
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(xb), yb)
        loss.backward()
        trainer.step(len(mine))
        loss = loss.mean()
        loss.wait_to_read()
        mx.nd.waitall()
        times.append(time.perf_counter() - t0)
        if distributed:
            loss = mmx.all_reduce(loss, op="avg")  # the global batch's loss
            d = digits.digest([p.data().asnumpy() for _, p in sorted(params.items())])
            same.append(digits.all_same(mmx.all_gather(mx.nd.array(d, dtype="uint8")).asnumpy(),
                                        world))
        losses.append(float(loss.asscalar()))
        if rank == 0 and (i + 1) % per_epoch == 0:
            print(f"[mxnet {a.backend} x{world}] epoch {(i + 1) // per_epoch}: "
                  f"loss {statistics.mean(losses[-per_epoch:]):.4f}", flush=True)

    pred = net(mx.nd.array(x[test])).argmax(axis=1).asnumpy()
    acc = float(np.mean(pred == y[test]))
    med = statistics.median(times[1:]) * 1e3
    if rank == 0:
        print(f"[mxnet {a.backend} x{world}] test accuracy {acc:.3f}; median step {med:.3f} ms "
              "(forward, backward with gradient all-reduce, update)", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"framework": "mxnet", "backend": a.backend, "world": world,
                           "losses": losses, "same_params": same, "accuracy": acc,
                           "median_step_ms": med}, f)


if __name__ == "__main__":
    main()
