#!/bin/bash
# The framework tier: monel.jax, monel.tensorflow and monel.keras (tensorflow-cpu, jax[cpu]
# and Keras 3 in one venv, $MONEL_FW_VENV, default target/fw-venv), then monel.mxnet (MXNet
# 1.9.1, the last release, with numpy < 1.24 in a venv of its own, $MONEL_MX_VENV, default
# target/mx-venv). Real processes: every collective against numpy, typed errors, and each
# framework's digits example trained on 2 and 4 ranks against one process. About 3 minutes
# of tests, plus about 1.5 GB of downloads the first time (2-4 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

venv() {
  [ -x "$1/bin/python" ] || python3 -m venv "$1" 2> /dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv > /dev/null
    python3 -m venv "$1"
  }
}

fw=${MONEL_FW_VENV:-$PWD/target/fw-venv}
mx=${MONEL_MX_VENV:-$PWD/target/mx-venv}
venv "$fw"
venv "$mx"
# The versions these modules were tested with (a major release may change the APIs used).
"$fw/bin/python" -c "import tensorflow, jax, keras, sklearn, pytest, maturin" 2> /dev/null ||
  "$fw/bin/pip" install -q "tensorflow-cpu==2.21.*" "jax[cpu]==0.10.*" "keras==3.15.*" \
    numpy scikit-learn pytest maturin
"$mx/bin/python" -c "import mxnet, sklearn, pytest" 2> /dev/null ||
  "$mx/bin/pip" install -q "mxnet==1.9.1" "numpy<1.24" "scikit-learn<1.4" pytest

# One wheel (abi3) for both; --no-deps keeps each venv's numpy.
rm -rf target/fw-wheel
"$fw/bin/maturin" build -q --release -m python/Cargo.toml -o target/fw-wheel
for v in "$fw" "$mx"; do
  "$v/bin/pip" install -q --no-deps --force-reinstall target/fw-wheel/monel-*.whl
done

t=python/tests/frameworks
"$fw/bin/python" -m pytest -q "$t/test_jax.py" "$t/test_tensorflow.py" "$t/test_keras.py"
"$mx/bin/python" -m pytest -q "$t/test_mxnet.py"
