"""The torch.distributed backend and DDP training on it."""

import json
import subprocess
import sys

import pytest
from conftest import EXAMPLES, assert_ok, free_port, results, run_ranks

torch = pytest.importorskip(
    "torch"
)  # the CI installs torch; without it this module is skipped loudly


@pytest.mark.parametrize("n", [2, 3])
def test_every_torch_collective(n):
    outs = run_ranks("torch_collectives", n, timeout=120)
    assert_ok(outs)
    assert all(r["ok"] for r in results(outs))


@pytest.mark.parametrize("n", [2, 3])
def test_tags_and_any_source_match_as_in_torch(n):
    outs = run_ranks("torch_tags", n, timeout=120)
    assert_ok(outs)
    assert all(r["ok"] for r in results(outs))


@pytest.mark.parametrize("n", [2, 3])
def test_torch_semantics_beyond_the_collectives(n):
    outs = run_ranks("torch_semantics", n, timeout=120)
    assert_ok(outs)
    assert all(r["ok"] for r in results(outs))


def test_tensors_in_windows_reduce_directly():
    outs = run_ranks("torch_windows", 2, timeout=120, env={"MONEL_DEBUG": "INFO"})
    assert_ok(outs)
    assert all(r["ok"] for r in results(outs))
    for _, _, err in outs:
        assert err.count("via window") >= 4, err


@pytest.mark.parametrize("n", [2, 3])
def test_fsdp_matches_single_process_training(n):
    outs = run_ranks("fsdp_train", n, timeout=180)
    assert_ok(outs)
    for r in results(outs):
        assert r["loss_err"] < 1e-5 and r["param_err"] < 1e-5, r


def test_bad_input_through_torch_is_a_monel_error():
    outs = run_ranks("torch_errors", 2, timeout=120, env={"MONEL_TIMEOUT": "10"})
    assert_ok(outs)
    for r in results(outs):
        assert len(r["errors"]) == 5, r
        assert "InvalidArgumentError" in r["errors"][0] and "contiguous" in r["errors"][0], r


def test_dead_peer_is_named_through_torch():
    outs = run_ranks("torch_dead_peer", 3, timeout=120, env={"MONEL_TIMEOUT": "10"})
    assert outs[2][0] == 0
    for r in results(outs[:2]):
        assert 2 in r["ranks"], r
        assert r["seconds"] < 15, r
        assert r["error"] in ("PeerLostError", "CommTimeoutError", "AbortedError"), r


def train(tmp_path, backend, n, extra=()):
    out = tmp_path / f"{backend}-{n}.json"
    if backend == "none":
        cmd = [sys.executable, str(EXAMPLES / "ddp_train.py")]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(n),
            "--master-port",
            str(free_port()),
            str(EXAMPLES / "ddp_train.py"),
            "--check-grads",
        ]
    cmd += ["--backend", backend, "--epochs", "2", "--json", str(out), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_single_process_training(tmp_path, n):
    ref = train(tmp_path, "none", 1)
    got = train(tmp_path, "monel", n)
    assert len(got["losses"]) == len(ref["losses"]) == 48
    # Same global batch and seed: the curves differ only by float summation order.
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    assert worst < 1e-4, worst
    # DDP's all-reduce leaves bitwise the same gradients on every rank, every step.
    assert got["grads_agree"] and all(got["grads_agree"])
    assert got["losses"][-1] < got["losses"][0] / 2


def test_ddp_with_fp16_compression_hook(tmp_path):
    ref = train(tmp_path, "none", 1)
    got = train(tmp_path, "monel", 2, ["--hook", "fp16"])
    assert all(got["grads_agree"])
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    assert worst < 5e-2, worst


def test_a_process_group_works_on_one_cuda_device():
    """NCCL's rule, as the CUDA path applies it: the first device a group's tensors were on
    is the group's; a tensor on another is refused in words (checked without a GPU: the rule
    reads devices, not memory)."""
    import torch

    import monel
    from monel._cuda import group_device

    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert group_device(None, d0, "allreduce") == d0
    assert group_device(d0, d0, "allreduce") == d0
    with pytest.raises(monel.InvalidArgumentError, match="cuda:1.*works on cuda:0"):
        group_device(d0, d1, "allreduce")


def test_cuda_ipc_reduces_in_rank_order_and_takes_what_it_can():
    """The GPU-side reduction of the CUDA IPC path (torch's kernels, here on CPU tensors):
    every reduction in rank order, AVG divided after the sum; which calls go that way
    (AVG of integers, bitwise reductions and other dtypes stage through host memory)."""
    import torch

    from monel import _cuda_ipc

    parts = [
        torch.tensor([1.5, -2.0, 8.0]),
        torch.tensor([0.25, 4.0, -1.0]),
        torch.tensor([3.0, 0.5, 2.0]),
    ]
    want = {
        "sum": parts[0] + parts[1] + parts[2],
        "prod": parts[0] * parts[1] * parts[2],
        "min": torch.minimum(torch.minimum(parts[0], parts[1]), parts[2]),
        "max": torch.maximum(torch.maximum(parts[0], parts[1]), parts[2]),
        "avg": (parts[0] + parts[1] + parts[2]) / 3,
    }
    for op, w in want.items():
        out = torch.empty(3)
        _cuda_ipc._reduce(op, parts, out)
        assert torch.equal(out, w), (op, out, w)
    f32, i64 = (torch.zeros(4),), (torch.zeros(4, dtype=torch.int64),)
    assert _cuda_ipc.eligible("allreduce", f32, "avg")
    assert not _cuda_ipc.eligible("allreduce", i64, "avg")
    assert _cuda_ipc.eligible("allreduce", i64, "sum")
    assert not _cuda_ipc.eligible("allreduce", (torch.zeros(4, dtype=torch.bool),), "sum")
    assert not _cuda_ipc.eligible("alltoall", f32, None)
    assert _cuda_ipc.eligible("_allgather_base", (torch.zeros(8), torch.zeros(4)), None)
