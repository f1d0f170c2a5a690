#!/usr/bin/env bash
# Builds (up) or removes (down) the test network: namespaces mnl-a (10.78.0.1) and mnl-b
# (10.78.0.2), each with one veth whose other end sits in namespace mnl-sw, where the
# project's software switch (`monel switch swa swb`) forwards between them. Nothing else
# joins these namespaces, so no traffic can leave them. Needs root.
#   net.sh up [MTU]   (default MTU 9000)
#   net.sh down
set -euo pipefail
mtu=${2:-9000}
case ${1:-} in
up)
  "$0" down 2>/dev/null || true
  for ns in mnl-sw mnl-a mnl-b; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  # The switch namespace has no addresses at all; only the switch's sockets see its frames.
  ip netns exec mnl-sw sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  ip netns exec mnl-sw sysctl -qw net.ipv6.conf.default.disable_ipv6=1
  for side in a b; do
    # gso_max_segs 1: the hosts' veths segment in software, as a NIC without UDP
    # segmentation offload does, so the switch's packet sockets see wire-size datagrams
    # (a veth otherwise hands a whole GSO message over as one frame).
    ip link add "${side}0" netns "mnl-$side" mtu "$mtu" gso_max_segs 1 type veth peer name "sw$side" netns mnl-sw mtu "$mtu"
    ip -n "mnl-$side" link set "${side}0" up
    ip -n mnl-sw link set "sw$side" up
  done
  ip -n mnl-a addr add 10.78.0.1/24 dev a0
  ip -n mnl-b addr add 10.78.0.2/24 dev b0
  ;;
down)
  for ns in mnl-sw mnl-a mnl-b; do ip netns del "$ns" 2>/dev/null || true; done
  ;;
*)
  echo "usage: $0 up [MTU] | down" >&2
  exit 2
  ;;
esac
