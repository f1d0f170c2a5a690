#!/bin/bash
# The race: Monel against Open MPI (MPI_Allreduce) and Gloo (torch.distributed, CPU) on the
# same float32 AllReduce sizes and rank counts, in the same run, in interleaved rounds
# (Monel, MPI, Gloo, Monel, ...), so the machine's drift hits all three alike. Each round
# times every size for about TARGET_MS (slowest rank's mean per call); the table gives the
# median over rounds and Monel's bus-bandwidth ratio to each. Monel out of place is compared
# with MPI (separate buffers), Monel in place with Gloo (in place). After the table, each
# round's own ratios show the spread, and a cross-core probe before and after each round
# (bench/race/xcore_probe.c) shows what state the machine was in.
#
#   scripts/race.sh [--np "2 4"] [--rounds 5] [--min 8] [--max 32M] [--factor 8]
#                   [--target-ms 100] [--netns] [--baseline-congestion NAME]
#
# --netns runs the ranks in two network namespaces joined by a veth pair (half the ranks in
# each), each namespace standing in for a host, and every tool is held to the network between
# them: Monel twice, over its soft RNIC (RoCEv2, MONEL_TRANSPORT=shm,rdma) and over TCP
# (MONEL_TRANSPORT=shm,tcp), each namespace naming its own host (MONEL_HOST), so ranks in one
# namespace share memory as ranks on one host do and pairs across namespaces take the network
# (namespaces share /dev/shm, so Monel would otherwise find shared memory between them);
# Open MPI with the tcp BTL only (it cannot tell the namespaces apart, so its shared-memory
# BTL would carry the pairs across them too); Gloo over TCP, as it always is.
#
# Monel's TCP links ask for cubic congestion control (MONEL_TCP_CONGESTION); Open MPI and Gloo
# keep the system's. --baseline-congestion NAME gives their TCP sockets NAME too (through the
# LD_PRELOAD shim bench/race/tcp_congestion.c), to see how much of a difference is the choice.
#
# On one host Monel runs a second time with its buffers in symmetric windows (`monel bench
# -R 1`, as nccl-tests' -R registers buffers): collectives then run directly between the
# ranks' memory. Those columns are labelled "Monel -R"; the plain columns are ordinary buffers.
#
# Installs what it needs: Open MPI from apt, and torch in a venv ($MONEL_RACE_VENV, default
# /tmp/monel-race-venv; the PyPI wheel pulls about 5 GB of CUDA libraries even for CPU use).
set -euo pipefail
cd "$(dirname "$0")/.."

nps="2 4" rounds=5 min=8 max=32M factor=8 target=100 netns=0 baseline_cc=
while [ $# -gt 0 ]; do
  case $1 in
    --np) nps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --min) min=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --factor) factor=$2; shift 2 ;;
    --target-ms) target=$2; shift 2 ;;
    --netns) netns=1; shift ;;
    --baseline-congestion) baseline_cc=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
bytes() { numfmt --from=iec "$1"; }
min=$(bytes "$min") max=$(bytes "$max")

venv=${MONEL_RACE_VENV:-/tmp/monel-race-venv}
if ! command -v mpicc > /dev/null; then
  echo "# installing Open MPI" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev > /dev/null
fi
if ! "$venv/bin/python" -c "import torch" 2> /dev/null; then
  echo "# installing torch into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch numpy
fi

work=$(mktemp -d /tmp/monel-race.XXXXXX)
trap 'rm -rf "$work"; [ "$netns" = 1 ] && cleanup_ns' EXIT
cargo build --release -q -p monel-cli
M=$PWD/target/release/monel
mpicc -O2 -o "$work/mpi_allreduce" bench/race/mpi_allreduce.c
cc -O2 -pthread -o "$work/xcore_probe" bench/race/xcore_probe.c
# The baselines' environment: the congestion-control shim, where asked for. It goes in front
# of each application (env LD_PRELOAD=...), not through mpirun -x: in a test, -x left Open
# MPI's 2-rank 16 MiB AllReduce at BBR's 11-13 ms, where env in front took it to 8 ms.
base_env=()
if [ -n "$baseline_cc" ]; then
  cc -O2 -shared -fPIC -o "$work/tcp_congestion.so" bench/race/tcp_congestion.c -ldl
  base_env=(env LD_PRELOAD="$work/tcp_congestion.so" RACE_TCP_CONGESTION="$baseline_cc")
