#!/bin/bash
# The transfer-engine race over the whole grid: blocks of 4 KiB to 64 MiB in batches of 1,
# 8, 32 and 256 (each pair whose two threads' batches fit BUF, default 512 MiB), ROUNDS
# rounds each (scripts/xfer-race.sh), then the medians per block and batch
# (bench/race/summarize.py). The race's output goes to OUT (default: a temporary file).
#   MOONCAKE_PY=... scripts/xfer-grid.sh [ROUNDS]        (NETNS=1: between two namespaces)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
buf=${BUF:-$((512 << 20))}
out=${OUT:-$(mktemp)}
for batch in 1 8 32 256; do
  blocks=()
  for bs in 4096 65536 1048576 4194304 16777216 67108864; do
    if ((2 * batch * bs <= buf)); then blocks+=("$bs"); fi
  done
  BATCH=$batch BUF=$buf scripts/xfer-race.sh "$rounds" "${blocks[@]}" | tee -a "$out"
done
python3 bench/race/summarize.py "$out"
