#!/usr/bin/env bash
# The fabric planner's prediction against Monel's measured ring AllReduce across two network
# namespaces joined by a veth pair (Monel over its soft RNIC, RoCEv2 on UDP): measures 2 and
# 4 ranks (half in each namespace, MONEL_ALGO=ring so both sides run the same schedule),
# calibrates alpha and the path bandwidth from the 2-rank run's smallest and largest sizes,
# predicts every row with the planner's event engine, and prints the error.
#
# Usage: sudo scripts/fabric-vs-netns.sh [--rounds 3] [--np "2 4"]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 nps="2 4"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
cargo build --release -q -p monel-cli
cargo build --release -q -p monel-fabric --example netns_predict
M=$PWD/target/release/monel
NS_A=monel_fvn_a NS_B=monel_fvn_b IP_A=10.213.56.1 IP_B=10.213.56.2
work=$(mktemp -d /tmp/monel-fvn.XXXXXX)
. scripts/netns-pair.sh
cleanup() {
  netns_del $NS_A $NS_B
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work"
netns_pair $NS_A $NS_B mfvn_a mfvn_b $IP_A $IP_B

port=29700
for np in $nps; do
  for round in $(seq "$rounds"); do
    echo "# $np ranks, round $round/$rounds" >&2
    port=$((port + 1))
    pids=()
    for r in $(seq 0 $((np - 1))); do
      if [ $r -lt $((np / 2)) ]; then ns=$NS_A; else ns=$NS_B; fi
      ip netns exec $ns env MONEL_TRANSPORT=rdma MONEL_ALGO=ring MASTER_ADDR=$IP_A \
        MASTER_PORT=$port RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r \
        "$M" bench all_reduce -b 8 -e 16M -f 8 -T 100 -w 3 -c 1 --format csv \
        > "$work/out.$np.$round.$r" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    grep -E '^[0-9]' "$work/out.$np.$round.0" | awk -F, -v np="$np" '{print np, $1, $6}' >> "$work/all"
  done
done
# Median over the rounds, per rank count and size.
sort -k1,1n -k2,2n -k3,3g "$work/all" | awk '
  { key = $1 " " $2; v[key] = v[key] " " $3; n[key]++ }
  END { for (k in v) { split(v[k], a, " "); print k, a[int((n[k] + 1) / 2)] } }' |
  sort -k1,1n -k2,2n | ./target/release/examples/netns_predict --cores "$(nproc)"
