#!/bin/bash
# Runs every cargo-fuzz target for SECONDS each (default 60), on its corpus in fuzz/corpus/
# (kept between runs), and fails on any finding. Installs cargo-fuzz if it is missing.
# RUSTC_BOOTSTRAP=1 lets the stable toolchain build with the sanitizer flags cargo-fuzz uses.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
command -v cargo-fuzz > /dev/null || cargo install cargo-fuzz --locked -q
export RUSTC_BOOTSTRAP=1
cargo fuzz build
for t in $(cargo fuzz list); do
  mkdir -p "corpus/$t"
  out=$(cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1) || {
    echo "$out" | tail -40
    echo "fuzz: $t found a crash (see fuzz/artifacts/$t)" >&2
    exit 1
  }
  echo "fuzz: $t $(echo "$out" | grep -o 'Done [0-9]* runs in [0-9]* second(s)' | tail -1), clean"
done
