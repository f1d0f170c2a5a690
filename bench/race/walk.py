"""The loop the raw memory baselines share (memcpy_raw.py, cma_raw.py): THREADS threads
each move BLOCK-byte blocks through their own PER bytes of a buffer, block after block,
for SECONDS, all starting together."""
import threading
import time


def walk(threads, secs, per, block, move):
    """Runs `move(off, block)` for the block at byte `off` of the buffer, thread k walking
    bytes k * per to (k + 1) * per; returns GB/s (10^9 B/s) of all threads together."""
    done = [0] * threads
    start = threading.Barrier(threads + 1)

    def run(k):
        base, at = k * per, 0
        start.wait()
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            move(base + at, block)
            done[k] += block
            at = (at + block) % per

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return sum(done) / (time.perf_counter() - t0) / 1e9
