"""Mooncake's Transfer Engine (PyPI mooncake-transfer-engine-non-cuda; TCP transport, P2P
handshake, no metadata server) driven as `monel xfer-bench` drives Monel's: a target that
registers a buffer, and an initiator whose threads each submit synchronous batches of
WRITEs of BATCH blocks of BLOCK bytes for SECONDS. Prints GB/s (10^9 B/s).
Usage: mooncake_xfer.py target IP PORT BUFFER_BYTES SERVE_SECONDS
       mooncake_xfer.py init IP TARGET_NAME TARGET_ADDR BLOCK BATCH THREADS SECONDS"""
import sys
import threading
import time

import numpy as np
from mooncake.engine import TransferEngine


def main():
    mode = sys.argv[1]
    e = TransferEngine()
    if mode == "target":
        ip, port, size, serve = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        assert e.initialize(f"{ip}:{port}", "P2PHANDSHAKE", "tcp", "") == 0
        buf = np.zeros(size, np.uint8)
        assert e.register_memory(buf.ctypes.data, buf.nbytes) == 0
        print(f"TARGET {ip}:{e.get_rpc_port()} {buf.ctypes.data}", flush=True)
        time.sleep(serve)
        return
    ip, target, raddr = sys.argv[2], sys.argv[3], int(sys.argv[4])
    bs, batch, threads, secs = (int(x) for x in sys.argv[5:9])
    assert e.initialize(f"{ip}:0", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.ones(bs * batch * threads, np.uint8)
    assert e.register_memory(buf.ctypes.data, buf.nbytes) == 0
    moved = [0] * threads
    until = time.time() + secs

    def work(t):
        base = t * bs * batch
        src = [buf.ctypes.data + base + k * bs for k in range(batch)]
        dst = [raddr + base + k * bs for k in range(batch)]
        while time.time() < until:
            assert e.batch_transfer_sync_write(target, src, dst, [bs] * batch) == 0
            moved[t] += bs * batch

    t0 = time.time()
    ws = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    print(f"mooncake write block {bs} batch {batch} threads {threads}: "
          f"{sum(moved) / (time.time() - t0) / 1e9:.3f} GB/s")


if __name__ == "__main__":
    main()
