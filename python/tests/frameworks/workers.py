"""Rank programs for the framework tests: `python workers.py NAME` under torchrun-style
variables. Each checks its results itself against numpy (an assertion fails the rank) and
prints one JSON line last. The framework is imported by the program that needs it: JAX and
TensorFlow share one environment, MXNet has its own."""

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workers import inputs, reduce_ref

import monel

BIG = 300_001  # float32 elements: over the fusion limit, so reduced straight from the input


def _close(got, want, dtype_name):
    got = np.asarray(got, np.float64)
    if "float" in dtype_name:
        tol = 2e-2 if dtype_name == "bfloat16" else 1e-6
        return np.allclose(got, want, rtol=tol, atol=tol)
    return np.array_equal(got, np.trunc(want))


def check_collectives(mod, to_fw, to_np, compile_, dtypes):
    """Every collective of a framework module (`mod`), eagerly and compiled (`compile_` wraps
    a function as jax.jit or tf.function does; None: eager only), on nests of arrays of
    several shapes, against numpy."""
    r, n = mod.rank(), mod.size()
    modes = [("eager", lambda f: f)] + ([("compiled", compile_)] if compile_ else [])
    checks = 0
    for name, np_type in dtypes:

        def mk(rank, shape, salt=0):
            size = int(np.prod(shape, dtype=np.int64))
            return inputs(rank, size, np.float32, salt).reshape(shape).astype(np_type)

        shapes = [(), (7,), (2, 3)] + ([(BIG,)] if name == "float32" else [])
        for mode, wrap in modes:
            for op in ("sum", "max", "avg") if "float" in name else ("sum", "min"):
                tree = {"x": [to_fw(mk(r, s, i)) for i, s in enumerate(shapes)]}
                got = wrap(lambda t: mod.all_reduce(t, op=op))(tree)
                for i, s in enumerate(shapes):
                    want = reduce_ref([mk(q, s, i).astype(np.float64) for q in range(n)], op)
                    g = to_np(got["x"][i])
                    assert g.shape == s, (mode, op, g.shape, s)
                    assert _close(g, want, name), (
                        name,
                        mode,
                        op,
                        s,
                        g.ravel()[:4],
                        np.ravel(want)[:4],
                    )
                    checks += 1
            root = n - 1
            got = wrap(lambda t: mod.broadcast(t, root=root))([to_fw(mk(r, (5,)))])
            assert _close(to_np(got[0]), mk(root, (5,)).astype(np.float64), name)
            got = wrap(mod.all_gather)(to_fw(mk(r, (2, 2))))
            want = np.concatenate([mk(q, (2, 2)) for q in range(n)]).astype(np.float64)
            assert to_np(got).shape == (2 * n, 2) and _close(to_np(got), want, name)
            got = wrap(mod.all_gather)(to_fw(mk(r, ())))
            want = np.array([mk(q, ()) for q in range(n)], np.float64)
            assert _close(to_np(got), want, name), (to_np(got), want)
            x = [mk(q, (2 * n, 3)) for q in range(n)]
            got = to_np(wrap(lambda t: mod.reduce_scatter(t, op="sum"))(to_fw(x[r])))
            want = reduce_ref([a.astype(np.float64) for a in x], "sum")[2 * r : 2 * r + 2]
            assert got.shape == (2, 3) and _close(got, want, name), (got, want)
            x = [mk(q, (2 * n,), 5) for q in range(n)]
            got = to_np(wrap(mod.all_to_all)(to_fw(x[r])))
            want = np.concatenate([x[q][2 * r : 2 * r + 2] for q in range(n)]).astype(np.float64)
            assert _close(got, want, name), (got, want)
            checks += 5
    return checks


def expect(errors, kinds, fn):
    try:
        fn()
    except kinds as e:
        errors.append(f"{type(e).__name__}: {e}"[:300])
        return e
    raise AssertionError(f"no {kinds} raised")


def dead_peer(mod, to_fw, kinds):
    """The last rank dies without a word; the others' next all_reduce raises `kinds`."""
    mod.init()
    mod.all_reduce(to_fw(np.ones(1, np.float32)))
    if mod.rank() == mod.size() - 1:
        os._exit(0)
    t = time.monotonic()
    errors = []
    e = expect(errors, kinds, lambda: mod.all_reduce(to_fw(np.ones(1 << 16, np.float32))))
    print(
        json.dumps(
            {
                "rank": mod.rank(),
                "errors": errors,
                "ranks": getattr(e, "ranks", []),
                "monel": isinstance(e, monel.MonelError),
                "seconds": time.monotonic() - t,
            }
        )
    )


