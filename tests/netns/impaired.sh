#!/usr/bin/env bash
# Monel across an impaired path between network namespaces, through the project's software
# switch (`monel switch`): the perf tools, a 1 GiB RDMA WRITE verified by CRC-32, DCQCN
# reacting to real ECN marks, a blocked RDMA path named within the liveness bound, and
# disaggregated serving (a KV cache moved by the transfer engine) over a clean and an
# impaired path.
# Needs root. Usage: tests/netns/impaired.sh [path/to/monel]
# Environment: SIZE (default 1G) for the big transfer; MONEL_PY, a Python with the monel
# package and torch (default: scripts/test.sh's virtual environment).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
monel=$(realpath "${1:-$here/../../target/release/monel}")
size=${SIZE:-1G}
out=$(mktemp -d)
export RUST_BACKTRACE=0
A=10.78.0.1
B=10.78.0.2

cleanup() {
  pkill -INT -f "$monel switch" 2>/dev/null || true
  sleep 0.2
  "$here/net.sh" down
}
trap cleanup EXIT
"$here/net.sh" up

switch_start() {
  echo "--- switch: $*"
  ip netns exec mnl-sw "$monel" switch swa swb "$@" >"$out/switch.out" 2>"$out/switch.err" &
  switch_pid=$!
  sleep 0.3
}
switch_stop() {
  kill -INT "$switch_pid"
  wait "$switch_pid"
  cat "$out/switch.out"
}
fail() {
  echo "FAIL: $*" >&2
  for f in "$out"/*.out "$out"/*.err; do echo "== $f"; cat "$f"; done >&2
  exit 1
}

# Runs a server in mnl-b and a client in mnl-a; both must succeed.
pair() {
  local name=$1
  shift
  local srv=() cli=()
  while [[ $1 != -- ]]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  ip netns exec mnl-b timeout 120 "$monel" "${srv[@]}" >"$out/$name.srv.out" 2>&1 &
  local spid=$!
  sleep 0.3
  if ! ip netns exec mnl-a timeout 120 "$monel" "${cli[@]}" >"$out/$name.cli.out" 2>&1; then
    fail "$name client"
  fi
  wait "$spid" || fail "$name server"
}

start=$SECONDS

# 1. The perf tools across loss, reordering, duplication and delay.
switch_start --loss 0.02 --reorder 0.01 --reorder-us 100 --duplicate 0.005 --delay-us 50 --seed 11
for t in write-bw send-bw read-bw; do
  pair "$t" perf "$t" -d $B -n 500 -- perf "$t" $B -d $A -n 500
  grep -A1 '#bytes' "$out/$t.cli.out" | tail -1 | sed "s/^/$t: /"
done
for t in write-lat send-lat read-lat atomic-lat; do
  pair "$t" perf "$t" -d $B -n 300 -- perf "$t" $B -d $A -n 300
  grep -A1 '#bytes' "$out/$t.cli.out" | tail -1 | sed "s/^/$t: /"
done
switch_stop

# 2. A 1 GiB WRITE, verified, across loss, reordering, duplication, delay and ECN marking at
#    a 4 Gb/s bottleneck, with DCQCN on.
switch_start --rate-gbps 4 --queue-kib 1024 --ecn-kmin-kib 64 --ecn-kmax-kib 256 \
  --loss 0.01 --reorder 0.005 --duplicate 0.002 --delay-us 50 --seed 12
pair bulk transfer -d $B -s "$size" --dcqcn 10 -- transfer $B -d $A -s "$size" --dcqcn 10
cat "$out/bulk.cli.out" "$out/bulk.srv.out"
grep -q "verified by the server" "$out/bulk.cli.out" || fail "bulk transfer not verified"
grep -q "matches the client's" "$out/bulk.srv.out" || fail "bulk transfer: server did not match"
switch_stop

# 3. DCQCN against real ECN marks: a 2 Gb/s bottleneck with a queue shallower than the
#    sender's window. Without DCQCN the queue overflows; with it the sender slows down.
declare -A drops
for cc in off on; do
  flags=()
  [[ $cc == on ]] && flags=(--dcqcn 10)
  switch_start --rate-gbps 2 --queue-kib 256 --ecn-kmin-kib 32 --ecn-kmax-kib 128 --delay-us 20 --seed 13
  pair "cc-$cc" transfer -d $B -s 256M "${flags[@]}" -- transfer $B -d $A -s 256M "${flags[@]}"
  switch_stop >"$out/cc-$cc.switch"
  cat "$out/cc-$cc.switch"
  drops[$cc]=$(awk '$1 == "swb" { print $7 }' "$out/cc-$cc.switch")
  echo "dcqcn $cc: $(grep -h goodput "$out/cc-$cc.cli.out" | sed 's/.*goodput/goodput/')"
  grep -h '^dcqcn' "$out/cc-$cc.cli.out"
done
line=$(grep '^dcqcn:' "$out/cc-on.cli.out")
cnps=$(sed -E 's/dcqcn: ([0-9]+) CNPs.*/\1/' <<<"$line")
minrate=$(sed -E 's/.*rate fell to ([0-9.]+) Gb.*/\1/' <<<"$line")
ce=$(sed -E 's/.*device ecn_ce ([0-9]+).*/\1/' "$out/cc-on.srv.out" | tail -1)
[[ $cnps -gt 0 ]] || fail "DCQCN received no CNPs"
[[ $ce -gt 0 ]] || fail "the responder saw no ECN-CE marks"
awk -v r="$minrate" 'BEGIN { exit !(r < 10) }' || fail "DCQCN never cut its rate (min $minrate Gb/s)"
echo "DCQCN reacted: $cnps CNPs from $ce CE-marked packets; rate fell to $minrate Gb/s;" \
  "tail drops at the switch: ${drops[off]} without DCQCN, ${drops[on]} with"
# 4. A blocked RDMA path while TCP still works: the switch drops every UDP frame, so the two
#    ranks' soft RNICs never hear from each other while their TCP connections and status
#    endpoints answer. Each must name the other within the liveness bound (3 s here), long
#    before the 60 s timeout.
switch_start --loss 1 --seed 14
t0=$SECONDS
for r in 0 1; do
  ip=$A; ns=mnl-a
  [[ $r == 1 ]] && ip=$B && ns=mnl-b
  ip netns exec $ns env RANK=$r WORLD_SIZE=2 MASTER_ADDR=$A MASTER_PORT=29611 \
    MONEL_TRANSPORT=rdma MONEL_RDMA_DEV=$ip MONEL_LIVENESS=3 MONEL_TIMEOUT=60 \
    timeout 90 "$monel" bench all_reduce -b 1M -e 1M -n 2 >"$out/blocked$r.out" 2>&1 &
  pids[$r]=$!
done
for r in 0 1; do
  if wait "${pids[$r]}"; then fail "rank $r ran a collective over a blocked path"; fi
  # Each rank names the path itself, or learns that its peer gave up on the call (the
  # peer's word cannot cross the blocked path; its status endpoint over TCP says so).
  grep -qE "RDMA path is blocked|gave up on this call.*path between the two blocked" "$out/blocked$r.out" ||
    fail "rank $r did not name the blocked path"
done
took=$((SECONDS - t0))
[[ $took -lt 20 ]] || fail "the blocked path took $took s to be named"
echo "blocked RDMA path named by both ranks in $took s:"
grep -h 'blocked' "$out/blocked0.out" "$out/blocked1.out"
switch_stop

# 5. Disaggregated serving (examples/kv_disagg.py): prefill in mnl-a WRITEs each request's
#    KV blocks into decode's cache in mnl-b through the transfer engine, over RDMA (the soft
#    RNIC) and over TCP on a clean path, with the automatic choice (shared memory cannot
#    cross namespaces: it must fall back to RDMA), then over RDMA across loss and reordering
#    (the switch impairs UDP only); the tokens must equal single-process generation.
py=${MONEL_PY:-$here/../../target/py-venv/bin/python}
"$py" -c "import monel.xfer, torch" || fail "$py has no monel package with torch (run scripts/test.sh first, or set MONEL_PY)"
example=$here/../../examples/kv_disagg.py
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
for run in clean:rdma clean:tcp clean:auto impaired:rdma; do
  path=${run%:*} link=${run#*:}
  if [[ $path == clean ]]; then switch_start; else
    switch_start --loss 0.01 --reorder 0.01 --reorder-us 100 --duplicate 0.005 --delay-us 50 --seed 15
  fi
  ip netns exec mnl-b env MONEL_SECRET="$secret" timeout 300 "$py" "$example" --role decode --ip $B \
    --transport "$link" >"$out/kv-$path-$link.srv.out" 2>&1 &
  dpid=$!
  ip netns exec mnl-a env MONEL_SECRET="$secret" timeout 300 "$py" "$example" --role prefill --ip $A \
    --peer $B --transport "$link" >"$out/kv-$path-$link.cli.out" 2>&1 || fail "kv_disagg prefill ($path path, $link)"
  wait $dpid || fail "kv_disagg decode ($path path, $link)"
  switch_stop >/dev/null
  grep -q "8/8 requests generated exactly the single-process tokens" "$out/kv-$path-$link.srv.out" ||
    fail "kv_disagg ($path path, $link): tokens differ"
  want=${link/auto/rdma}
  grep -q "over $want" "$out/kv-$path-$link.srv.out" || fail "kv_disagg ($path path, $link): not over $want"
  echo "kv_disagg, $path path, $link: $(tail -1 "$out/kv-$path-$link.srv.out")"
done

echo "impaired-path tests passed in $((SECONDS - start)) s"
rm -rf "$out"
