"""What the framework tests share: run a worker program of `workers.py` on several ranks
and read what each rank found; run a training example as 1, 2 or 4 ranks and compare."""

import json
from pathlib import Path

from conftest import EXAMPLES, assert_ok, launch, results, run_ranks

WORKERS = Path(__file__).resolve().parent / "workers.py"
STEPS = 120  # 5 epochs of 24 global batches


def train(tmp_path: Path, script: str, n: int, args=(), timeout: float = 240) -> dict:
    """Runs examples/SCRIPT on n ranks (n == 1: one process without Monel, the reference)
    and returns what rank 0 wrote."""
    out = tmp_path / f"{script}-{n}-{'-'.join(args)}.json"
    argv = [EXAMPLES / script, "--json", out, *args]
    if n == 1:
        argv += ["--backend", "none"]
    assert_ok(launch(argv, n, timeout))
    return json.loads(out.read_text())


def assert_same_training(ref: dict, got: dict, n: int) -> None:
    """Same global batch and seed: every step's loss within 1e-4 of one process's, and the
    ranks' parameters bitwise equal after every step; the model learned."""
    assert got["world"] == n and ref["world"] == 1
    assert len(got["losses"]) == len(ref["losses"]) == STEPS
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    assert worst < 1e-4, worst
    assert len(got["same_params"]) == STEPS and all(got["same_params"])
    assert got["losses"][-1] < got["losses"][0] / 4
    assert abs(got["accuracy"] - ref["accuracy"]) < 0.01 and got["accuracy"] > 0.9


def collectives(worker: str, n: int, at_least: int) -> None:
    """Every rank ran `worker`'s collective checks (each rank asserts its own results) and
    made at least `at_least` of them."""
    res = results(assert_ok(run_ranks(worker, n, 120, script=WORKERS)))
    assert all(r["checks"] >= at_least for r in res), res


def errors(worker: str, count: int) -> None:
    """Each of `count` bad inputs raised its typed error on both ranks, and the job went on."""
    res = results(assert_ok(run_ranks(worker, 2, 120, script=WORKERS)))
    assert all(len(r["errors"]) == count for r in res), res


def dead_peer(worker: str) -> None:
    """The last of 3 ranks dies; the others name it within the timeout, in Monel's terms."""
    outs = run_ranks(worker, 3, 120, env={"MONEL_TIMEOUT": "10"}, script=WORKERS)
    assert outs[2][0] == 0
    for r in results(assert_ok(outs[:2])):
        assert r["monel"] and 2 in r["ranks"] and r["seconds"] < 15, r
