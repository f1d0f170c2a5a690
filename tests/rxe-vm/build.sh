#!/bin/bash
# Builds the Soft-RoCE test VM: Debian 12's stock kernel (with rdma_rxe) and a busybox
# initramfs holding rdma-core's tools (ibverbs-utils, perftest, rdmacm-utils, iproute2's rdma).
# Output: $RXEVM_WORK/vmlinuz and $RXEVM_WORK/initrd.gz. Needs apt (Debian 12 sources).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${RXEVM_WORK:-$here/../../target/rxe-vm}
mkdir -p "$work/debs"
work=$(cd "$work" && pwd)
if [[ -f $work/initrd.gz && -f $work/vmlinuz && $work/initrd.gz -nt $here/init && $work/initrd.gz -nt $0 ]]; then
  echo "rxe-vm: up to date in $work"; exit 0
fi
# A fresh machine has no package index yet.
apt-cache show linux-image-amd64 >/dev/null 2>&1 || apt-get update -qq
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
pkgs=($kpkg busybox-static ibverbs-utils ibverbs-providers libibverbs1 librdmacm1 rdmacm-utils
      perftest iproute2 libnl-3-200 libnl-route-3-200 libmnl0 libelf1 libbpf1 libcap2 libbsd0 libmd0 libtirpc3
      libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libgcc-s1 libzstd1 zlib1g libdb5.3 libselinux1 libpcre2-8-0 libxtables12
      libpci3 libudev1 libibumad3)
cd "$work/debs"
missing=()
for p in "${pkgs[@]}"; do ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p"); done
# A stale package index names versions the mirror no longer has: refresh it and try again.
if ((${#missing[@]})); then
  apt-get download "${missing[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get download "${missing[@]}" >/dev/null; }
fi
rm -rf "$work/root" "$work/initramfs"
mkdir -p "$work/root"
# The newest download of each package (a kept directory may hold older ones).
for p in "${pkgs[@]}"; do dpkg-deb -x "$(ls "${p}"_*.deb | sort -V | tail -1)" "$work/root"; done
R=$work/root
I=$work/initramfs
mkdir -p $I/{bin,sbin,etc,proc,sys,dev,tmp,root,mnt,lib/modules,usr/lib/x86_64-linux-gnu/libibverbs,lib64,lib/x86_64-linux-gnu,etc/libibverbs.d,run,var}
cp "$R/bin/busybox" $I/bin/busybox
for a in $($I/bin/busybox --list); do [[ -e $I/bin/$a ]] || ln -s busybox $I/bin/$a; done
kver=$(ls "$R/lib/modules")
cp "$R"/boot/vmlinuz-* "$work/vmlinuz"
# Modules: the rxe chain and virtio networking.
mods=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net
      crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe)
M=$I/lib/modules/$kver
mkdir -p $M
: > $I/etc/modules.order
for m in "${mods[@]}"; do
  f=$(find "$R/lib/modules/$kver" -name "$m.ko*" | head -1)
  [[ -n $f ]] || { echo "module $m missing" >&2; exit 1; }
  case $f in
    *.xz) xz -dc "$f" > $M/$m.ko ;;
    *.zst) zstd -qdc "$f" > $M/$m.ko ;;
    *) cp "$f" $M/$m.ko ;;
  esac
  echo "$m" >> $I/etc/modules.order
done
# Tools and their library closure (resolved against the extracted root first).
bins=(usr/bin/ibv_devices usr/bin/ibv_devinfo usr/bin/ibv_rc_pingpong usr/bin/ibv_ud_pingpong
      usr/bin/ibv_uc_pingpong usr/bin/ibv_srq_pingpong usr/bin/ib_send_bw usr/bin/ib_write_bw
      usr/bin/ib_read_bw usr/bin/ib_send_lat usr/bin/ib_write_lat usr/bin/ib_read_lat
      usr/bin/ib_atomic_lat usr/bin/ib_atomic_bw usr/bin/rping usr/bin/rdma)
libpath="$R/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu/libibverbs"
todo=()
for b in "${bins[@]}"; do [[ -f $R/$b ]] && { cp "$R/$b" $I/bin/; todo+=("$R/$b"); }; done
prov=$(ls "$R"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)
cp "$prov" $I/usr/lib/x86_64-linux-gnu/libibverbs/
todo+=("$prov")
cp "$R"/etc/libibverbs.d/rxe.driver $I/etc/libibverbs.d/
# A library no package here provides would fail the tool inside the VM: stop now instead.
for f in "${todo[@]}"; do
  if LD_LIBRARY_PATH=$libpath ldd "$f" | grep "not found"; then
    echo "rxe-vm: $f needs a library the package list lacks" >&2
    exit 1
  fi
done
for f in "${todo[@]}"; do
  LD_LIBRARY_PATH=$libpath ldd "$f" | awk '/=> \//{print $3} /^\s*\/lib64/{print $1}'
done | sort -u | while read -r lib; do
  cp -L "$lib" $I/lib/x86_64-linux-gnu/ 2>/dev/null || true
done
cp -L /lib64/ld-linux-x86-64.so.2 $I/lib64/
# glibc dlopens libgcc_s for pthread_exit.
cp -L "$R"/lib/x86_64-linux-gnu/libgcc_s.so.1 $I/lib/x86_64-linux-gnu/ 2>/dev/null || cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 $I/lib/x86_64-linux-gnu/
ln -sf ../lib/x86_64-linux-gnu $I/usr/lib/x86_64-linux-gnu/lib 2>/dev/null || true
cp "$here/init" $I/init
chmod +x $I/init
echo "root:x:0:0:root:/root:/bin/sh" > $I/etc/passwd
# Written aside and renamed: a build that fails halfway leaves no initrd that looks up to date.
(cd $I && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initrd.gz.part"
mv "$work/initrd.gz.part" "$work/initrd.gz"
echo "rxe-vm: kernel $kver, initrd $(du -h "$work/initrd.gz" | cut -f1) in $work"