# -- JAX -------------------------------------------------------------------------------------


def _jax():
    import jax
    import jax.numpy as jnp

    import monel.jax as mj

    mj.init()
    return jax, jnp, mj


def jax_collectives():
    jax, jnp, mj = _jax()
    out = []
    to_np = lambda x: (out.append(type(x)), np.asarray(x))[1]
    checks = check_collectives(
        mj,
        jnp.asarray,
        to_np,
        jax.jit,
        [("float32", np.float32), ("int32", np.int32), ("bfloat16", jnp.bfloat16)],
    )
    assert all(issubclass(t, jax.Array) for t in out), set(out)
    print(json.dumps({"rank": mj.rank(), "checks": checks}))


def jax_errors():
    jax, jnp, mj = _jax()
    r = mj.rank()
    errors = []
    # Shapes that differ across ranks (the same bytes in all): Monel's typed error, eagerly
    # and from inside jit (where JAX re-raises a callback's error as its own).
    expect(
        errors, monel.MismatchError, lambda: mj.all_reduce([jnp.ones((2, 3) if r == 0 else (3, 2))])
    )
    e = expect(
        errors, Exception, lambda: jax.jit(mj.all_reduce)(jnp.ones(3 + r)).block_until_ready()
    )
    assert "MismatchError" in str(e), str(e)[:500]
    expect(errors, monel.InvalidArgumentError, lambda: mj.all_reduce(jnp.ones(3), op="mean"))
    expect(errors, monel.InvalidArgumentError, lambda: mj.reduce_scatter(jnp.ones(3)))
    expect(errors, monel.InvalidArgumentError, lambda: jax.jit(mj.reduce_scatter)(jnp.ones(3)))
    expect(errors, monel.InvalidArgumentError, lambda: mj.all_reduce(jnp.ones(3, jnp.complex64)))
    # Still usable after each.
    assert float(mj.all_reduce(jnp.ones(()))) == mj.size()
    print(json.dumps({"rank": r, "errors": errors}))


def jax_dead_peer():
    import jax.numpy as jnp

    import monel.jax as mj

    dead_peer(mj, jnp.asarray, (monel.PeerLostError, monel.CommTimeoutError, monel.AbortedError))


# -- TensorFlow ------------------------------------------------------------------------------


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import monel.tensorflow as mtf

    mtf.init()
    return tf, mtf


def tf_collectives():
    tf, mtf = _tf()
    out = []
    to_np = lambda x: (out.append(type(x)), np.asarray(x.numpy()))[1]
    checks = check_collectives(
        mtf,
        tf.constant,
        to_np,
        tf.function,
        [("float32", np.float32), ("int32", np.int32), ("bfloat16", tf.bfloat16.as_numpy_dtype)],
    )
    assert all(issubclass(t, tf.Tensor) for t in out), set(out)
    # Variables: broadcast into them, eagerly and in a graph.
    r = mtf.rank()
    v = tf.Variable(tf.fill([3], float(r)))
    mtf.broadcast_variables([v], root=mtf.size() - 1)
    assert (v.numpy() == mtf.size() - 1).all(), v.numpy()
    w = tf.Variable(tf.fill([4], float(r + 5)))
    tf.function(lambda: mtf.broadcast_variables([w], root=0))()
    assert (w.numpy() == 5).all(), w.numpy()
    # The distributed tape averages the ranks' gradients (None stays None).
    m, unused = tf.Variable([[1.0, 2.0]]), tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(m * (r + 1.0))
    g = mtf.DistributedGradientTape(tape).gradient(loss, [m, unused])
    want = sum(q + 1.0 for q in range(mtf.size())) / mtf.size()
    assert np.allclose(g[0].numpy(), want) and g[1] is None, g
    print(json.dumps({"rank": r, "checks": checks + 3}))


