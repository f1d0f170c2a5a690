#!/usr/bin/env bash
# Instructions per packet through requester + responder (4 KiB MTU RDMA WRITE, no payload
# copy), counted by valgrind's callgrind: the difference between runs of N1 and N2 packets,
# divided by N2 - N1, so start-up and set-up cancel out. Counts are repeatable on a noisy host.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)"; exit 1; }
cargo build --release -q -p monel-rc --example engine_loop
bin=target/release/examples/engine_loop
n1=${N1:-20000}
n2=${N2:-120000}
count() {
  local out; out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$1" >/dev/null 2>&1
  local ir; ir=$(grep -E '^(summary|totals):' "$out" | head -1 | awk '{print $2}')
  rm -f "$out"
  echo "$ir"
}
i1=$(count "$n1")
i2=$(count "$n2")
echo "callgrind: $n1 packets -> $i1 instructions; $n2 packets -> $i2 instructions"
echo "instructions per packet (requester + responder + ACK share): $(( (i2 - i1) / (n2 - n1) ))"
