"""Data-parallel `model.fit` in Keras 3 on Monel, on the TensorFlow or the JAX back end: an
MLP classifies the handwritten digits.

    monel launch -n 4 -- python examples/keras_train.py --keras-backend jax
    python examples/keras_train.py --keras-backend jax --backend none     # the reference

The two lines that make it data-parallel: the optimizer wrapped in
`monel.keras.DistributedOptimizer`, and `BroadcastGlobalVariablesCallback` among the
callbacks (plus each rank fitting on its shard with batch size global // ranks). Every world
size follows the same loss curve up to float rounding (see digits.py); --json FILE writes the
loss per step, whether the ranks' weights were bitwise equal after every step, and the
accuracy.
"""

import os
import sys
import time


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import digits

    ap = digits.arguments("Keras 3")
    ap.add_argument("--keras-backend", default="tensorflow", choices=["tensorflow", "jax"])
    a = ap.parse_args()
    os.environ["KERAS_BACKEND"] = a.keras_backend  # before Keras is imported
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    distributed = a.backend == "monel"
    if distributed:
        import monel.keras as mk

        mk.init()
        rank, world = mk.rank(), mk.size()
    else:
        rank, world = 0, 1
    digits.check_batch(a.batch, world)

    x, y = digits.load(a.digits)
    batches, test = digits.steps(a.epochs, a.batch, a.seed)
    keras.utils.set_random_seed(a.seed)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(a.hidden, activation="relu",
                           kernel_initializer=keras.initializers.GlorotUniform(a.seed)),
        keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(a.seed + 1)),
    ])

    class StepLoss(keras.metrics.Metric):
        """The last batch's loss (Keras reports a running mean)."""

        def __init__(self):
            super().__init__(name="step_loss")
            self.v = self.add_variable(shape=(), initializer="zeros", name="v")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.v.assign(keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
                y_true, y_pred, from_logits=True)))

        def result(self):
            return keras.ops.convert_to_tensor(self.v)

    opt = keras.optimizers.SGD(a.lr, momentum=0.9)
    callbacks = []
    if distributed:
        opt = mk.DistributedOptimizer(opt)                    # averages the gradients
        callbacks.append(mk.BroadcastGlobalVariablesCallback(0))  # rank 0's initial weights
    model.compile(optimizer=opt, metrics=[StepLoss()],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    log = digits.Log(a, f"keras/{a.keras_backend}", rank, world, len(batches))

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds, same = time.perf_counter() - self.t0, None
            loss = float(logs["step_loss"])
            if distributed:
                loss = float(mk.all_reduce(np.float32(loss), op="avg"))
                d = digits.digest([keras.ops.convert_to_numpy(v) for v in self.model.weights])
                same = digits.all_same(keras.ops.convert_to_numpy(mk.all_gather(d)), world)
            log.step(loss, seconds, same)

    per_epoch = len(batches) // a.epochs
    for e in range(a.epochs):
        mine = np.concatenate([idx[rank::world] for idx in
                               batches[e * per_epoch:(e + 1) * per_epoch]])
        model.fit(x[mine], y[mine], batch_size=a.batch // world, epochs=1, shuffle=False,
                  verbose=0, callbacks=callbacks + [Record()])

    log.finish(float(np.mean(np.argmax(model.predict(x[test], verbose=0), 1) == y[test])))


if __name__ == "__main__":
    main()
