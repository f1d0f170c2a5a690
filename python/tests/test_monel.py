"""The monel package across real processes: every collective and type against a reference,
point to point, async handles, split, bad input, a mismatch and a dead peer."""

import numpy as np
import pytest
from conftest import assert_ok, results, run_ranks

import monel


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_type(n):
    outs = run_ranks("collectives", n, timeout=120)
    assert_ok(outs)
    res = results(outs)
    assert all(r["checks"] > 300 for r in res)
    assert any("via SHM" in p for p in res[0]["paths"])


def test_transports_soft_rnic_and_tcp():
    for t, word in (("rdma", "RoCE"), ("tcp", "TCP")):
        outs = run_ranks("collectives", 2, timeout=120, env={"MONEL_TRANSPORT": t})
        assert_ok(outs)
        assert word in results(outs)[0]["paths"][0]


def test_blocking_async_and_deferred_operations_keep_issue_order():
    outs = run_ranks("job_order", 3)
    assert_ok(outs)
    assert all(r["ok"] for r in results(outs))


def test_bad_input_raises_and_leaves_the_communicator_usable():
    outs = run_ranks("bad_input", 2)
    assert_ok(outs)
    errs = results(outs)[0]["errors"]
    assert len(errs) >= 11
    assert any("not contiguous" in e for e in errs)
    assert any("read-only" in e for e in errs)
    assert any("complex64" in e for e in errs)


def test_jax_arrays_are_taken_through_dlpack():
    pytest.importorskip("jax", reason="scripts/test.sh installs jax[cpu]")
    outs = run_ranks("jax_arrays", 2)
    assert_ok(outs)
    for r in results(outs):
        assert len(r["errors"]) == 2, r
        assert all("read-only" in e for e in r["errors"]), r


def test_count_mismatch_is_an_error_on_every_rank():
    outs = run_ranks("mismatch", 3, env={"MONEL_TIMEOUT": "10"})
    assert_ok(outs)
    for r in results(outs):
        assert r["error"] in ("MismatchError", "AbortedError"), r


def test_dead_peer_is_named_within_the_timeout():
    outs = run_ranks("dead_peer", 3, env={"MONEL_TIMEOUT": "10"})
    assert outs[2][0] == 0
    res = results(outs[:2])
    for r in res:
        assert 2 in r["ranks"], r
        assert r["seconds"] < 15, r
        assert r["error"] in ("PeerLostError", "CommTimeoutError", "AbortedError"), r


def test_unique_id_errors_are_bootstrap_errors():
    with pytest.raises(monel.BootstrapError):
        monel.Communicator(2, 0, "not-an-id")
    with pytest.raises(monel.InvalidArgumentError):
        monel.create_unique_id("nowhere")
    # A single-rank communicator needs no peers.
    c = monel.Communicator(1, 0, monel.create_unique_id())
    x = np.arange(4, dtype=np.float32)
    c.all_reduce(x)
    assert np.array_equal(x, np.arange(4, dtype=np.float32))
    assert issubclass(monel.CommTimeoutError, monel.MonelError)
    c.destroy()


@pytest.mark.parametrize("n", [2, 3])
def test_arrays_in_windows_reduce_directly(n):
    outs = run_ranks("windows", n, timeout=120, env={"MONEL_DEBUG": "INFO"})
    assert_ok(outs)
    assert all(r["ok"] for r in results(outs))
    for _, _, err in outs:
        # The window calls went direct; the ordinary one took an algorithm.
        assert err.count("via window") >= 4, err
        assert (
            "count 5000 float op sum via" in err
            and "via window" not in [line for line in err.splitlines() if "count 5000 " in line][0]
        ), err


class _FakeCudaArray:
    """An object that claims CUDA memory (as CuPy's arrays do) at an address no GPU has."""

    __cuda_array_interface__ = {
        "shape": (4,),
        "typestr": "<f4",
        "data": (0x1000, False),
        "version": 2,
    }


class _FakeDlpackCuda:
    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise BufferError("no GPU here")


def test_cuda_arrays_are_recognised_and_refused_in_words_without_a_gpu():
    """CUDA arrays (the CUDA array interface, CUDA DLPack) go to the staging path; where
    torch cannot view them (no GPU here) the call raises InvalidArgumentError naming the
    argument, and the communicator stays usable."""
    pytest.importorskip("torch", reason="scripts/test.sh installs torch")
    from monel._cuda_arrays import on_cuda

    assert on_cuda(_FakeCudaArray()) and on_cuda(_FakeDlpackCuda())
    assert not on_cuda(np.zeros(3)) and not on_cuda([1, 2])
    c = monel.Communicator(1, 0, monel.create_unique_id("127.0.0.1:0"))
    try:
        for bad in (_FakeCudaArray(), _FakeDlpackCuda()):
            with pytest.raises(monel.InvalidArgumentError, match="x: torch cannot view"):
                c.all_reduce(bad)
        with pytest.raises(monel.InvalidArgumentError, match="out: torch cannot view"):
            c.all_reduce(np.ones(4, np.float32), out=_FakeCudaArray())
        x = np.ones(4, np.float32)
        c.all_reduce(x)
        assert (x == 1).all()
    finally:
        c.destroy()
