#!/bin/bash
# The test network: namespace rxenet with bridge rxebr0 (10.77.0.1/24) and tap devices for
# the VMs. Traffic to the VMs never leaves this namespace.
#   net.sh up [MTU]     create (idempotent)       net.sh tap NAME   add a tap to the bridge
#   net.sh exec CMD...  run CMD in the namespace  net.sh down       remove everything
set -euo pipefail
NS=${RXE_NETNS:-rxenet}
case ${1:-} in
  up)
    mtu=${2:-9000}
    ip netns list | grep -qw "$NS" || ip netns add "$NS"
    ip -n "$NS" link show rxebr0 >/dev/null 2>&1 || {
      ip -n "$NS" link add rxebr0 type bridge
      ip -n "$NS" addr add 10.77.0.1/24 dev rxebr0
    }
    ip -n "$NS" link set lo up
    ip -n "$NS" link set rxebr0 mtu "$mtu" up ;;
  tap)
    t=$2; mtu=${3:-9000}
    ip -n "$NS" link show "$t" >/dev/null 2>&1 || ip netns exec "$NS" ip tuntap add dev "$t" mode tap
    ip -n "$NS" link set "$t" mtu "$mtu" master rxebr0 up ;;
  exec) shift; exec ip netns exec "$NS" "$@" ;;
  down) ip netns del "$NS" 2>/dev/null || true ;;
  *) echo "usage: $0 up|tap NAME|exec CMD|down" >&2; exit 2 ;;
esac
