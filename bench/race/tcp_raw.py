"""Raw TCP bandwidth on one path: the TCP link's own best, for the transfer-engine race.
STREAMS connections each send BLOCK-byte writes for SECONDS (the receiver reads into one
buffer with recv_into, no copy in Python); prints GB/s (10^9 B/s) of all streams together.
Usage: tcp_raw.py SERVER_IP CLIENT_IP BLOCK STREAMS SECONDS    (both ends in this process)
       tcp_raw.py sink IP PORT STREAMS                         (the receiving end: prints GB/s)
       tcp_raw.py source SERVER_IP PORT BLOCK STREAMS SECONDS  (the sending end)"""
import socket
import sys
import threading
import time


def sink(srv, block, streams):
    """Takes `streams` connections on `srv` and reads them to the end; returns GB/s from
    the first connection to the last byte."""
    got = [0] * streams
    start = []

    def run(k):
        c, _ = srv.accept()
        if not start:
            start.append(time.perf_counter())
        view = memoryview(bytearray(max(block, 1 << 20)))
        while True:
            n = c.recv_into(view)
            if n == 0:
                return
            got[k] += n

    ts = [threading.Thread(target=run, args=(k,)) for k in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(got) / (time.perf_counter() - start[0]) / 1e9


def sources(sip, port, cip, block, streams, secs):
    def run():
        c = socket.socket()
        if cip:
            c.bind((cip, 0))
        c.connect((sip, port))
        data = memoryview(bytearray(b"\xa5" * block))
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            c.sendall(data)
        c.close()

    ts = [threading.Thread(target=run) for _ in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def main():
    a = sys.argv[1:]
    if a[0] == "sink":
        srv = socket.socket()
        srv.bind((a[1], int(a[2])))
        srv.listen(int(a[3]))
        print(f"raw tcp {sink(srv, 1 << 20, int(a[3])):.3f} GB/s", flush=True)
        return
    if a[0] == "source":
        sources(a[1], int(a[2]), None, int(a[3]), int(a[4]), float(a[5]))
        return
    sip, cip, block, streams, secs = a[0], a[1], int(a[2]), int(a[3]), float(a[4])
    srv = socket.socket()
    srv.bind((sip, 0))
    srv.listen(streams)
    port = srv.getsockname()[1]
    out = []
    t = threading.Thread(target=lambda: out.append(sink(srv, block, streams)))
    t.start()
    sources(sip, port, cip, block, streams, secs)
    t.join()
    print(f"raw tcp {out[0]:.3f} GB/s")


if __name__ == "__main__":
    main()
