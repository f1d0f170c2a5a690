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

import numpy as np

from walk import walk


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
    def move(off, n):
        # Fresh iovecs per call, so the threads share none.
        li, ri = Iovec(src.ctypes.data + off, n), Iovec(remote + off, n)
        got = libc.process_vm_writev(t.pid, ctypes.byref(li), 1, ctypes.byref(ri), 1, 0)
        if got != n:
            raise OSError(ctypes.get_errno(), f"process_vm_writev gave {got}")

    print(f"{walk(threads, secs, per, block, move):.3f} GB/s")
    t.stdin.close()
    t.wait()


if __name__ == "__main__":
    main()
