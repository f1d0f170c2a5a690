"""Raw TCP bandwidth on one path: the TCP link's own best, for the transfer-engine race.
STREAMS connections each send BLOCK-byte writes for SECONDS; prints GB/s (10^9 B/s) of all
streams together. With BUF, each side's streams walk through BUF bytes of memory together
as the benchmark's blocks do (the sender sends block after block of its share, the
receiver reads into block after block of its own), so the bytes come from and go to the
same amount of memory as the engine's; without it, every write sends one block and every
read lands in one buffer (cache-hot). No copy in Python: sendall of a memoryview,
recv_into.
Usage: tcp_raw.py SERVER_IP CLIENT_IP BLOCK STREAMS SECONDS [BUF]   (both ends here)
       tcp_raw.py sink IP PORT STREAMS [BLOCK BUF]                   (the receiving end)
       tcp_raw.py source SERVER_IP PORT BLOCK STREAMS SECONDS [BUF]  (the sending end)"""
import socket
import sys
import threading
import time


def share(block, streams, buf):
    """Bytes of memory each stream walks through: a whole number of blocks."""
    if not buf:
        return block
    return max(buf // streams // block, 1) * block


def sink(srv, block, streams, buf=0):
    """Takes `streams` connections on `srv` and reads them to the end; returns GB/s from
    the first connection to the last byte."""
    got = [0] * streams
    start = []
    per = share(block, streams, buf) if buf else max(block, 1 << 20)

    def run(k):
        c, _ = srv.accept()
        if not start:
            start.append(time.perf_counter())
        view = memoryview(bytearray(per))
        at = 0
        while True:
            n = c.recv_into(view[at:])
            if n == 0:
                return
            got[k] += n
            at = 0 if at + n >= per else at + n

    ts = [threading.Thread(target=run, args=(k,)) for k in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(got) / (time.perf_counter() - start[0]) / 1e9


def sources(sip, port, cip, block, streams, secs, buf=0):
    per = share(block, streams, buf)

    def run():
        c = socket.socket()
        if cip:
            c.bind((cip, 0))
        c.connect((sip, port))
        data = memoryview(bytearray(b"\xa5" * per))
        at = 0
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            c.sendall(data[at:at + block])
            at = (at + block) % per
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
        streams = int(a[3])
        srv.listen(streams)
        block, buf = (int(a[4]), int(a[5])) if len(a) > 5 else (1 << 20, 0)
        print(f"raw tcp {sink(srv, block, streams, buf):.3f} GB/s", flush=True)
        return
    if a[0] == "source":
        buf = int(a[6]) if len(a) > 6 else 0
        sources(a[1], int(a[2]), None, int(a[3]), int(a[4]), float(a[5]), buf)
        return
    sip, cip, block, streams, secs = a[0], a[1], int(a[2]), int(a[3]), float(a[4])
    buf = int(a[5]) if len(a) > 5 else 0
    srv = socket.socket()
    srv.bind((sip, 0))
    srv.listen(streams)
    port = srv.getsockname()[1]
    out = []
    t = threading.Thread(target=lambda: out.append(sink(srv, block, streams, buf)))
    t.start()
    sources(sip, port, cip, block, streams, secs, buf)
    t.join()
    print(f"raw tcp {out[0]:.3f} GB/s")


if __name__ == "__main__":
    main()
