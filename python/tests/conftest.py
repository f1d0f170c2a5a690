"""Helpers: run a worker function as N real processes joined by one Monel unique id."""

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent.parent / "examples"


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a port the kernel hands out (bind to
    0) can be taken as the source port of a connection made before the test binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between 10000 and {low}")


def run_ranks(
    name: str,
    n: int,
    timeout: float = 60,
    env: dict | None = None,
    args=(),
    script: Path = HERE / "workers.py",
):
    """Runs `NAME(...)` of the worker `script` (`workers.py` here) in n processes; returns
    [(returncode, stdout, stderr)] per rank."""
    return launch([str(script), name, *map(str, args)], n, timeout, env)


def launch(argv, n: int, timeout: float = 60, env: dict | None = None):
    """Runs `python ARGV...` as n ranks that find each other through torchrun-style
    variables; returns [(returncode, stdout, stderr)] per rank."""
    port = free_port()
    procs = []
    for r in range(n):
        e = dict(os.environ)
        e.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": str(n),
                "MONEL_TIMEOUT": e.get("MONEL_TIMEOUT", "30"),
            }
        )
        e.update(env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, *map(str, argv)],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    for p in procs:
        try:
            o, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{argv[0]} {argv[1:2]}: ranks hung past {timeout} s")
        out.append((p.returncode, o, err))
    return out


def results(outs):
    """The JSON each rank printed last."""
    return [json.loads(o.strip().splitlines()[-1]) for _, o, _ in outs]


def assert_ok(outs):
    """Every rank exited 0 (else its output is shown); returns `outs`."""
    for r, (code, o, err) in enumerate(outs):
        assert code == 0, f"rank {r} exited {code}\n--- stdout\n{o}\n--- stderr\n{err}"
    return outs
