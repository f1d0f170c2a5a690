"""Rank programs for the tests: `python workers.py NAME [ARGS]` under torchrun-style
variables. Each checks its results itself (an assertion fails the rank) and prints one JSON
line last."""

import json
import os
import sys
import time

import numpy as np

import monel

NP_TYPES = [
    np.int8,
    np.uint8,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


def inputs(rank, n, dtype, salt=0):
    """Small values, so sums and products stay exact in every type."""
    return ((np.arange(n) * 7 + rank * 3 + salt) % 5 + 1).astype(dtype)


def reduce_ref(arrs, op):
    a = np.stack([x.astype(np.float64) for x in arrs])
    r = {
        "sum": a.sum(0),
        "prod": a.prod(0),
        "min": a.min(0),
        "max": a.max(0),
        "avg": a.sum(0) / len(arrs),
    }[op]
    return r


def close(got, want, dtype):
    if np.dtype(dtype).kind == "f":
        tol = 1e-2 if dtype == np.float16 else 1e-6
        return np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    return np.array_equal(got.astype(np.float64), np.trunc(want))


def collectives():
    c = monel.Communicator.from_env()
    r, n = c.rank, c.size
    checks = 0
    for dt in NP_TYPES:
        for count in (1, 7, 1000):
            ins = [inputs(q, count, dt) for q in range(n)]
            for op in ("sum", "prod", "min", "max", "avg"):
                if op == "avg" and np.dtype(dt).kind != "f":
                    continue
                if op == "prod" and n > 3 and np.dtype(dt).itemsize == 1:
                    continue
                want = reduce_ref(ins, op)
                out = np.zeros(count, dt)
                c.all_reduce(ins[r], out, op=op)
                assert close(out, want, dt), (dt, count, op, out[:5], want[:5])
                x = ins[r].copy()
                c.all_reduce(x, op=op)  # in place
                assert close(x, want, dt), (dt, count, op, "in place")
                checks += 2
            root = n - 1
            b = ins[r].copy() if r == root else np.zeros(count, dt)
            c.broadcast(b, root=root)
            assert np.array_equal(b, ins[root])
            red = np.zeros(count, dt)
            c.reduce(ins[r], root=0, out=red, op="max")
            if r == 0:
                assert close(red, reduce_ref(ins, "max"), dt)
            ag = np.zeros(count * n, dt)
            c.all_gather(ins[r], ag)
            assert np.array_equal(ag, np.concatenate(ins))
            big = [inputs(q, count * n, dt, 1) for q in range(n)]
            rs = np.zeros(count, dt)
            c.reduce_scatter(big[r], rs)
            assert close(rs, reduce_ref(big, "sum")[r * count : (r + 1) * count], dt)
            a2a = np.zeros(count * n, dt)
            c.all_to_all(big[r], a2a)
            want = np.concatenate([big[q][r * count : (r + 1) * count] for q in range(n)])
            assert np.array_equal(a2a, want)
            g = np.zeros(count * n, dt) if r == 1 % n else None
            c.gather(ins[r], g, root=1 % n)
            if r == 1 % n:
                assert np.array_equal(g, np.concatenate(ins))
            sc = np.zeros(count, dt)
            c.scatter(big[0] if r == 0 else None, sc, root=0)
            assert np.array_equal(sc, big[0][r * count : (r + 1) * count])
            checks += 7
    # Point to point: a ring exchange in one group, then plain send/recv in order.
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = np.zeros(100, np.float32)
    c.group([("send", np.full(100, r, np.float32), nxt), ("recv", got, prv)])
    assert (got == prv).all()
    if r == 0:
        c.send(np.arange(10, dtype=np.int64), n - 1)
    elif r == n - 1:
        buf = np.zeros(10, np.int64)
        assert c.recv(buf, 0) == 0
        assert np.array_equal(buf, np.arange(10))
    # Tags: sent 1, 2; received 2, 1, each with its own data. Then from any rank.
    if r == 0:
        c.send(np.full(3, 1.0), n - 1, tag=1)
        c.send(np.full(5, 2.0), n - 1, tag=2)
    elif r == n - 1:
        two, one = np.zeros(5), np.zeros(3)
        w = c.recv(two, 0, async_op=True, tag=2)
        assert w.wait() and w.source == 0 and (two == 2.0).all()
        assert c.recv(one, None, tag=1) == 0 and (one == 1.0).all()
    c.barrier()
    # Async handles: issue three, then wait.
    xs = [np.full(4096, r + k, np.float32) for k in range(3)]
    ws = [c.all_reduce(x, async_op=True) for x in xs]
    for k, (w, x) in enumerate(zip(ws, xs)):
        assert w.wait() is True and w.is_completed() and w.is_success()
        assert (x == sum(q + k for q in range(n))).all()
    # split: even and odd ranks.
    sub = c.split(r % 2, key=-r)
    v = np.array([r], np.int64)
    sub.all_reduce(v)
    assert v[0] == sum(q for q in range(n) if q % 2 == r % 2)
    assert sub.rank == sorted([q for q in range(n) if q % 2 == r % 2], reverse=True).index(r)
    sub.destroy()
    print(json.dumps({"rank": r, "checks": checks, "paths": c.paths}))
    c.destroy()


def job_order():
    """Blocking calls run on the caller, async ones on the worker or on whoever waits first,
    deferred ones (the torch backend's) start by themselves when nobody waits: whatever the
    mix, operations run in issue order and every result is right."""
    c = monel.Communicator.from_env()
    r, n = c.rank, c.size
    started = time.monotonic()
    for defer in (False, True):
        c._defer = defer
        xs = [np.full(1000, r + k, np.float64) for k in range(6)]
        works = [c.all_reduce(xs[0], async_op=True), c.all_reduce(xs[1], async_op=True)]
        c.all_reduce(xs[2])  # blocking, behind two queued async operations
        works.append(c.all_reduce(xs[3], async_op=True))
        works[-1].wait()  # runs what is still queued ahead of it, then it
        works.append(c.all_reduce(xs[4], async_op=True))
        while not works[-1].is_completed():  # polling, never waiting
            time.sleep(0.001)
        works.append(c.all_reduce(xs[5], async_op=True))
        time.sleep(0.2)  # nobody waits or polls: the worker starts it by itself
        assert xs[5][0] == sum(q + 5 for q in range(n)), "an unwaited operation never ran"
        for w in works:
            w.wait()
        for k, x in enumerate(xs):
            assert np.all(x == sum(q + k for q in range(n))), (defer, k, x[:3])
    print(json.dumps({"ok": True, "seconds": time.monotonic() - started}))


def expecter(seen):
    """`expect(exc, f)`: calls f, which must raise exc; notes the error in `seen`, returns it."""

    def expect(exc, f):
        try:
            f()
        except exc as e:
            seen.append(f"{type(e).__name__}: {e}")
            return e
        raise AssertionError(f"no {exc.__name__}")

    return expect


def bad_input():
    c = monel.Communicator.from_env()
    seen = []
    expect = expecter(seen)

    x = np.ones(8, np.float32)
    expect(monel.InvalidArgumentError, lambda: c.all_reduce(np.ones(3, np.complex64)))
    expect(monel.InvalidArgumentError, lambda: c.all_reduce(np.ones((4, 4), np.float32)[:, 1]))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    expect(monel.InvalidArgumentError, lambda: c.all_reduce(x, ro))
    expect(monel.InvalidArgumentError, lambda: c.all_reduce(x, np.ones(8, np.int32)))
    expect(monel.InvalidArgumentError, lambda: c.all_reduce(x, np.ones(9, np.float32)))
    expect(monel.InvalidArgumentError, lambda: c.all_reduce(x, op="mean"))
    expect(monel.InvalidArgumentError, lambda: c.broadcast(x, root=c.size))
    expect(monel.InvalidArgumentError, lambda: c.all_gather(x, np.ones(3, np.float32)))
    expect(monel.InvalidArgumentError, lambda: c.send(x, peer=-1))
    expect(monel.InvalidArgumentError, lambda: c.all_reduce([1.0, 2.0]))
    expect(monel.InvalidArgumentError, lambda: c.all_reduce(x[2:], x[:6]))
    try:
        import torch

        t = torch.ones(4, 4)
        expect(monel.InvalidArgumentError, lambda: c.all_reduce(t.t()))
        expect(monel.InvalidArgumentError, lambda: c.all_reduce(torch.ones(3, dtype=torch.bool)))
    except ImportError:
        pass
    # Still usable after every local error.
    c.all_reduce(x)
    assert (x == c.size).all()
    print(json.dumps({"rank": c.rank, "errors": seen}))


def jax_arrays():
    """JAX arrays (through DLPack, no copy) as inputs of every kind of collective; outputs in
    numpy, since JAX arrays are immutable; in place on a JAX array refused in words."""
    import jax.numpy as jnp

    c = monel.Communicator.from_env()
    n, r = c.size, c.rank
    x = jnp.arange(6, dtype=jnp.float32) + r
    out = np.zeros(6, np.float32)
    c.all_reduce(x, out)
    want = sum(np.arange(6, dtype=np.float32) + k for k in range(n))
    assert (out == want).all(), out
    # The JAX array is untouched.
    assert (np.asarray(x) == np.arange(6) + r).all()
    g = np.zeros(6 * n, np.int32)
    c.all_gather(jnp.full(6, r, dtype=jnp.int32), g)
    assert (g == np.repeat(np.arange(n), 6)).all(), g
    b = np.zeros(4, np.float32)
    c.broadcast(jnp.full(4, 7.5 + r, dtype=jnp.float32), 0, b)
    assert (b == 7.5).all(), b
    errors = []
    try:
        c.all_reduce(x)
    except monel.InvalidArgumentError as e:
        errors.append(str(e))
    try:
        c.all_reduce(out, x)
    except monel.InvalidArgumentError as e:
        errors.append(str(e))
    # Still usable.
    y = np.ones(3, np.float32)
    c.all_reduce(y)
    assert (y == n).all()
    print(json.dumps({"rank": r, "errors": errors}))


def mismatch():
    c = monel.Communicator.from_env()
    n = 4 if c.rank == 0 else 5
    try:
        c.all_reduce(np.ones(n, np.float32))
    except monel.MonelError as e:
        print(json.dumps({"rank": c.rank, "error": type(e).__name__, "msg": str(e)}))
        return
    raise AssertionError("a count mismatch went unnoticed")


def dead_peer():
    c = monel.Communicator.from_env()
    c.barrier()
    if c.rank == c.size - 1:
        os._exit(0)  # dies without a word
    t = time.monotonic()
    try:
        c.all_reduce(np.ones(1 << 16, np.float32))
    except monel.MonelError as e:
        print(
            json.dumps(
                {
                    "rank": c.rank,
                    "error": type(e).__name__,
                    "ranks": e.ranks,
                    "msg": str(e),
                    "seconds": time.monotonic() - t,
                }
            )
        )
        return
    raise AssertionError("the dead peer went unnoticed")


def windows():
    """Arrays in symmetric memory windows: collectives on them (whole, out of place, a slice
    of a bigger window) give exact results and take the direct path (the test reads the
    MONEL_DEBUG=INFO log); views keep a window mapped after the window object is gone."""
    import gc

    c = monel.Communicator.from_env()
    r, n = c.rank, c.size
    tri = n * (n + 1) // 2
    a = c.empty((3, 50_000), np.float32)
    assert isinstance(a, np.ndarray) and a.shape == (3, 50_000) and a.dtype == np.float32
    base = (np.arange(150_000) % 7).reshape(3, 50_000)
    a[:] = base * (r + 1)
    c.all_reduce(a)
    assert np.array_equal(a, base * tri), a
    b = c.empty(150_000, np.float32)
    c.all_reduce(a, out=b.reshape(3, 50_000), op="max")
    assert np.array_equal(b.reshape(3, 50_000), base * tri)
    # A bucket inside a bigger window: the bytes around it stay as they were.
    w = c.alloc_window(1 << 20)
    assert len(w) == 1 << 20 and w.shared, w
    v = np.frombuffer(w, np.float64)
    v[:] = r + 1
    c.all_reduce(v[1000:9000])
    assert (v[1000:9000] == tri).all() and (v[:1000] == r + 1).all() and (v[9000:] == r + 1).all()
    # The view holds the window: dropping the object unmaps nothing.
    del w
    gc.collect()
    v[:] = 2.0
    c.all_reduce(v, op="prod")
    assert (v == 2.0**n).all()
    # An empty array, and a bad size.
    e = c.empty(0, np.float32)
    assert e.shape == (0,)
    try:
        c.alloc_window(-1)
        raise AssertionError("a negative size was accepted")
    except monel.InvalidArgumentError:
        pass
    # A late rank: the others sleep at the meeting (between processes, on the late rank's
    # futex word) and its arrival wakes them; a lost wake-up would hold them to the timeout.
    v[:] = r + 1
    t0 = time.monotonic()
    if r == 0:
        time.sleep(0.3)
    c.all_reduce(v)
    took = time.monotonic() - t0
    assert (v == tri).all() and took < 10, took
    # Ordinary buffers on the same communicator keep the ordinary path.
    o = np.full(5000, float(r), np.float32)
    c.all_reduce(o)
    assert (o == sum(range(n))).all()
    print(json.dumps({"rank": r, "ok": True}))


def torch_windows():
    import torch
    import torch.distributed as dist

    import monel.torch

    dist.init_process_group("monel")
    r, n = dist.get_rank(), dist.get_world_size()
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        t = monel.torch.empty((64, 100), dtype=dt)
        assert t.shape == (64, 100) and t.dtype == dt
        t.copy_((torch.arange(6400).reshape(64, 100) % 5 + r).to(dt))
        dist.all_reduce(t)
        want = (torch.arange(6400).reshape(64, 100) % 5 * n + sum(range(n))).to(dt)
        assert torch.equal(t, want), (dt, t)
    # async, as DDP issues them
    t = monel.torch.empty(10_000)
    t.fill_(float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True).wait()
    assert torch.allclose(t, torch.full((10_000,), (n + 1) / 2))
    try:
        monel.torch.empty(10, group=object())
        raise AssertionError("a foreign group was accepted")
    except monel.InvalidArgumentError as e:
        assert "Monel process group" in str(e), e
    print(json.dumps({"rank": r, "ok": True}))
    dist.destroy_process_group()


def torch_collectives():
    import torch
    import torch.distributed as dist

    import monel.torch  # noqa: F401

    dist.init_process_group("monel")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "monel"
    for dt in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int32,
        torch.int64,
    ):
        t = torch.arange(6, dtype=dt) + r
        dist.all_reduce(t)
        assert torch.equal(t, (torch.arange(6) * n + sum(range(n))).to(dt)), (dt, t)
    t = torch.full((3,), float(r))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert (t == n - 1).all()
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.allclose(t, torch.full((3,), (n + 1) / 2))
    b = torch.full((5,), float(r))
    dist.broadcast(b, src=1)
    assert (b == 1).all()
    red = torch.full((2, 2), float(r))
    dist.reduce(red, dst=0)
    if r == 0:
        assert (red == sum(range(n))).all()
    outs = [torch.zeros(2, 3) for _ in range(n)]
    dist.all_gather(outs, torch.full((2, 3), float(r)))
    assert all((o == q).all() for q, o in enumerate(outs))
    flat = torch.zeros(n * 4)
    dist.all_gather_into_tensor(flat, torch.full((4,), float(r)))
    assert torch.equal(flat, torch.arange(n).repeat_interleave(4).float())
    rs = torch.zeros(4)
    dist.reduce_scatter_tensor(rs, torch.arange(n * 4, dtype=torch.float32) + r)
    assert torch.equal(rs, (torch.arange(r * 4, r * 4 + 4) * n + sum(range(n))).float())
    rs2 = torch.zeros(3)
    dist.reduce_scatter(rs2, [torch.full((3,), float(q + r)) for q in range(n)])
    assert (rs2 == sum(r + q for q in range(n))).all()
    a2a = torch.zeros(n * 2)
    dist.all_to_all_single(a2a, torch.arange(n * 2, dtype=torch.float32) + 100 * r)
    want = torch.cat([torch.arange(r * 2, r * 2 + 2).float() + 100 * q for q in range(n)])
    assert torch.equal(a2a, want), (a2a, want)
    # Uneven splits: rank r sends q+1 elements to rank q.
    ins = torch.cat([torch.full((q + 1,), float(r)) for q in range(n)])
    out = torch.zeros(n * (r + 1))
    dist.all_to_all_single(
        out, ins, output_split_sizes=[r + 1] * n, input_split_sizes=[q + 1 for q in range(n)]
    )
    assert torch.equal(out, torch.arange(n).repeat_interleave(r + 1).float())
    outl = [torch.zeros(2) for _ in range(n)]
    dist.all_to_all(outl, [torch.full((2,), float(r * 10 + q)) for q in range(n)])
    assert all((o == q * 10 + r).all() for q, o in enumerate(outl))
    g = [torch.zeros(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), g, dst=0)
    if r == 0:
        assert all((x == q).all() for q, x in enumerate(g))
    s = torch.zeros(2)
    dist.scatter(s, [torch.full((2,), float(q)) for q in range(n)] if r == 0 else None, src=0)
    assert (s == r).all()
    if r == 0:
        dist.send(torch.arange(5.0), dst=n - 1)
    elif r == n - 1:
        x = torch.zeros(5)
        dist.recv(x, src=0)
        assert torch.equal(x, torch.arange(5.0))
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, torch.full((3,), float(r)), (r + 1) % n),
            dist.P2POp(dist.irecv, recv := torch.zeros(3), (r - 1) % n),
        ]
    )
    for q in reqs:
        q.wait()
    assert (recv == (r - 1) % n).all()
    w = dist.all_reduce(t2 := torch.ones(1000), async_op=True)
    fut = w.get_future()
    w.wait()
    assert fut.done() and (t2 == n).all()
    # NCCL's in-place forms, as FSDP uses them: the input is this rank's slot of the output.
    whole = torch.zeros(n * 3)
    whole[r * 3 : (r + 1) * 3] = float(r)
    dist.all_gather_into_tensor(whole, whole[r * 3 : (r + 1) * 3])
    assert torch.equal(whole, torch.arange(n).repeat_interleave(3).float())
    src = torch.arange(n * 2, dtype=torch.float32) + r
    dist.reduce_scatter_tensor(src[r * 2 : (r + 1) * 2], src)
    assert torch.equal(
        src[r * 2 : (r + 1) * 2], (torch.arange(r * 2, r * 2 + 2) * n + sum(range(n))).float()
    )
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r})
    assert [o["rank"] for o in objs] == list(range(n))
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": r, "ok": True}))


