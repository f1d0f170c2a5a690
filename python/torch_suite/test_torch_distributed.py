"""PyTorch's own distributed conformance suite (`DistributedTest._DistTestBase`, the tests
behind upstream's test/distributed/test_distributed_spawn.py), run with backend "monel"
the way upstream runs Gloo: one process per rank, spawned for each test.

    BACKEND=monel WORLD_SIZE=2 python -m pytest python/torch_suite -q
    (BACKEND=gloo runs the same tests on Gloo, for comparison)

Monel declares in the suite's capability lists what it implements (a plugin backend with
DDP and subgroups, CPU only); the suite skips, by its own rules, what a backend does not
declare. `scripts/torch-suite.sh` runs it at 2 and 3 ranks.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("BACKEND", "monel")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # the test process; the ranks it spawns inherit it
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="monel-suite-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)

import monel.torch  # noqa: E402,F401  (registers the backend, in every spawned rank too)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

BACKEND = os.environ["BACKEND"]
if BACKEND == "monel":
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("monel")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
