#!/bin/bash
# Boots the Soft-RoCE VM (build.sh) on a tap in the test namespace and runs one command in
# it once rxe0 is up. Exit code: the guest command's; 124 on timeout; 125 if the VM died
# without reporting one. -b FILE (repeatable) carries a program into the guest's /bin (its
# debug information stripped), in an initramfs archive appended to the image's.
#   run.sh [-t TAP] [-a IP/LEN] [-M MTU] [-T SECS] [-l LOG] [-b FILE] -c 'CMD'
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${RXEVM_WORK:-$here/../../target/rxe-vm}
tap=rxetap0 addr=10.77.0.2/24 mtu=1500 secs=300 log= cmd=true carry=()
while getopts "t:a:M:T:l:c:b:" o; do
  case $o in t) tap=$OPTARG;; a) addr=$OPTARG;; M) mtu=$OPTARG;; T) secs=$OPTARG;; l) log=$OPTARG;; c) cmd=$OPTARG;;
  b) carry+=("$OPTARG");; *) exit 2;; esac
done
initrd=$work/initrd.gz
if ((${#carry[@]})); then
  stage=$(mktemp -d)
  mkdir -p "$stage/bin"
  for f in "${carry[@]}"; do
    # Programs lose their debug information; scripts go as they are.
    strip --strip-debug -o "$stage/bin/$(basename "$f")" "$f" 2>/dev/null ||
      install -m 755 "$f" "$stage/bin/$(basename "$f")"
  done
  initrd=$(mktemp)
  { cat "$work/initrd.gz"; (cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1); } > "$initrd"
  rm -rf "$stage"
  trap 'rm -f "$initrd"' EXIT
fi
"$here/net.sh" up 9000
"$here/net.sh" tap "$tap" 9000
ip4=${addr%/*}
mac=$(printf '52:54:00:4d:%02x:%02x' "$(echo "$ip4" | cut -d. -f3)" "$(echo "$ip4" | cut -d. -f4)")
b64=$(printf '%s' "$cmd" | base64 -w0)
log=${log:-$(mktemp)}
set +e
timeout "$secs" ip netns exec "${RXE_NETNS:-rxenet}" qemu-system-x86_64 -accel tcg -cpu max -m 1024 -smp 1 \
  -kernel "$work/vmlinuz" -initrd "$initrd" -nographic -no-reboot \
  -append "console=ttyS0 quiet panic=-1 rxeip=$addr rxemtu=$mtu rxecmd=$b64" \
  -netdev tap,id=n0,ifname="$tap",script=no,downscript=no \
  -device virtio-net-pci,netdev=n0,mac="$mac" > "$log" 2>&1
qrc=$?
set -e
tr -d '\r' < "$log" | sed -n '/RXEVM/,$p'
[[ $qrc == 124 ]] && exit 124
rc=$(tr -d '\r' < "$log" | sed -n 's/.*RXEVM: ---- end command rc=\([0-9]*\).*/\1/p' | tail -1)
exit "${rc:-125}"
