#!/bin/bash
# PyTorch's own distributed test suite (the tests behind upstream's
# test/distributed/test_distributed_spawn.py) on Monel, at 2 and 3 ranks, one process per
# rank per test, as upstream runs Gloo (about 15 minutes per world size on 2 cores; much of
# it spawns the processes of tests the suite then skips for want of GPUs). The tests are
# those the suite selects for Gloo (MONEL_SUITE_AS=gloo; set it empty for the suite's own
# selection for a plugin backend), so every test Gloo runs, Monel runs. Needs the venv
# scripts/test.sh builds.
#   scripts/torch-suite.sh [WORLD_SIZE ...]      (default: 2 3)
#   BACKEND=gloo scripts/torch-suite.sh 2        (the same tests on Gloo, for comparison)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MONEL_PY_VENV:-$PWD/target/py-venv}
"$venv/bin/python" -c "import expecttest, hypothesis" 2> /dev/null ||
  "$venv/bin/pip" install -q expecttest hypothesis
sizes=("$@")
((${#sizes[@]})) || sizes=(2 3)
backend=${BACKEND:-monel}
as=${MONEL_SUITE_AS-gloo}
[[ $backend == monel ]] || as=
for n in "${sizes[@]}"; do
  echo "== torch.distributed suite, backend $backend${as:+ (tests selected as for $as)}, $n ranks"
  start=$(date +%s)
  suite=python/torch_suite/test_torch_distributed.py
  # Run as for Gloo, test_get_backend asserts the backend is named "gloo": it runs in the
  # suite's own selection for Monel instead.
  name_check=(-k "not test_get_backend")
  [[ -n $as ]] || name_check=()
  MONEL_SUITE_AS=$as BACKEND=$backend WORLD_SIZE=$n "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    -rf "${name_check[@]}" "$suite"
  if [[ -n $as ]]; then
    MONEL_SUITE_AS= BACKEND=$backend WORLD_SIZE=$n "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      -rf "$suite" -k "test_get_backend"
  fi
  echo "== $n ranks: $(($(date +%s) - start)) s"
done
