#!/bin/bash
# The transfer engine against Mooncake's on loopback, same run, per path: the soft RNIC (its
# raw WRITE bandwidth on one QP, `monel perf write-bw`, then `monel xfer-bench` over RDMA)
# and TCP (raw TCP on 2 streams, bench/race/tcp_raw.py, then `monel xfer-bench --transport
# tcp`), shared memory (raw memory copies by 2 threads, bench/race/memcpy_raw.py, then
# `monel xfer-bench --transport shm`), and Mooncake's TCP transport, its one path on one host
# (bench/race/mooncake_xfer.py); WRITE, batches of BATCH
# blocks (default 8), 2 threads, 3 s each, per block size, for ROUNDS rounds. MOONCAKE_PY: a
# python with mooncake-transfer-engine-non-cuda and numpy installed. BUF: bytes each side
# registers (default 64 MiB; at least 2 x BATCH x the largest block).
#   scripts/xfer-race.sh [ROUNDS] [BLOCK ...]       (default: 3 rounds; 65536 1048576 4194304)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
blocks=("$@")
((${#blocks[@]})) || blocks=(65536 1048576 4194304)
batch=${BATCH:-8}
# Bytes each side registers: at least 2 threads x BATCH blocks of the largest size.
buf=${BUF:-$((64 << 20))}
m=target/release/monel
py=${MOONCAKE_PY:-python3}
out=$(mktemp -d)
$m xfer-bench -d 127.0.6.1 -p 19800 --buffer-size $buf --serve 900 > "$out/xt" 2>&1 &
xt=$!
"$py" bench/race/mooncake_xfer.py target 127.0.6.3 17800 $buf 900 > "$out/mt" 2>&1 &
mt=$!
trap 'kill $xt $mt 2>/dev/null || true; rm -rf "$out"' EXIT
for _ in $(seq 50); do grep -q '^TARGET' "$out/mt" && break; sleep 0.2; done
read -r _ name addr < <(grep '^TARGET' "$out/mt")
for r in $(seq "$rounds"); do
  for bs in "${blocks[@]}"; do
    p=$((19900 + r * 10))
    $m perf write-bw -d 127.0.6.5 -p $p --udp-port $((p + 1)) -s "$bs" -D 3 > /dev/null 2>&1 &
    srv=$!
    sleep 0.3
    raw=$($m perf write-bw -d 127.0.6.6 -p $p --udp-port $((p + 1)) -s "$bs" -D 3 127.0.6.5 | tail -1 | awk '{printf "%.3f", $4 * 1048576 / 1e9}')
    wait $srv
    x=$($m xfer-bench 127.0.6.1:19800 -d 127.0.6.2 --transport rdma --operation write --block-size "$bs" --batch-size "$batch" \
      --threads 2 --duration 3 --buffer-size $buf | grep -o '[0-9.]* GB/s' | head -1)
    tcp=$(python3 bench/race/tcp_raw.py 127.0.6.7 127.0.6.8 "$bs" 2 3 | grep -o '[0-9.]* GB/s')
    xtcp=$($m xfer-bench 127.0.6.1:19800 -d 127.0.6.2 --transport tcp --operation write --block-size "$bs" \
      --batch-size "$batch" --threads 2 --duration 3 --buffer-size $buf | grep -o '[0-9.]* GB/s' | head -1)
    mem=$("$py" bench/race/memcpy_raw.py "$bs" 2 3 "$buf" | grep -o '[0-9.]* GB/s')
    xshm=$($m xfer-bench 127.0.6.1:19800 -d 127.0.6.2 --transport shm --operation write --block-size "$bs" \
      --batch-size "$batch" --threads 2 --duration 3 --buffer-size $buf | grep -o '[0-9.]* GB/s' | head -1)
    mc=$("$py" bench/race/mooncake_xfer.py init 127.0.6.4 "$name" "$addr" "$bs" "$batch" 2 3 2> /dev/null | grep -o '[0-9.]* GB/s')
    echo "round $r block $bs batch $batch: raw write-bw $raw GB/s; monel xfer rdma $x; raw tcp $tcp; monel xfer tcp $xtcp; raw memcpy $mem; monel xfer shm $xshm; mooncake tcp $mc"
  done
done
