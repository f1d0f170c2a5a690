# Sourced by the benchmark scripts: two network namespaces joined by a veth pair, MTU 9000.
#   netns_pair NS_A NS_B IF_A IF_B IP_A IP_B   # (re)creates them
#   netns_del NS_A NS_B                        # removes them (and the veth with them)
netns_del() {
  ip netns del "$1" 2> /dev/null || true
  ip netns del "$2" 2> /dev/null || true
}
netns_pair() {
  local ns_a=$1 ns_b=$2 if_a=$3 if_b=$4 ip_a=$5 ip_b=$6
  netns_del "$ns_a" "$ns_b"
  ip netns add "$ns_a"
  ip netns add "$ns_b"
  ip link add "$if_a" type veth peer name "$if_b"
  ip link set "$if_a" netns "$ns_a"
  ip link set "$if_b" netns "$ns_b"
  ip -n "$ns_a" addr add "$ip_a/24" dev "$if_a"
  ip -n "$ns_b" addr add "$ip_b/24" dev "$if_b"
  ip -n "$ns_a" link set lo up
  ip -n "$ns_b" link set lo up
  ip -n "$ns_a" link set "$if_a" mtu 9000 up
  ip -n "$ns_b" link set "$if_b" mtu 9000 up
}
