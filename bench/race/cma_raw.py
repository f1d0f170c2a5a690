"""Raw cross-memory-attach bandwidth: the shared-memory link's own mechanism at its best,
for the transfer-engine race. A target process holds BUF bytes; THREADS threads of this
process each write BLOCK-byte blocks into it with process_vm_writev (one system call per
block, no engine around it), walking through BUF bytes as the benchmark's blocks do, for
SECONDS; prints GB/s (10^9 B/s) of all threads together. Needs permission to ptrace the
target (the same user with kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE).
Usage: cma_raw.py BLOCK THREADS SECONDS BUF"""
import ctypes
import subprocess
import sys
import threading
import time

import numpy as np


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def target(buf):
    dst = np.ones(buf, np.uint8)  # touched: every page is there before the copies
    print(dst.ctypes.data, flush=True)
    sys.stdin.read()  # until the source closes it


def main():
    if sys.argv[1] == "target":
        target(int(sys.argv[2]))
        return
    block, threads, secs, buf = (int(a) for a in sys.argv[1:5])
    per = max(buf // threads // block, 1) * block
    t = subprocess.Popen([sys.executable, __file__, "target", str(per * threads)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    remote = int(t.stdout.readline())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_writev.restype = ctypes.c_ssize_t
    src = np.full(per * threads, 0xa5, np.uint8)
    done = [0] * threads
    start = threading.Barrier(threads + 1)

    def run(k):
        base, at = k * per, 0
        li, ri = Iovec(), Iovec()
        start.wait()
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            li.base, li.len = src.ctypes.data + base + at, block
            ri.base, ri.len = remote + base + at, block
            n = libc.process_vm_writev(t.pid, ctypes.byref(li), 1, ctypes.byref(ri), 1, 0)
            if n != block:
                raise OSError(ctypes.get_errno(), f"process_vm_writev gave {n}")
            done[k] += block
            at = (at + block) % per

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for th in ts:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    for th in ts:
        th.join()
    print(f"{sum(done) / (time.perf_counter() - t0) / 1e9:.3f} GB/s")
    t.stdin.close()
    t.wait()


if __name__ == "__main__":
    main()
