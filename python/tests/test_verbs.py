"""Verbs from Python: devices, memory regions on numpy arrays and tensors, RC queue pairs over
the soft RNIC, every operation's completion, and bad input (typed errors and ibv_wc_status
completions, never a hang)."""

import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import EXAMPLES, free_port

from monel import InvalidArgumentError, MonelError, verbs

ALL = (
    verbs.ACCESS_LOCAL_WRITE
    | verbs.ACCESS_REMOTE_WRITE
    | verbs.ACCESS_REMOTE_READ
    | verbs.ACCESS_REMOTE_ATOMIC
)


class Side:
    """One soft NIC on 127.0.0.1 (a free UDP port), with a PD, a CQ and an RC QP."""

    def __init__(self):
        self.ctx = verbs.get_device("127.0.0.1").open(udp_port=0)
        self.pd = self.ctx.alloc_pd()
        self.cq = self.ctx.create_cq(64)
        self.qp = self.pd.create_qp(self.cq)

    def one(self, timeout=10.0):
        wcs = self.cq.wait(1, timeout)
        assert len(wcs) == 1, f"no completion within {timeout} s"
        return wcs[0]


def pair(server_mr_of=None, **cm):
    """Two sides connected through the connection manager; the server offers the region
    `server_mr_of(side)` returns. Returns (server, client, server_conn, client_conn)."""
    s, c = Side(), Side()
    s.mr = server_mr_of(s) if server_mr_of else None
    listener = verbs.Listener("127.0.0.1:0")
    got = {}

    def accept():
        try:
            got["conn"] = listener.accept(s.qp, s.mr, **cm)
        except MonelError as e:
            got["err"] = e

    t = threading.Thread(target=accept)
    t.start()
    try:
        cc = verbs.connect(listener.address, c.qp, **cm)
    finally:
        t.join()
    if "err" in got:
        raise got["err"]
    return s, c, got["conn"], cc


def test_devices_and_gids():
    devs = verbs.device_list()
    lo = [d for d in devs if "127.0.0.1" in d.ips]
    assert lo, f"no device with 127.0.0.1 in {devs}"
    assert lo[0].state == "active"
    d = verbs.get_device("127.0.0.1")
    assert d.gids == ["0000:0000:0000:0000:0000:ffff:7f00:0001"]
    assert d.active_mtu in (1024, 2048, 4096)
    with pytest.raises(verbs.VerbsError) as e:
        verbs.get_device("no_such_interface0")
    assert e.value.kind == "not_found"


def test_write_imm_read_send_and_atomics_land_in_numpy_arrays():
    buf = np.zeros(4096 + 1, dtype=np.float64)  # the payload, then an atomic counter

    s, c, sconn, cconn = pair(lambda s: s.pd.reg_mr(buf, ALL))
    assert s.qp.state == c.qp.state == "rts"
    addr, rkey, length = cconn.remote_buffer
    assert length == buf.nbytes and rkey == s.mr.rkey and addr == s.mr.addr
    assert sconn.remote_buffer is None and cconn.remote_qpn == s.qp.qp_num

    # WRITE with immediate: the data lands, the immediate consumes the server's receive.
    src = np.linspace(-1, 1, 4096)
    src_mr = c.pd.reg_mr(src, 0)
    note = bytearray(32)
    note_mr = s.pd.reg_mr(note, verbs.ACCESS_LOCAL_WRITE)
    s.qp.post_recv(note_mr, wr_id=7)
    c.qp.post_write(src_mr, addr, rkey, wr_id=1, imm=0xABCD)
    wc = c.one()
    assert (wc.ok, wc.opcode, wc.wr_id) == (True, "rdma_write", 1)
    wc = s.one()
    assert (wc.opcode, wc.imm, wc.byte_len, wc.wr_id) == (
        "recv_rdma_with_imm",
        0xABCD,
        src.nbytes,
        7,
    )
    assert np.array_equal(buf[:4096], src)

    # SEND into a posted receive.
    # (Regions must outlive their work: one garbage-collected deregisters.)
    msg = bytearray(b"hello from the server")
    note_in = bytearray(64)
    in_mr = c.pd.reg_mr(note_in, verbs.ACCESS_LOCAL_WRITE)
    msg_mr = s.pd.reg_mr(msg, 0)
    c.qp.post_recv(in_mr, wr_id=3)
    s.qp.post_send(msg_mr, wr_id=4)
    assert s.one().opcode == "send"
    wc = c.one()
    assert (wc.opcode, wc.byte_len) == ("recv", len(msg))
    assert bytes(note_in[: len(msg)]) == bytes(msg)

    # READ part of the region back, at an offset.
    back = np.zeros(100, dtype=np.float64)
    back_mr = c.pd.reg_mr(back, verbs.ACCESS_LOCAL_WRITE)
    c.qp.post_read(back_mr, addr + 8 * 1000, rkey, wr_id=5)
    wc = c.one()
    assert (wc.opcode, wc.byte_len) == ("rdma_read", 800)
    assert np.array_equal(back, src[1000:1100])

    # Atomics on the counter.
    old = np.zeros(2, dtype=np.uint64)
    old_mr = c.pd.reg_mr(old, verbs.ACCESS_LOCAL_WRITE)
    counter = addr + 8 * 4096
    buf.view(np.uint64)[4096] = 40
    c.qp.post_fetch_add(old_mr, counter, rkey, add=2, wr_id=6)
    assert c.one().opcode == "fetch_add" and old[0] == 40
    c.qp.post_compare_swap(old_mr, counter, rkey, compare=42, swap=7, offset=8, wr_id=8)
    assert c.one().opcode == "comp_swap" and old[1] == 42
    assert buf.view(np.uint64)[4096] == 7

    # Counters saw the traffic.
    assert dict(c.ctx.counters())["tx_packets"] > 0
    assert dict(c.qp.stats())["tx_packets"] > 0
    t = threading.Thread(target=sconn.barrier)
    t.start()
    cconn.barrier()
    t.join()


