"""Raw TCP bandwidth on one path: the TCP link's own best, for the transfer-engine race.
STREAMS connections each send BLOCK-byte writes for SECONDS (the receiver reads into one
buffer with recv_into, no copy in Python); prints GB/s (10^9 B/s) of all streams together.
Usage: tcp_raw.py SERVER_IP CLIENT_IP BLOCK STREAMS SECONDS"""
import socket
import sys
import threading
import time


def main():
    sip, cip, block, streams, secs = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6])
    block, streams = int(block), int(streams)
    srv = socket.socket()
    srv.bind((sip, 0))
    srv.listen(streams)
    port = srv.getsockname()[1]
    got = [0] * streams

    def sink(k):
        c, _ = srv.accept()
        buf = bytearray(max(block, 1 << 20))
        view = memoryview(buf)
        while True:
            n = c.recv_into(view)
            if n == 0:
                return
            got[k] += n

    def source():
        c = socket.socket()
        c.bind((cip, 0))
        c.connect((sip, port))
        data = memoryview(bytearray(b"\xa5" * block))
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            c.sendall(data)
        c.close()

    sinks = [threading.Thread(target=sink, args=(k,)) for k in range(streams)]
    for t in sinks:
        t.start()
    t0 = time.perf_counter()
    sources = [threading.Thread(target=source) for _ in range(streams)]
    for t in sources:
        t.start()
    for t in sources + sinks:
        t.join()
    took = time.perf_counter() - t0
    print(f"raw tcp {sum(got) / took / 1e9:.3f} GB/s")


if __name__ == "__main__":
    main()
