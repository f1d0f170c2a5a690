"""RDMA between two processes from Python, on Monel's software RoCEv2 NIC.

The server registers a numpy array and offers it; the client
  1. RDMA-WRITEs its array into the server's, with immediate data that wakes the server,
  2. waits while the server doubles the array in place and SENDs a note back,
  3. RDMA-READs the doubled array back and checks it,
  4. bumps a counter in the server's memory with an atomic fetch-and-add.

    python examples/rdma_write.py                      # both sides, two processes, loopback
    python examples/rdma_write.py --server --ip 10.0.0.1            # on one host
    python examples/rdma_write.py --client 10.0.0.1 --ip 10.0.0.2  # on another

Each side's NIC is a UDP socket: port 4791 (RoCEv2) with --udp-port 4791, or a free port (the
default, so both can share one address) that the connection manager tells the peer.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

from monel import verbs

ALL = (
    verbs.ACCESS_LOCAL_WRITE
    | verbs.ACCESS_REMOTE_WRITE
    | verbs.ACCESS_REMOTE_READ
    | verbs.ACCESS_REMOTE_ATOMIC
)


def one(cq: verbs.CompletionQueue, what: str) -> verbs.WorkCompletion:
    """The next completion, which must be a success."""
    wcs = cq.wait(1, timeout=10.0)
    if not wcs:
        sys.exit(f"{what}: no completion within 10 s")
    if not wcs[0].ok:
        sys.exit(f"{what}: {wcs[0]}")
    return wcs[0]


def open_nic(args):
    dev = verbs.get_device(args.ip)
    ctx = dev.open(udp_port=args.udp_port)
    pd = ctx.alloc_pd()
    cq = ctx.create_cq(64)
    qp = pd.create_qp(cq)
    return dev, ctx, pd, cq, qp


def server(args) -> None:
    dev, ctx, pd, cq, qp = open_nic(args)
    data = np.zeros(args.count + 2, dtype=np.float32)  # the payload, then a 64-bit counter
    mr = pd.reg_mr(data, ALL)
    note = bytearray(64)
    note_mr = pd.reg_mr(note, verbs.ACCESS_LOCAL_WRITE)
    listener = verbs.Listener(f"{args.ip}:{args.cm_port}")
    print(f"server: {dev.name}, UDP {ctx.udp_port}, waiting on {listener.address}", flush=True)
    conn = listener.accept(qp, mr, secret=args.secret)
    qp.post_recv(note_mr, wr_id=1)  # consumed by the client's WRITE with immediate
    wc = one(cq, "receive of the WRITE's immediate")
    print(f"server: WRITE of {wc.byte_len} bytes landed, immediate {wc.imm:#x}", flush=True)
    payload = data[: args.count]
    expect = np.arange(args.count, dtype=np.float32)
    assert np.array_equal(payload, expect), "the written array differs"
    payload *= 2
    msg = f"doubled {args.count} floats".encode()
    note[: len(msg)] = msg
    qp.post_send(note_mr, 0, len(msg), wr_id=2)
    one(cq, "send of the note")
    conn.barrier()  # the client has read the array and bumped the counter
    counter = int(data[args.count :].view(np.uint64)[0])
    assert counter == 5, f"counter is {counter}, want 5"
    print(f"server: counter is {counter}; done", flush=True)


def client(args) -> None:
    dev, ctx, pd, cq, qp = open_nic(args)
    src = np.arange(args.count, dtype=np.float32)
    back = np.zeros(args.count, dtype=np.float32)
    old = np.zeros(1, dtype=np.uint64)
    note = bytearray(64)
    src_mr = pd.reg_mr(src, 0)  # a WRITE only reads it locally
    back_mr = pd.reg_mr(back, verbs.ACCESS_LOCAL_WRITE)
    old_mr = pd.reg_mr(old, verbs.ACCESS_LOCAL_WRITE)
    note_mr = pd.reg_mr(note, verbs.ACCESS_LOCAL_WRITE)
    qp_addr = f"{args.client}:{args.cm_port}"
    conn = verbs.connect(qp_addr, qp, secret=args.secret, timeout=20.0)
    addr, rkey, length = conn.remote_buffer
    print(f"client: {dev.name} -> {qp_addr}: QP {qp.qp_num:#x} to {conn.remote_qpn:#x}, "
          f"MTU {conn.mtu}, remote buffer {length} B", flush=True)
    qp.post_recv(note_mr, wr_id=10)
    t = time.perf_counter()
    qp.post_write(src_mr, addr, rkey, wr_id=11, imm=0xC0FFEE)
    one(cq, "RDMA WRITE")
    dt = time.perf_counter() - t
    print(f"client: wrote {src.nbytes} B in {dt * 1e3:.2f} ms "
          f"({src.nbytes * 8 / dt / 1e9:.2f} Gb/s, one message)", flush=True)
    wc = one(cq, "receive of the note")
    print(f"client: server says {bytes(note[: wc.byte_len]).decode()!r}", flush=True)
    qp.post_read(back_mr, addr, rkey, wr_id=12)
    one(cq, "RDMA READ")
    assert np.array_equal(back, src * 2), "the array read back is not doubled"
    print(f"client: read back {back.nbytes} B, all doubled", flush=True)
    counter_addr = addr + args.count * 4
    for _ in range(5):
        qp.post_fetch_add(old_mr, counter_addr, rkey, add=1, wr_id=13)
        one(cq, "fetch-and-add")
    assert int(old[0]) == 4, f"last fetch-and-add saw {int(old[0])}, want 4"
    print("client: five fetch-and-adds; done", flush=True)
    conn.barrier()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    role = ap.add_mutually_exclusive_group()
    role.add_argument("--server", action="store_true", help="run the server side only")
    role.add_argument("--client", metavar="SERVER_IP", help="run the client side only")
    ap.add_argument("--ip", default="127.0.0.1", help="this side's address (its device)")
    ap.add_argument("--cm-port", type=int, default=18600, help="connection manager TCP port")
    ap.add_argument("--udp-port", type=int, default=0, help="RoCE UDP port (0: a free one)")
    ap.add_argument("--count", type=int, default=1 << 20, help="float32 elements to move")
    ap.add_argument("--secret", type=lambda s: s.encode(), default=None,
                    help="shared secret both sides must prove")
    args = ap.parse_args()
    if args.server:
        server(args)
    elif args.client:
        client(args)
    else:
        me = [sys.executable, __file__, "--ip", args.ip, "--cm-port", str(args.cm_port),
              "--udp-port", str(args.udp_port), "--count", str(args.count)]
        if args.secret:
            me += ["--secret", args.secret.decode()]
        srv = subprocess.Popen(me + ["--server"])
        cli = subprocess.run(me + ["--client", args.ip], check=False, timeout=120)
        code = srv.wait(timeout=30)
        sys.exit(cli.returncode or code)


if __name__ == "__main__":
    main()