def test_tensors_register_in_place():
    torch = pytest.importorskip("torch")
    t = torch.zeros(256, dtype=torch.bfloat16)
    s, c, _, cconn = pair(lambda s: s.pd.reg_mr(t, ALL))
    src = torch.arange(256, dtype=torch.bfloat16)
    mr = c.pd.reg_mr(src, 0)
    addr, rkey, _ = cconn.remote_buffer
    c.qp.post_write(mr, addr, rkey)
    assert c.one().ok
    assert torch.equal(t, src)


def test_remote_access_is_checked_on_every_access():
    ro = (np.arange(512) * 7 % 256).astype(np.uint8)
    want = ro.copy()
    s, c, _, cconn = pair(lambda s: s.pd.reg_mr(ro, verbs.ACCESS_REMOTE_READ))
    addr, rkey, _ = cconn.remote_buffer
    data = np.ones(64, dtype=np.uint8)
    mr = c.pd.reg_mr(data, verbs.ACCESS_LOCAL_WRITE)
    # Reading is allowed, past the end is not.
    c.qp.post_read(mr, addr + 448, rkey)
    assert c.one().ok and np.array_equal(data, want[448:])
    c.qp.post_read(mr, addr + 449, rkey)
    wc = c.one()
    assert wc.status_name == "rem_access_err" and wc.status == 10
    # The QP is now in error: later work is flushed, and the server's memory is untouched.
    assert c.qp.state == "err"
    c.qp.post_write(mr, addr, rkey)
    assert c.one().status_name == "wr_flush_err"
    assert np.array_equal(ro, want)


def test_writes_without_remote_write_and_after_dereg_are_refused():
    dst = np.zeros(64, dtype=np.uint8)
    s, c, _, cconn = pair(lambda s: s.pd.reg_mr(dst, verbs.ACCESS_LOCAL_WRITE))
    addr, rkey, _ = cconn.remote_buffer
    src = c.pd.reg_mr(np.full(64, 9, dtype=np.uint8), 0)
    c.qp.post_write(src, addr, rkey)
    assert c.one().status_name == "rem_access_err"
    assert not dst.any()

    dst2 = np.zeros(64, dtype=np.uint8)
    s, c, _, cconn = pair(lambda s: s.pd.reg_mr(dst2, ALL))
    addr, rkey, _ = cconn.remote_buffer
    src = c.pd.reg_mr(np.full(64, 9, dtype=np.uint8), 0)
    s.mr.dereg()
    with pytest.raises(InvalidArgumentError, match="deregistered"):
        s.mr.rkey
    c.qp.post_write(src, addr, rkey)
    assert c.one().status_name == "rem_access_err"
    assert not dst2.any()


