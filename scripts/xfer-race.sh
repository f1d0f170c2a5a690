#!/bin/bash
# The transfer engine against Mooncake's, same run, per path: the soft RNIC (its raw WRITE
# bandwidth on one QP, `monel perf write-bw`, then `monel xfer-bench --transport rdma`), TCP
# (raw TCP on 2 streams, bench/race/tcp_raw.py, then `monel xfer-bench --transport tcp`),
# shared memory on one host (raw memory copies by 2 threads, bench/race/memcpy_raw.py; raw
# cross-memory-attach copies into another process by 2 threads, bench/race/cma_raw.py; then
# `monel xfer-bench --transport shm`), and Mooncake's TCP transport (bench/race/mooncake_xfer.py);
# WRITE, batches of BATCH blocks (default 8), 2 threads, 3 s each, per block size, for ROUNDS
# rounds. On loopback by default; NETNS=1 puts the targets and the initiators in two network
# namespaces joined by a veth pair (root; no shared memory across them). MOONCAKE_PY: a
# python with mooncake-transfer-engine-non-cuda and numpy installed. BUF: bytes each side
# registers (default 64 MiB; at least 2 x BATCH x the largest block). The raw baselines walk
# through as much memory as the blocks of the run take.
#   scripts/xfer-race.sh [ROUNDS] [BLOCK ...]       (default: 3 rounds; 65536 1048576 4194304)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
blocks=("$@")
((${#blocks[@]})) || blocks=(65536 1048576 4194304)
batch=${BATCH:-8}
buf=${BUF:-$((64 << 20))}
m=$PWD/target/release/monel
py=${MOONCAKE_PY:-python3}
out=$(mktemp -d)
if [[ ${NETNS:-0} == 1 ]]; then
  . scripts/netns-pair.sh
  netns_pair xra xrb xra0 xrb0 10.79.0.1 10.79.0.2
  ina=(ip netns exec xra) inb=(ip netns exec xrb)
  # target, initiator, raw-perf server, raw-perf client, raw-TCP, Mooncake addresses
  tx=10.79.0.2 ix=10.79.0.1 ps=10.79.0.2 pc=10.79.0.1 ts=10.79.0.2 tc=10.79.0.1 mt=10.79.0.2 mi=10.79.0.1
  where="between two network namespaces (veth)"
else
  ina=() inb=()
  tx=127.0.6.1 ix=127.0.6.2 ps=127.0.6.5 pc=127.0.6.6 ts=127.0.6.7 tc=127.0.6.8 mt=127.0.6.3 mi=127.0.6.4
  where="on loopback"
fi
"${inb[@]}" $m xfer-bench -d $tx -p 19800 --buffer-size $buf --serve 900 > "$out/xt" 2>&1 &
xt=$!
"${inb[@]}" "$py" bench/race/mooncake_xfer.py target $mt 17800 $buf 900 > "$out/mt" 2>&1 &
mtp=$!
cleanup() {
  kill $xt $mtp 2>/dev/null || true
  # Gone before this returns: the next run binds the same addresses and ports.
  wait $xt $mtp 2>/dev/null || true
  rm -rf "$out"
  if [[ ${NETNS:-0} == 1 ]]; then netns_del xra xrb; fi
}
trap cleanup EXIT
for _ in $(seq 50); do grep -q '^TARGET' "$out/mt" && break; sleep 0.2; done
read -r _ name addr < <(grep '^TARGET' "$out/mt")
echo "# xfer race $where: WRITE, batches of $batch, 2 threads, 3 s each"
bench() {  # bench TRANSPORT BLOCK: Monel's GB/s over that link
  "${ina[@]}" $m xfer-bench $tx:19800 -d $ix --transport "$1" --operation write --block-size "$2" \
    --batch-size "$batch" --threads 2 --duration 3 --buffer-size $buf | grep -o '[0-9.]* GB/s' | head -1
}
for r in $(seq "$rounds"); do
  for bs in "${blocks[@]}"; do
    p=$((19900 + r * 10))
    # The raw baselines walk as much memory as the benchmark's blocks take (2 threads'
    # batches), so neither side gains from a hotter cache.
    foot=$((2 * batch * bs))
    ((foot <= buf)) || foot=$buf
    "${inb[@]}" $m perf write-bw -d $ps -p $p --udp-port $((p + 1)) -s "$bs" -D 3 > /dev/null 2>&1 &
    srv=$!
    sleep 0.3
    raw=$("${ina[@]}" $m perf write-bw -d $pc -p $p --udp-port $((p + 1)) -s "$bs" -D 3 $ps | tail -1 | awk '{printf "%.3f", $4 * 1048576 / 1e9}')
    wait $srv
    x=$(bench rdma "$bs")
    if [[ ${NETNS:-0} == 1 ]]; then
      "${inb[@]}" python3 bench/race/tcp_raw.py sink $ts 19850 2 "$bs" $foot > "$out/tcp" &
      sink=$!
      sleep 0.3
      "${ina[@]}" python3 bench/race/tcp_raw.py source $ts 19850 "$bs" 2 3 $foot
      wait $sink
      tcp=$(grep -o '[0-9.]* GB/s' "$out/tcp")
      mem=- cma=- xshm=-
    else
      tcp=$(python3 bench/race/tcp_raw.py $ts $tc "$bs" 2 3 $foot | grep -o '[0-9.]* GB/s')
      mem=$("$py" bench/race/memcpy_raw.py "$bs" 2 3 $foot | grep -o '[0-9.]* GB/s')
      cma=$("$py" bench/race/cma_raw.py "$bs" 2 3 $foot | grep -o '[0-9.]* GB/s')
      xshm=$(bench shm "$bs")
    fi
    xtcp=$(bench tcp "$bs")
    mc=$("${ina[@]}" "$py" bench/race/mooncake_xfer.py init $mi "$name" "$addr" "$bs" "$batch" 2 3 2> /dev/null | grep -o '[0-9.]* GB/s')
    echo "round $r block $bs batch $batch: raw write-bw $raw GB/s; monel xfer rdma $x; raw tcp $tcp; monel xfer tcp $xtcp; raw memcpy $mem; raw cma $cma; monel xfer shm $xshm; mooncake tcp $mc"
  done
done