fi
args="$min $max $factor $target"
mpi_common="--allow-run-as-root --oversubscribe --bind-to none"

NS_A=monel_race_a NS_B=monel_race_b IP_A=10.213.55.1 IP_B=10.213.55.2
. scripts/netns-pair.sh
cleanup_ns() { netns_del $NS_A $NS_B; }
if [ "$netns" = 1 ]; then
  netns_pair $NS_A $NS_B mrace_a mrace_b $IP_A $IP_B
fi

port=29600
# Runs CMD as `np` ranks with torchrun's variables: all on loopback, or half per namespace.
ranks() { # np cmd...
  local np=$1; shift
  port=$((port + 1))
  if [ "$netns" = 0 ]; then
    "$M" launch -n "$np" --port $port -- "$@"
    return
  fi
  local pids=() r ns rc=0
  for r in $(seq 0 $((np - 1))); do
    if [ $r -lt $((np / 2)) ]; then ns=$NS_A; else ns=$NS_B; fi
    ip netns exec $ns env MONEL_TRANSPORT=shm,${race_transport:-tcp} MONEL_HOST=$ns MASTER_ADDR=$IP_A MASTER_PORT=$port RANK=$r WORLD_SIZE=$np \
      LOCAL_RANK=$r GLOO_SOCKET_IFNAME=$([ $ns = $NS_A ] && echo mrace_a || echo mrace_b) \
      "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}

run_monel() { # np [transport label [bench args]]
  race_transport=${2:-} ranks "$1" "$M" bench all_reduce -b "$min" -e "$max" -f "$factor" -T "$target" -w 3 -c 1 ${4:-} \
    --format csv | grep -E '^[0-9]' | awk -F, -v np="$1" -v t="${3:-monel}" '{print t "_oop", np, $1, $6; print t "_ip", np, $1, $10}'
}
run_mpi() {
  if [ "$netns" = 0 ]; then
    mpirun $mpi_common --mca oob_tcp_if_include lo -np "$1" "${base_env[@]}" "$work/mpi_allreduce" $args
  else
    # mpirun (and its PMIx server) in namespace A, reached over the veth from B.
    local half=$(($1 / 2))
    PMIX_MCA_ptl_tcp_if_include=mrace_a OMPI_MCA_oob_tcp_if_include=mrace_a \
      ip netns exec $NS_A mpirun $mpi_common --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include 10.213.55.0/24 -x PMIX_MCA_ptl_tcp_if_include=mrace_a \
      -np $half "${base_env[@]}" "$work/mpi_allreduce" $args : \
      -np $(($1 - half)) ip netns exec $NS_B "${base_env[@]}" "$work/mpi_allreduce" $args
  fi | awk -v np="$1" '{print "mpi", np, $1, $2}'
}
run_gloo() {
  GLOO_SOCKET_IFNAME=lo ranks "$1" "${base_env[@]}" "$venv/bin/python" bench/race/gloo_allreduce.py $args |
    awk -v np="$1" '{print "gloo", np, $1, $2}'
}

for np in $nps; do
  for r in $(seq "$rounds"); do
    echo "# np $np round $r/$rounds" >&2
    before=$("$work/xcore_probe")
    if [ "$netns" = 1 ]; then
      run_monel "$np" rdma >> "$work/all"
      run_monel "$np" tcp monel_tcp >> "$work/all"
    else
      run_monel "$np" >> "$work/all"
      run_monel "$np" "" monel_reg "-R 1" >> "$work/all"
    fi
    run_mpi "$np" >> "$work/all"
    run_gloo "$np" >> "$work/all"
    echo "$np $before $("$work/xcore_probe")" >> "$work/probe"
  done
done

cc_said=${baseline_cc:-"the system default"}
python3 - "$work/all" "$netns" "$cc_said" "$work/probe" "${MONEL_TCP_CONGESTION:-cubic, else reno}" << 'EOF'
import collections, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    tool, np, size, us = line.split()
    t[(tool, int(np), int(size))].append(float(us))
med = {k: statistics.median(v) for k, v in t.items()}
def human(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else (f"{size >> 10} KiB" if size >= 1024 else f"{size} B")
rows = sorted({(k[1], k[2]) for k in med})
def busbw(np, size, us):
    return size * 2 * (np - 1) / np / us / 1e3
where = "two network namespaces (veth)" if sys.argv[2] == "1" else "one host (loopback, shared memory)"
print(f"# float32 AllReduce, {where}; medians of {len(next(iter(t.values())))} interleaved rounds; Open MPI's and Gloo's TCP congestion control: {sys.argv[3]}; Monel's TCP links: {sys.argv[5]}")
tcp = sys.argv[2] == "1"
extra = " Monel TCP oop us | Monel TCP / MPI | Monel TCP / Gloo |" if tcp else " Monel -R oop us | Monel -R in-place us | Monel -R / MPI | Monel -R / Gloo |"
label = "Monel RoCE" if tcp else "Monel"
print(f"| ranks | size | {label} oop us | {label} in-place us | Open MPI us | Gloo us | {label} busbw GB/s | Open MPI busbw | Gloo busbw | {label} / MPI | {label} / Gloo |{extra}")
print("|---:" * (11 + (3 if tcp else 4)) + "|")
for (np, size) in rows:
    g = lambda tool: med.get((tool, np, size))
    mo, mi, mp, gl = g("monel_oop"), g("monel_ip"), g("mpi"), g("gloo")
    f = lambda x: "-" if x is None else (f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}")
    bw = lambda x: "-" if x is None else f"{busbw(np, size, x):.3f}"
    r = lambda a, b: "-" if a is None or b is None else f"{b / a:.2f}x"
    row = f"| {np} | {human(size)} | {f(mo)} | {f(mi)} | {f(mp)} | {f(gl)} | {bw(mo)} | {bw(mp)} | {bw(gl)} | {r(mo, mp)} | {r(mi, gl)} |"
    if tcp:
        to, ti = g("monel_tcp_oop"), g("monel_tcp_ip")
        row += f" {f(to)} | {r(to, mp)} | {r(ti, gl)} |"
    else:
        ro, ri = g("monel_reg_oop"), g("monel_reg_ip")
        row += f" {f(ro)} | {f(ri)} | {r(ro, mp)} | {r(ri, gl)} |"
    print(row)
# The spread: each round's ratio (the tools ran minutes apart at most, so a round's ratio
# is fairer than a ratio of medians when the machine's speed drifts).
print()
print("Each round's own ratios, Monel / Open MPI (out of place) and Monel / Gloo (in place):")
print()
print("```")
for (np, size) in rows:
    per = lambda a, b: " ".join(f"{y / x:.2f}" for x, y in zip(t.get((a, np, size), []), t.get((b, np, size), [])))
    print(f"{np} ranks, {human(size)}: vs MPI [{per('monel_oop', 'mpi')}]  vs Gloo [{per('monel_ip', 'gloo')}]")
print("```")
# The machine's state each round: bytes between cores (GB/s) before and after it.
probes = collections.defaultdict(list)
for line in open(sys.argv[4]):
    np, before, after = line.split()
    probes[int(np)].append(f"{before}/{after}")
print()
print("Cross-core probe (bench/race/xcore_probe.c), GB/s before/after each round:")
print()
print("```")
for np, v in sorted(probes.items()):
    print(f"{np} ranks: [{' '.join(v)}]")
print("```")
EOF
