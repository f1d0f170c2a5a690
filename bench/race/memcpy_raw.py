"""Raw memory copy bandwidth: the shared-memory link's own best, for the transfer-engine
race. THREADS threads each copy BLOCK-byte blocks from one buffer into another, walking
through BUF bytes as the benchmark's blocks do, for SECONDS (numpy copies without the GIL);
prints GB/s (10^9 B/s) of all threads together.
Usage: memcpy_raw.py BLOCK THREADS SECONDS BUF"""
import sys
import threading
import time

import numpy as np


def main():
    block, threads, secs, buf = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    per = max(buf // threads // block, 1) * block
    src = np.ones(per * threads, np.uint8)
    dst = np.zeros(per * threads, np.uint8)
    done = [0] * threads
    start = threading.Barrier(threads + 1)

    def run(k):
        base, at = k * per, 0
        start.wait()
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            np.copyto(dst[base + at:base + at + block], src[base + at:base + at + block])
            done[k] += block
            at = (at + block) % per

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    print(f"{sum(done) / (time.perf_counter() - t0) / 1e9:.3f} GB/s")


if __name__ == "__main__":
    main()
