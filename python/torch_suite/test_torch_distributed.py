"""PyTorch's own distributed conformance suite (`DistributedTest._DistTestBase`, the tests
behind upstream's test/distributed/test_distributed_spawn.py), run with backend "monel"
the way upstream runs Gloo: one process per rank, spawned for each test.

    BACKEND=monel WORLD_SIZE=2 python -m pytest python/torch_suite -q
    (BACKEND=gloo runs the same tests on Gloo, for comparison)

Monel declares in the suite's capability lists what it implements (a plugin backend with
DDP and subgroups); the suite skips, by its own rules, what a backend does not declare.
Some tests the suite reserves for Gloo by name (monitored_barrier, timeouts, sparse
all_reduce, futures, coalesced all_reduce, batch_isend_irecv): `MONEL_SUITE_AS=gloo` runs the
suite as for Gloo (its selection, and its test bodies' Gloo branches) with every process
group that would be Gloo's made on Monel instead, so every test Gloo runs, Monel runs. `scripts/torch-suite.sh` runs it at 2 and 3 ranks.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("BACKEND", "monel")
os.environ.setdefault("WORLD_SIZE", "2")
# Select the tests as for this backend, run them on Monel (in the test process and in
# every rank it spawns, which import this module again).
AS = os.environ.get("MONEL_SUITE_AS")
if AS:
    os.environ["BACKEND"] = AS
if "TEMP_DIR" not in os.environ:  # the test process; the ranks it spawns inherit it
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="monel-suite-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

import monel.torch  # noqa: E402,F401  (registers the backend, in every spawned rank too)

for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add("monel")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if AS:
    import torch.distributed as dist

    def _on_monel(init):
        def init_process_group(*args, backend=None, **kwargs):
            on = "monel" if backend in (AS, None) else backend
            init(*args, backend=on, **kwargs)
            assert dist.get_backend() == on, dist.get_backend()

        return init_process_group

    dist.init_process_group = _on_monel(dist.init_process_group)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
