#!/usr/bin/env bash
# A soft RNIC opened before its link works: the server's interface has no carrier and its IPv6
# address is still tentative (duplicate address detection has not run), as when a job starts
# while the network comes up. The device must open at once and carry traffic once the
# address works. Run as root (it makes two network namespaces joined by a veth pair).
#   tentative.sh [MONEL_BINARY]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
monel=${1:-$here/../../target/release/monel}
A=mnl-tenta
B=mnl-tentb
out=$(mktemp -d)
gone() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap 'gone; rm -rf "$out"' EXIT
gone
fail() { echo "FAIL tentative: $*"; cat "$out"/* 2>/dev/null || true; exit 1; }
ip netns add $A
ip netns add $B
ip link add tnt0 netns $A type veth peer name tnt1 netns $B
ip -n $A link set lo up
ip -n $B link set lo up
ip -n $A addr add fd77::1/64 dev tnt0
ip -n $B addr add fd77::2/64 dev tnt1 nodad
ip -n $B link set tnt1 up
# (A here-string, not a pipe into grep -q: under pipefail that can fail when grep stops
# reading early.)
tentative() {
  local a
  a=$(ip -n $A -6 addr show dev tnt0)
  grep -qE "inet6 fd77::1/[0-9]+ .*tentative" <<<"$a"
}
tentative || fail "fd77::1 is not tentative"
# The server opens its device on the tentative address, on a link without carrier.
ip netns exec $A timeout 60 "$monel" pingpong -d fd77::1 -g 0 -n 200 -s 4096 -c --timeout 50 >"$out/server" 2>&1 &
srv=$!
sleep 1
kill -0 $srv 2>/dev/null || fail "the server did not open its device on a tentative address"
ip -n $A link set tnt0 up
# Duplicate address detection takes about a second once the link is up; a loaded machine
# may take longer.
for _ in $(seq 300); do
  tentative || break
  sleep 0.1
done
tentative && fail "duplicate address detection never finished: $(ip -n $A -6 addr show dev tnt0)"
ip netns exec $B timeout 60 "$monel" pingpong -d fd77::2 -g 0 -n 200 -s 4096 -c --timeout 50 fd77::1 >"$out/client" 2>&1 ||
  fail "client"
wait $srv || fail "server"
echo "PASS tentative: a device opened on a tentative IPv6 address without carrier; then $(grep usec/iter "$out/client")"
