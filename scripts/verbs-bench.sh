#!/bin/bash
# Soft RNIC vs raw UDP on loopback, two processes each, interleaved runs; prints medians, ratios
# of the medians and the median of the runs' own ratios ("paired"), with a cross-core probe before
# each run (bench/race/xcore_probe.c: about 11 GB/s in this VM's good spells, 2-4 in slow ones).
# RC WRITE of 64 KiB messages (MTU 4096) against sendmmsg of 4112-byte datagrams in
# batches of 32 (the RNIC's own batch), both with UDP GSO/GRO (up to 15 datagrams per
# message) and both without (--no-gso); 8-byte SEND ping-pong against an 8-byte UDP
# ping-pong, both sleeping in the kernel between messages, then both spinning (--busy); and
# the floor of a reliable connection: the UDP ping-pong with each datagram followed by a
# 20-byte stand-in ACK in the same sendmmsg (udp-lat --with-ack), which Monel's ratio is also
# given against. The GSO baseline runs twice: with contiguous datagrams, and gathered from
# three pieces each (header, payload, trailer: udp-bw --gather), the layout the RNIC hands
# the kernel to avoid copying payloads, which costs the kernel's copy more.
# Latency pairs are pinned (taskset), as a wake-up's cost depends on where the two processes
# sit: on this kind of VM a wake-up across cores costs about 20 us and one on the same core
# about 3, and unpinned runs land on either, run by run. "Own cores" (server on CPU 0, client
# on CPU 1) stands for two hosts; "one core" (both on CPU 0) shows the software's own cost.
# Busy-polling runs on own cores only.
#   scripts/verbs-bench.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p monel-cli
M=target/release/monel
runs=${1:-5}
p=19100
pair() { # test extra-args... ; prints the client's output. PIN="S C": server on CPU S, client on C
  local t=$1; shift
  local ps=() pc=()
  if [ -n "${PIN:-}" ]; then
    read -r a b <<< "$PIN"
    ps=(taskset -c "$a"); pc=(taskset -c "$b")
  fi
  p=$((p + 1))
  "${ps[@]}" $M perf "$t" -d 127.0.2.2 -p $p --udp-port 25100 "$@" > /tmp/monel-bench-srv.$$ 2>&1 &
  local s=$!
  sleep 0.3
  "${pc[@]}" $M perf "$t" -d 127.0.2.3 -p $p --udp-port 25100 "$@" 127.0.2.2
  wait $s || true
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# The median of run-by-run ratios B/A (files of one number per run, in run order): a pair ran
# seconds apart, so its ratio holds where the machine's state changed between runs.
paired() { paste "/tmp/monel-bench-$1.$$" "/tmp/monel-bench-$2.$$" | awk '$1 > 0 {print $2 / $1}' | median | cut -c1-5; }
# A cross-core probe before each run (bench/race/xcore_probe.c), where a C compiler is here.
probe=true
if command -v cc > /dev/null; then
  cc -O2 -pthread -o /tmp/monel-bench-probe.$$ bench/race/xcore_probe.c && probe=/tmp/monel-bench-probe.$$
fi
: > /tmp/monel-bench-probes.$$
: > /tmp/monel-bench-udpbwg.$$; : > /tmp/monel-bench-udpbw.$$; : > /tmp/monel-bench-wbw.$$; : > /tmp/monel-bench-cpu.$$
: > /tmp/monel-bench-udpbw0.$$; : > /tmp/monel-bench-wbw0.$$; : > /tmp/monel-bench-cpu0.$$
: > /tmp/monel-bench-udplat.$$; : > /tmp/monel-bench-slat.$$
: > /tmp/monel-bench-budplat.$$; : > /tmp/monel-bench-bslat.$$
: > /tmp/monel-bench-acklat.$$; : > /tmp/monel-bench-backlat.$$
: > /tmp/monel-bench-udplat1.$$; : > /tmp/monel-bench-slat1.$$; : > /tmp/monel-bench-acklat1.$$
own="0 1"; one="0 0"
if [ "$(nproc)" -lt 2 ]; then own="0 0"; fi
for i in $(seq "$runs"); do
  $probe >> /tmp/monel-bench-probes.$$
  pair udp-bw -n 20000 | sed -n 's/.*delivered \([0-9.]*\) Gb\/s.*/\1/p' >> /tmp/monel-bench-udpbw.$$
  pair udp-bw -n 20000 --gather | sed -n 's/.*delivered \([0-9.]*\) Gb\/s.*/\1/p' >> /tmp/monel-bench-udpbwg.$$
  out=$(pair write-bw -s 65536 -n 20000 | tail -1)
  echo "$out" | sed -n 's/.*\[\([0-9.]*\) Gb\/s.*/\1/p' >> /tmp/monel-bench-wbw.$$
  echo "$out" | sed -n 's/.*Gb\/s, \([0-9.]*\) CPU.*/\1/p' >> /tmp/monel-bench-cpu.$$
  pair udp-bw -n 20000 --no-gso | sed -n 's/.*delivered \([0-9.]*\) Gb\/s.*/\1/p' >> /tmp/monel-bench-udpbw0.$$
  out=$(pair write-bw -s 65536 -n 20000 --no-gso | tail -1)
  echo "$out" | sed -n 's/.*\[\([0-9.]*\) Gb\/s.*/\1/p' >> /tmp/monel-bench-wbw0.$$
  echo "$out" | sed -n 's/.*Gb\/s, \([0-9.]*\) CPU.*/\1/p' >> /tmp/monel-bench-cpu0.$$
  PIN=$own pair udp-lat -s 8 -n 5000 | tail -1 | awk '{print $5}' >> /tmp/monel-bench-udplat.$$
  PIN=$own pair udp-lat -s 8 -n 5000 --with-ack | tail -1 | awk '{print $5}' >> /tmp/monel-bench-acklat.$$
  PIN=$own pair send-lat -s 8 -n 5000 | tail -1 | awk '{print $5}' >> /tmp/monel-bench-slat.$$
  PIN=$one pair udp-lat -s 8 -n 5000 | tail -1 | awk '{print $5}' >> /tmp/monel-bench-udplat1.$$
  PIN=$one pair udp-lat -s 8 -n 5000 --with-ack | tail -1 | awk '{print $5}' >> /tmp/monel-bench-acklat1.$$
  PIN=$one pair send-lat -s 8 -n 5000 | tail -1 | awk '{print $5}' >> /tmp/monel-bench-slat1.$$
  PIN=$own pair udp-lat -s 8 -n 5000 --busy | tail -1 | awk '{print $5}' >> /tmp/monel-bench-budplat.$$
  PIN=$own pair udp-lat -s 8 -n 5000 --busy --with-ack | tail -1 | awk '{print $5}' >> /tmp/monel-bench-backlat.$$
  PIN=$own pair send-lat -s 8 -n 5000 --busy | tail -1 | awk '{print $5}' >> /tmp/monel-bench-bslat.$$
done
ug=$(median < /tmp/monel-bench-udpbwg.$$); u=$(median < /tmp/monel-bench-udpbw.$$); w=$(median < /tmp/monel-bench-wbw.$$); c=$(median < /tmp/monel-bench-cpu.$$)
u0=$(median < /tmp/monel-bench-udpbw0.$$); w0=$(median < /tmp/monel-bench-wbw0.$$); c0=$(median < /tmp/monel-bench-cpu0.$$)
ul=$(median < /tmp/monel-bench-udplat.$$); sl=$(median < /tmp/monel-bench-slat.$$)
bul=$(median < /tmp/monel-bench-budplat.$$); bsl=$(median < /tmp/monel-bench-bslat.$$)
al=$(median < /tmp/monel-bench-acklat.$$); bal=$(median < /tmp/monel-bench-backlat.$$)
ul1=$(median < /tmp/monel-bench-udplat1.$$); sl1=$(median < /tmp/monel-bench-slat1.$$); al1=$(median < /tmp/monel-bench-acklat1.$$)
echo "runs: $runs (medians; \"paired\": the median of each run's own ratio)"
echo "cross-core probe before each run, GB/s: [$(tr '\n' ' ' < /tmp/monel-bench-probes.$$)]"
echo "raw UDP goodput (4112 B x32, GSO):      $u Gb/s   [$(tr '\n' ' ' < /tmp/monel-bench-udpbw.$$)]"
echo "Monel RC WRITE 64 KiB, MTU 4096, GSO:   $w Gb/s   [$(tr '\n' ' ' < /tmp/monel-bench-wbw.$$)]  ratio $(echo "$w / $u" | bc -l | cut -c1-5), paired $(paired udpbw wbw); client CPU $c s/GB"
echo "raw UDP goodput, gathered (GSO):        $ug Gb/s   [$(tr '\n' ' ' < /tmp/monel-bench-udpbwg.$$)]  Monel / gathered $(echo "$w / $ug" | bc -l | cut -c1-5), paired $(paired udpbwg wbw)"
echo "raw UDP goodput (4112 B x32, no GSO):   $u0 Gb/s   [$(tr '\n' ' ' < /tmp/monel-bench-udpbw0.$$)]"
echo "Monel RC WRITE 64 KiB, no GSO:          $w0 Gb/s   [$(tr '\n' ' ' < /tmp/monel-bench-wbw0.$$)]  ratio $(echo "$w0 / $u0" | bc -l | cut -c1-5), paired $(paired udpbw0 wbw0); client CPU $c0 s/GB"
echo "own cores: raw UDP 8 B ping-pong:       $ul us   [$(tr '\n' ' ' < /tmp/monel-bench-udplat.$$)]"
echo "own cores: raw UDP 8 B + 20 B ACK:       $al us   [$(tr '\n' ' ' < /tmp/monel-bench-acklat.$$)]"
echo "own cores: Monel 8 B SEND ping-pong:     $sl us   [$(tr '\n' ' ' < /tmp/monel-bench-slat.$$)]  ratio $(echo "$sl / $ul" | bc -l | cut -c1-5) (paired $(paired udplat slat)); to the floor $(echo "$sl / $al" | bc -l | cut -c1-5)"
echo "one core: raw UDP 8 B ping-pong:        $ul1 us   [$(tr '\n' ' ' < /tmp/monel-bench-udplat1.$$)]"
echo "one core: raw UDP 8 B + 20 B ACK:       $al1 us   [$(tr '\n' ' ' < /tmp/monel-bench-acklat1.$$)]"
echo "one core: Monel 8 B SEND ping-pong:     $sl1 us   [$(tr '\n' ' ' < /tmp/monel-bench-slat1.$$)]  ratio $(echo "$sl1 / $ul1" | bc -l | cut -c1-5) (paired $(paired udplat1 slat1)); to the floor $(echo "$sl1 / $al1" | bc -l | cut -c1-5)"
echo "busy: raw UDP 8 B ping-pong:            $bul us   [$(tr '\n' ' ' < /tmp/monel-bench-budplat.$$)]"
echo "busy: raw UDP 8 B + 20 B ACK (floor):    $bal us   [$(tr '\n' ' ' < /tmp/monel-bench-backlat.$$)]"
echo "busy: Monel 8 B SEND ping-pong:         $bsl us   [$(tr '\n' ' ' < /tmp/monel-bench-bslat.$$)]  ratio $(echo "$bsl / $bul" | bc -l | cut -c1-5) (paired $(paired budplat bslat)); to the floor $(echo "$bsl / $bal" | bc -l | cut -c1-5)"
rm -f /tmp/monel-bench-*.$$