def test_bad_arguments_raise_typed_errors():
    side = Side()
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        side.pd.reg_mr(np.zeros((8, 8))[:, 1], ALL)
    ro = np.zeros(8)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="read-only"):
        side.pd.reg_mr(ro, verbs.ACCESS_REMOTE_WRITE)
    assert side.pd.reg_mr(ro, verbs.ACCESS_REMOTE_READ).length == 64
    with pytest.raises(InvalidArgumentError, match="access"):
        side.pd.reg_mr(np.zeros(8), 1 << 9)
    with pytest.raises(InvalidArgumentError, match="want a numpy array"):
        side.pd.reg_mr(3.5, 0)
    mr = side.pd.reg_mr(np.zeros(8), ALL)
    with pytest.raises(InvalidArgumentError, match="exceed"):
        side.qp.post_send(mr, 60, 8)
    # A QP in RESET takes no work.
    with pytest.raises(verbs.VerbsError) as e:
        side.qp.post_send(mr)
    assert e.value.verb == "ibv_post_send" and e.value.kind == "post"
    with pytest.raises(InvalidArgumentError, match="gid"):
        side.qp.connect(5, 0, "not-an-address")
    with pytest.raises(InvalidArgumentError, match="mtu"):
        side.qp.connect(5, 0, "127.0.0.1", mtu=1000)
    with pytest.raises(InvalidArgumentError, match="retry_cnt"):
        verbs.connect("127.0.0.1:1", side.qp, retry_cnt=9)
    with pytest.raises(InvalidArgumentError, match="IP:PORT"):
        verbs.Listener("localhost")


def test_wrong_secret_is_refused_and_the_listener_keeps_serving():
    # The same secret on both sides: connected, every packet tagged.
    s, c, sconn, cconn = pair(secret=b"right")
    assert c.qp.state == "rts"
    assert sconn.auth == cconn.auth == "mac"
    s, c = Side(), Side()
    listener = verbs.Listener("127.0.0.1:0")
    got = {}

    def accept():
        try:
            got["conn"] = listener.accept(s.qp, secret=b"right", timeout=5.0, wait=20.0)
        except verbs.VerbsError as x:
            got["err"] = x

    t = threading.Thread(target=accept)
    t.start()
    # A garbled connection and a client with the wrong secret are dropped and counted.
    junk = socket.create_connection(tuple_of(listener.address))
    junk.sendall(b"\xff" * 64)
    with pytest.raises(verbs.VerbsError, match="authentication failed") as e:
        verbs.connect(listener.address, Side().qp, secret=b"wrong", timeout=5.0)
    assert e.value.kind == "peer"
    # The real client is still served, with encryption it asks for.
    cconn = verbs.connect(listener.address, c.qp, secret=b"right", timeout=5.0, auth="encrypt")
    t.join()
    junk.close()
    assert "err" not in got, got.get("err")
    assert got["conn"].auth == cconn.auth == "encrypt"
    assert listener.dropped >= 2
    # Protection without a secret is refused before anything is sent.
    with pytest.raises(InvalidArgumentError, match="needs a shared secret"):
        verbs.connect(listener.address, Side().qp, auth="mac", timeout=1.0)


def tuple_of(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


def test_dead_peer_ends_in_retry_exceeded_not_a_hang():
    s, c, _, cconn = pair(
        lambda s: s.pd.reg_mr(np.zeros(64, np.uint8), ALL), ack_timeout=8, retry_cnt=2
    )
    addr, rkey, _ = cconn.remote_buffer
    src = c.pd.reg_mr(np.ones(64, np.uint8), 0)
    del s  # the server's NIC goes away
    c.qp.post_write(src, addr, rkey)
    wc = c.one(timeout=10.0)
    assert wc.status_name == "retry_exc_err"


def test_rdma_write_example_between_two_processes():
    port = free_port()
    r = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "rdma_write.py"),
            "--cm-port",
            str(port),
            "--count",
            "300000",
            "--secret",
            "s3cret",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert "read back 1200000 B, all doubled" in r.stdout
    assert "counter is 5; done" in r.stdout


def test_qps_connect_by_hand_from_exchanged_info():
    a, b = Side(), Side()
    qpn, psn, gid, port = b.qp.info()
    assert gid == "0000:0000:0000:0000:0000:ffff:7f00:0001" and port == b.ctx.udp_port
    a.qp.connect(qpn, psn, "127.0.0.1", udp_port=port, mtu=1024)
    qpn, psn, gid, port = a.qp.info()
    b.qp.connect(qpn, psn, "::ffff:127.0.0.1", udp_port=port, mtu=1024)
    assert a.qp.state == b.qp.state == "rts"
    rx = np.zeros(3000, np.uint8)
    rx_mr = b.pd.reg_mr(rx, verbs.ACCESS_LOCAL_WRITE)
    b.qp.post_recv(rx_mr, wr_id=1)
    tx = (np.arange(3000) % 241).astype(np.uint8)
    tx_mr = a.pd.reg_mr(tx, 0)
    a.qp.post_send(tx_mr, imm=5)
    assert a.one().ok
    wc = b.one()
    assert (wc.opcode, wc.imm, wc.byte_len, wc.src_qp) == ("recv", 5, 3000, a.qp.qp_num)
    assert np.array_equal(rx, tx)
