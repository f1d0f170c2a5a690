"""A training step's gradient all-reduce through Monel against the framework's own
multi-worker path on CPU, in the same processes, rounds interleaved; medians.

    monel launch -n 2 -- python bench/frameworks/allreduce.py tensorflow
    monel launch -n 2 -- python bench/frameworks/allreduce.py jax
    monel launch -n 2 -- python bench/frameworks/allreduce.py mxnet      # MXNet's own venv

The framework paths: TensorFlow's MultiWorkerMirroredStrategy with its ring collectives
(gRPC), JAX's multi-process CPU collectives (gloo) under jit, MXNet's kvstore dist_sync
(a parameter server: one scheduler and one server process, started by rank 0). Gradient
sets: the digits MLP (4 tensors, 77 KB), 4 MiB in one tensor, and 64 MiB in 16 tensors.
Rank 0 prints one line per set and path: median milliseconds per all-reduce, and the
framework's time over Monel's.
"""

import os
import statistics
import subprocess
import sys
import time

import numpy as np

SETS = {
    "mlp 77KB x4": [(64, 256), (256,), (256, 10), (10,)],
    "4MiB x1": [(1 << 20,)],
    "64MiB x16": [(1 << 20,)] * 16,
}
ROUNDS, ITERS, WARM = 5, 10, 3


def env():
    return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
            int(os.environ["MASTER_PORT"]))


def timed(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def race(paths, rank, check):
    """paths: {name: {set: callable}}; every set, rounds interleaved over paths."""
    for s in SETS:
        for p in paths.values():
            for _ in range(WARM):
                p[s]()
        check(s)
        med = {name: [] for name in paths}
        for _ in range(ROUNDS):
            for name, p in paths.items():
                med[name].append(timed(p[s], ITERS))
        if rank == 0:
            ms = {k: statistics.median(v) * 1e3 for k, v in med.items()}
            base = ms[next(iter(ms))]
            for k, v in ms.items():
                print(f"{s:12} {k:34} {v:9.3f} ms  {v / base:5.2f}x of Monel's time",
                      flush=True)


def grads(np_type=np.float32, rank=0):
    return {s: [np.full(sh, rank + 1.0, np_type) for sh in shapes] for s, shapes in SETS.items()}


def tensorflow():
    import json

    rank, n, port = env()
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port + 1 + i}" for i in range(n)]},
        "task": {"type": "worker", "index": rank}})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import monel.tensorflow as mtf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    mtf.init()
    g = {s: [tf.constant(a) for a in v] for s, v in grads(rank=rank).items()}

    def mwms_step(ts):
        """One step's all-reduce as MultiWorkerMirroredStrategy runs it (a tf.function per
        gradient set, the tensors captured)."""
        return tf.function(lambda: strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("sum", ts)))

    mwms = {s: mwms_step(v) for s, v in g.items()}
    monel_fn = tf.function(lambda ts: mtf.all_reduce(ts))
    paths = {
        "monel, eager": {s: (lambda v=v: mtf.all_reduce(v)[0].numpy()) for s, v in g.items()},
        "monel, in tf.function": {s: (lambda v=v: monel_fn(v)[0].numpy()) for s, v in g.items()},
        "MultiWorkerMirrored RING (gRPC)": {
            s: (lambda f=f: f()[0].numpy()) for s, f in mwms.items()},
    }

    def check(s):
        want = n * (n + 1) / 2
        a = mtf.all_reduce(g[s])[0].numpy()
        b = mwms[s]()[0].numpy()
        assert (a == want).all() and (b == want).all(), (a[:2], b[:2])

    race(paths, rank, check)


def jax():
    rank, n, port = env()
    import jax as j

    j.config.update("jax_cpu_collectives_implementation", "gloo")
    j.distributed.initialize(f"127.0.0.1:{port + 1}", n, rank)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import monel.jax as mj

    mj.init()
    mesh = j.make_mesh((n,), ("p",))
    sharded = NamedSharding(mesh, P("p"))

    def gloo_sum(leaves):
        return [x.sum(0) for x in leaves]

    gloo = j.jit(gloo_sum, out_shardings=NamedSharding(mesh, P()))
    local = {s: [jnp.asarray(a) for a in v] for s, v in grads(rank=rank).items()}
    glob = {s: [j.make_array_from_process_local_data(sharded, np.asarray(a)[None])
                for a in v] for s, v in local.items()}
    mj_jit = j.jit(lambda ts: mj.all_reduce(ts))

    def first(out):
        return np.asarray(out[0].addressable_data(0) if hasattr(out[0], "addressable_data")
                          else out[0])

    paths = {
        "monel, eager": {s: (lambda v=v: mj.all_reduce(v)[0].block_until_ready())
                         for s, v in local.items()},
        "monel, in jit (io_callback)": {s: (lambda v=v: mj_jit(v)[0].block_until_ready())
                                        for s, v in local.items()},
        "jax multi-process CPU (gloo), jit": {
            s: (lambda v=v: gloo(v)[0].block_until_ready()) for s, v in glob.items()},
    }

    def check(s):
        want = n * (n + 1) / 2
        a = np.asarray(mj.all_reduce(local[s])[0])
        b = first(gloo(glob[s]))
        assert (a == want).all() and (b == want).all(), (a.ravel()[:2], b.ravel()[:2])

    race(paths, rank, check)


def mxnet():
    rank, n, port = env()
    ps = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port + 1),
          "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": str(n)}
    os.environ.update(ps)
    helpers = []
    if rank == 0:
        for role in ("scheduler", "server"):
            e = dict(os.environ, DMLC_ROLE=role)
            helpers.append(subprocess.Popen(
                [sys.executable, "-c", "import mxnet"], env=e))
    os.environ["DMLC_ROLE"] = "worker"
    import mxnet as mx

    import monel.mxnet as mmx

    store = [mx.kv.create("dist_sync")]  # emptied at the end: the workers leave ps-lite
    kv = store[0]
    mmx.init()
    r = mmx.rank()
    g = {s: [mx.nd.array(a) for a in v] for s, v in grads(rank=r).items()}
    keys = {}
    k = 0
    for s, v in g.items():
        keys[s] = list(range(k, k + len(v)))
        k += len(v)
        kv.init(keys[s], [mx.nd.zeros(a.shape) for a in v])

    def kv_sum(s):
        # On copies, as the in-place Monel path: the dist kvstore writes into its inputs.
        outs = [mx.nd.empty(a.shape) for a in g[s]]
        store[0].pushpull(keys[s], [a.copy() for a in g[s]], out=outs)
        mx.nd.waitall()
        return outs

    paths = {
        "monel all_reduce_ (in place)": {s: (lambda v=v: (mmx.all_reduce_([a.copy() for a in v])))
                                         for s, v in g.items()},
        "monel all_reduce (new arrays)": {s: (lambda v=v: mmx.all_reduce(v)) for s, v in g.items()},
        "kvstore dist_sync (ps-lite)": {s: (lambda s=s: kv_sum(s)) for s in g},
    }

    def check(s):
        want = n * (n + 1) / 2
        a = mmx.all_reduce(g[s])[0].asnumpy()
        b = kv_sum(s)[0].asnumpy()
        assert (a == want).all(), ("monel", a.ravel()[:2], g[s][0].asnumpy().ravel()[:2])
        assert (b == want).all(), ("kvstore", b.ravel()[:2])

    race(paths, r, check)
    mmx.shutdown()
    del kv
    store.clear()
    for h in helpers:
        h.wait(timeout=30)


if __name__ == "__main__":
    {"tensorflow": tensorflow, "jax": jax, "mxnet": mxnet}[sys.argv[1]]()
