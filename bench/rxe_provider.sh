#!/bin/sh
# Monel's rdma-core provider against perftest on the same device: Linux rxe in the test VM,
# both ends of each pair on rxe0 (its loopback). Five rounds, each: ib_write_bw pair, then
# `monel perf write-bw --perftest` pair (64 KiB, 500 messages, MB/s), then 2-byte SEND
# latency both ways (usec, t_typical). Run from the repository:
#   tests/rxe-vm/net.sh up 9000
#   tests/rxe-vm/run.sh -M 9000 -T 500 -b target/release/monel -b bench/rxe_provider.sh -c 'sh /bin/rxe_provider.sh'
G=$RXE_GID_IDX
pair() { # column, then the tool and its arguments
  col=$1; shift
  "$@" > /tmp/s 2>&1 & sp=$!; sleep 1
  "$@" 10.77.0.2 > /tmp/c 2>&1; wait $sp
  grep -A1 "#bytes" /tmp/c | tail -1 | awk -v c="$col" '{print $c}'
}
for i in 1 2 3 4 5; do
  a=$(pair 4 ib_write_bw -d rxe0 -x $G -s 65536 -n 500)
  b=$(pair 4 monel perf write-bw --perftest -d rxe0 -s 65536 -n 500)
  c=$(pair 5 ib_send_lat -d rxe0 -x $G -s 2 -n 1000)
  d=$(pair 5 monel perf send-lat --perftest -d rxe0 -s 2 -n 1000)
  echo "ROUND $i perftest_write_bw=$a monel_write_bw=$b perftest_send_lat=$c monel_send_lat=$d"
done