def fsdp_train():
    """FSDP2 (fully_shard) on Monel against the same model trained in one process on the
    whole batch: losses and final parameters agree to float rounding."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import monel.torch  # noqa: F401

    dist.init_process_group("monel")
    r, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    torch.manual_seed(0)

    def net():
        return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 10))

    model, ref = net(), net()
    ref.load_state_dict(model.state_dict())
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    worst_loss = 0.0
    for step in range(6):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8 * n, 64, generator=g), torch.randint(0, 10, (8 * n,), generator=g)
        loss = nn.functional.cross_entropy(model(x[r * 8 : (r + 1) * 8]), y[r * 8 : (r + 1) * 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = nn.functional.cross_entropy(ref(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        worst_loss = max(worst_loss, abs(mean.item() - ref_loss.item()))
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    worst_param = max((full[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    assert worst_loss < 1e-5 and worst_param < 1e-5, (worst_loss, worst_param)
    dist.destroy_process_group()
    print(json.dumps({"rank": r, "loss_err": worst_loss, "param_err": worst_param}))


def torch_tags():
    """torch's point-to-point semantics: tags match whatever the posting order, recv from
    any source names it, batch_isend_irecv carries tags."""
    import torch
    import torch.distributed as dist

    import monel.torch  # noqa: F401

    dist.init_process_group("monel")
    r, n = dist.get_rank(), dist.get_world_size()
    last = n - 1
    if r == 0:
        # Sent in tag order 1, 2, 3 (the middle one larger than a ring).
        for tag, size in ((1, 3), (2, 300_000), (3, 7)):
            dist.send(torch.full((size,), float(tag)), dst=last, tag=tag)
    elif r == last:
        # Posted 2, 3, 1: each receive gets its own tag's data.
        bufs = {tag: torch.zeros(size) for tag, size in ((2, 300_000), (3, 7), (1, 3))}
        works = [dist.irecv(bufs[tag], src=0, tag=tag) for tag in (2, 3, 1)]
        for w in works:
            w.wait()
        for tag, b in bufs.items():
            assert (b == tag).all(), (tag, b[:4])
    # From any source: every other rank sends its rank to rank 0 with tag 7.
    if r != 0:
        dist.send(torch.tensor([float(r)]), dst=0, tag=7)
    else:
        seen = set()
        for _ in range(n - 1):
            x = torch.zeros(1)
            src = dist.recv(x, tag=7)
            assert x.item() == src, (x, src)
            seen.add(src)
        assert seen == set(range(1, n)), seen
    # irecv before isend, each waited on afterwards, large enough to fill any ring: the
    # pattern of batch_isend_irecv where torch does not coalesce.
    big = torch.zeros(300_000)
    rq = dist.irecv(big, src=(r - 1) % n, tag=11)
    sq = dist.isend(torch.full((300_000,), float(r)), dst=(r + 1) % n, tag=11)
    rq.wait()
    sq.wait()
    assert (big == (r - 1) % n).all()
    # batch_isend_irecv with tags: a ring, the receive posted first.
    recv = torch.zeros(4)
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.irecv, recv, (r - 1) % n, tag=5),
            dist.P2POp(dist.isend, torch.full((4,), float(r)), (r + 1) % n, tag=5),
        ]
    )
    for q in reqs:
        q.wait()
    assert (recv == (r - 1) % n).all()
    dist.barrier()
    print(json.dumps({"rank": r, "ok": True}))
    dist.destroy_process_group()


def torch_semantics():
    """torch.distributed's own semantics beyond the collectives: all_gather_coalesced,
    sparse all_reduce, a per-call barrier timeout, monitored_barrier passing and naming a
    rank that stays away."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import monel.torch  # noqa: F401

    dist.init_process_group("monel", timeout=timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(r)), torch.arange(3.0) + r])
    for q in range(n):
        assert (outs[q][0] == q).all() and torch.equal(outs[q][1], torch.arange(3.0) + q), outs
    s = torch.sparse_coo_tensor([[r, n]], [1.0, 2.0], (n + 1,))
    dist.all_reduce(s)
    assert s.is_sparse and torch.equal(s.to_dense(), torch.tensor([1.0] * n + [2.0 * n])), s
    dist.monitored_barrier(timeout=timedelta(seconds=10))
    # A barrier with its own timeout, on a group whose default is long: only rank 0 calls.
    pg = dist.new_group(timeout=timedelta(seconds=300))
    if r == 0:
        t0 = time.monotonic()
        try:
            dist.barrier(group=pg, timeout=timedelta(seconds=1))
            raise AssertionError("the barrier did not time out")
        except RuntimeError as e:
            took = time.monotonic() - t0
            assert "Timed out" in str(e) and took < 10, (took, str(e))
    dist.barrier()
    # The last rank stays away from a monitored barrier: rank 0 names it; the others hear.
    err = None
    if r != n - 1:
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=1))
        except RuntimeError as e:
            err = str(e)
        assert err is not None, "the monitored barrier passed without the last rank"
        want = (
            f"Rank {n - 1} failed to pass monitoredBarrier"
            if r == 0
            else f"Rank {r} successfully reached monitoredBarrier"
        )
        assert want in err, err
    print(json.dumps({"rank": r, "ok": True, "error": err}))
    os._exit(0)  # the world's communicator failed on purpose: no orderly goodbye


