#!/bin/bash
# The whole test suite: the Rust workspace, then the Python package and the PyTorch backend
# (pytest, real processes, DDP training). The Python part builds the package into a venv
# ($MONEL_PY_VENV, default target/py-venv) with torch from PyPI (the default wheel pulls
# about 5 GB of CUDA libraries even for CPU use; about a minute on a fresh machine).
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests need from Debian: a real etcd server for the transfer engine's registry
# tests, and rdma-core's C header, which one test compiles Monel's hand-written libibverbs ABI
# against (Monel itself loads libibverbs at run time and builds without it).
need=()
command -v etcd > /dev/null || need+=(etcd-server)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if ((${#need[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "test.sh: needs ${need[*]} (Debian packages): run as root, or install them first" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" > /dev/null
fi
cargo test --workspace --release
# The README's Rust examples run, and check their own results.
for ex in monel-ccl:all_reduce monel-verbs:rdma_write monel-fabric:plan; do
  cargo run --release -q -p "${ex%%:*}" --example "${ex#*:}" > /dev/null
done

venv=${MONEL_PY_VENV:-$PWD/target/py-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2> /dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv > /dev/null
    python3 -m venv "$venv"
  }
fi
"$venv/bin/python" -c "import torch, sklearn, pytest, maturin, jax" 2> /dev/null ||
  "$venv/bin/pip" install -q torch numpy scikit-learn pytest maturin "jax[cpu]"
"$venv/bin/pip" install -q ./python
# Run from the repository root, so `import monel` finds the installed package (the framework
# modules have their own tier, scripts/test-frameworks.sh).
"$venv/bin/python" -m pytest -q python/tests --ignore=python/tests/frameworks
