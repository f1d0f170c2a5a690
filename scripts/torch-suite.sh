#!/bin/bash
# PyTorch's own distributed test suite (the tests behind upstream's
# test/distributed/test_distributed_spawn.py) with backend "monel", at 2 and 3 ranks, one
# process per rank per test, as upstream runs Gloo (about 15 minutes per world size on 2
# cores; most of it is spawning the processes of tests the suite then skips for want of
# GPUs). Needs the venv scripts/test.sh builds.
#   scripts/torch-suite.sh [WORLD_SIZE ...]      (default: 2 3)
#   BACKEND=gloo scripts/torch-suite.sh 2        (the same tests on Gloo, for comparison)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MONEL_PY_VENV:-$PWD/target/py-venv}
"$venv/bin/python" -c "import expecttest, hypothesis" 2> /dev/null ||
  "$venv/bin/pip" install -q expecttest hypothesis
sizes=("$@")
((${#sizes[@]})) || sizes=(2 3)
for n in "${sizes[@]}"; do
  echo "== torch.distributed suite, backend ${BACKEND:-monel}, $n ranks"
  start=$(date +%s)
  BACKEND=${BACKEND:-monel} WORLD_SIZE=$n "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    -rf python/torch_suite/test_torch_distributed.py
  echo "== $n ranks: $(($(date +%s) - start)) s"
done