def torch_errors():
    """Bad input through torch.distributed, blocking and async: a clear Monel exception on
    the rank that made the mistake, a mismatch on every rank, and a dead peer named."""
    import torch
    import torch.distributed as dist

    import monel.torch

    dist.init_process_group("monel")
    r, n = dist.get_rank(), dist.get_world_size()
    seen = []
    expect = expecter(seen)

    t = torch.ones(4, 4)
    expect(monel.InvalidArgumentError, lambda: dist.all_reduce(t.t()))
    expect(monel.InvalidArgumentError, lambda: dist.all_reduce(t.t(), async_op=True))
    expect(monel.InvalidArgumentError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)))
    expect(monel.InvalidArgumentError, lambda: dist.broadcast(torch.ones(2), src=n + 1))
    # Still usable after every local error.
    dist.all_reduce(t)
    assert (t == n).all()
    # Sizes that differ across ranks: an error on every rank, blocking and async.
    e = expect(monel.MonelError, lambda: dist.all_reduce(torch.ones(4 + r)))
    assert type(e).__name__ in ("MismatchError", "AbortedError"), e
    print(json.dumps({"rank": r, "errors": seen}), flush=True)
    os._exit(0)


def torch_dead_peer():
    """The last rank dies: rank 0's blocking all_reduce and the others' async wait() raise an
    error naming it, within MONEL_TIMEOUT."""
    import torch
    import torch.distributed as dist

    import monel.torch

    dist.init_process_group("monel")
    r, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if r == n - 1:
        os._exit(0)  # dies without a word
    t0 = time.monotonic()
    x = torch.ones(1 << 16)
    try:
        if r == 0:
            dist.all_reduce(x)
        else:
            dist.all_reduce(x, async_op=True).wait()
    except monel.MonelError as e:
        print(
            json.dumps(
                {
                    "rank": r,
                    "error": type(e).__name__,
                    "ranks": e.ranks,
                    "msg": str(e),
                    "seconds": time.monotonic() - t0,
                }
            ),
            flush=True,
        )
        os._exit(0)
    raise AssertionError("the dead peer went unnoticed")


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
