"""What the framework tests share: run a training example as 1, 2 or 4 ranks and compare."""

import json
from pathlib import Path

from conftest import EXAMPLES, assert_ok, launch

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
