"""Raw memory copy bandwidth within one process: the bound of any copy, for the
transfer-engine race. THREADS threads each copy BLOCK-byte blocks from one buffer into
another, walking through BUF bytes as the benchmark's blocks do, for SECONDS (numpy copies
without the GIL); prints GB/s (10^9 B/s) of all threads together.
Usage: memcpy_raw.py BLOCK THREADS SECONDS BUF"""
import sys

import numpy as np

from walk import walk


def main():
    block, threads, secs, buf = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    per = max(buf // threads // block, 1) * block
    src = np.ones(per * threads, np.uint8)
    dst = np.zeros(per * threads, np.uint8)

    def move(off, n):
        np.copyto(dst[off:off + n], src[off:off + n])

    print(f"{walk(threads, secs, per, block, move):.3f} GB/s")


if __name__ == "__main__":
    main()