def tf_errors():
    tf, mtf = _tf()
    r = mtf.rank()
    errors = []
    # Eagerly a Monel error is also TensorFlow's; in a graph TensorFlow's own type.
    e = expect(
        errors, monel.MismatchError, lambda: mtf.all_reduce([tf.ones((2, 3) if r == 0 else (3, 2))])
    )
    assert isinstance(e, tf.errors.InvalidArgumentError), type(e).__mro__
    e = expect(
        errors, tf.errors.InvalidArgumentError, lambda: tf.function(mtf.all_reduce)(tf.ones(3 + r))
    )
    assert "MismatchError" in str(e), str(e)[:500]
    e = expect(errors, monel.InvalidArgumentError, lambda: mtf.all_reduce(tf.ones(3), op="mean"))
    assert isinstance(e, tf.errors.InvalidArgumentError)
    expect(errors, monel.InvalidArgumentError, lambda: mtf.reduce_scatter(tf.ones(3)))
    expect(
        errors, tf.errors.InvalidArgumentError, lambda: tf.function(mtf.reduce_scatter)(tf.ones(3))
    )
    expect(errors, monel.InvalidArgumentError, lambda: mtf.all_reduce(tf.ones(3, tf.complex64)))
    assert float(mtf.all_reduce(tf.ones(())).numpy()) == mtf.size()
    print(json.dumps({"rank": r, "errors": errors}))


def tf_dead_peer():
    import tensorflow as tf

    import monel.tensorflow as mtf

    dead_peer(
        mtf,
        tf.constant,
        (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError),
    )


# -- MXNet -----------------------------------------------------------------------------------


def _mx():
    import mxnet as mx

    import monel.mxnet as mmx

    mmx.init()
    return mx, mmx


def mxnet_collectives():
    mx, mmx = _mx()
    out = []
    to_np = lambda x: (out.append(type(x)), x.asnumpy())[1]

    class Nested:
        """monel.mxnet takes an NDArray or a list: the nests of the shared check, flattened."""

        def __getattr__(self, name):
            return getattr(mmx, name)

        def all_reduce(self, t, op):
            return {"x": mmx.all_reduce(t["x"], op)}

        def broadcast(self, t, root):
            return mmx.broadcast(t, root)

    checks = check_collectives(
        Nested(),
        lambda a: mx.nd.array(a, dtype=a.dtype),
        to_np,
        None,
        [("float32", np.float32), ("int32", np.int32)],
    )
    assert all(issubclass(t, mx.nd.NDArray) for t in out), set(out)
    r, n = mmx.rank(), mmx.size()
    # In place: small ones fused, a big one straight in the NDArray's memory.
    xs = [mx.nd.full((3,), r + 1.0), mx.nd.full((BIG,), r + 1.0), mx.nd.full((2, 2), -r)]
    xs = [x * 1 for x in xs]  # pending engine writes: the call must wait for them
    mmx.all_reduce_(xs, op="sum")
    tot = n * (n + 1) / 2
    assert (xs[0].asnumpy() == tot).all() and (xs[1].asnumpy() == tot).all()
    assert (xs[2].asnumpy() == -n * (n - 1) / 2).all()
    ys = [mx.nd.full((4,), float(r)), mx.nd.full((2,), float(r), dtype="int32")]
    mmx.broadcast_(ys, root=n - 1)
    assert (ys[0].asnumpy() == n - 1).all() and (ys[1].asnumpy() == n - 1).all()
    print(json.dumps({"rank": r, "checks": checks + 2}))


def mxnet_errors():
    mx, mmx = _mx()
    r = mmx.rank()
    errors = []
    e = expect(
        errors,
        monel.MismatchError,
        lambda: mmx.all_reduce([mx.nd.ones((2, 3) if r == 0 else (3, 2))]),
    )
    assert isinstance(e, mx.base.MXNetError), type(e).__mro__
    e = expect(errors, monel.InvalidArgumentError, lambda: mmx.all_reduce(mx.nd.ones(3), "mean"))
    assert isinstance(e, mx.base.MXNetError)
    expect(errors, monel.InvalidArgumentError, lambda: mmx.all_reduce(np.ones(3)))
    expect(
        errors,
        monel.InvalidArgumentError,
        lambda: mmx.all_reduce(mx.nd.ones((4, 4)).tostype("csr")),
    )
    expect(errors, monel.InvalidArgumentError, lambda: mmx.reduce_scatter(mx.nd.ones(3)))
    assert float(mmx.all_reduce(mx.nd.ones(1)).asscalar()) == mmx.size()
    print(json.dumps({"rank": r, "errors": errors}))


def mxnet_dead_peer():
    import mxnet as mx

    import monel.mxnet as mmx

    dead_peer(mmx, mx.nd.array, (mx.base.MXNetError,))


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
