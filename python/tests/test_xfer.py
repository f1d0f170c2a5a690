"""The transfer engine from Python: segments registered in place from numpy arrays and torch
tensors, batched READ/WRITE checked byte for byte, notifications after the data, typed
per-descriptor errors with nothing written outside the target, a peer without the secret
refused, and the disaggregated prefill/decode example generating exactly the single-process
tokens."""

import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch
from conftest import EXAMPLES, free_port

from monel import InvalidArgumentError, PeerLostError, xfer

SECRET = "secret of the xfer tests"


def pair(n: int, secret_b: str = SECRET, transport: str = "auto"):
    """A decode-like and a prefill-like agent on their own loopback addresses."""
    a = xfer.Agent(
        f"decode-{n}", f"127.0.7.{2 * n + 1}", secret=SECRET, udp_port=0, transport=transport
    )
    b = xfer.Agent(
        f"prefill-{n}", f"127.0.7.{2 * n + 2}", secret=secret_b, udp_port=0, transport=transport
    )
    return a, b


@pytest.mark.parametrize("transport", ["rdma", "tcp", "shm"])
def test_in_place_segments_move_exact_bytes_and_notify_after_the_data(transport):
    n = {"rdma": 0, "tcp": 4, "shm": 5}[transport]
    decode, prefill = pair(n, transport=transport)
    cache = torch.zeros(8, 4096, dtype=torch.float32)  # 128 KiB, registered where it lies
    decode.register("kv", cache)
    src = np.arange(16384, dtype=np.float32).reshape(4, 4096)
    prefill.register("blocks", src)
    prefill.register("scratch", 1 << 16)
    peer = prefill.connect(decode.address)
    assert peer == f"decode-{n}"
    assert prefill.transport(peer) == transport
    assert prefill.remote_segments(peer) == {"kv": cache.numel() * 4}
    # Rows 0..3 of src into rows 2..5 of the cache, 64 descriptors of 1 KiB (coalesced).
    descs = [("write", "blocks", k * 1024, "kv", 2 * 16384 + k * 1024, 1024) for k in range(64)]
    b = prefill.transfer(peer, descs, notify=b"request 7")
    assert b.wait() == ["done"] * 64
    ((sender, seq, msg),) = decode.wait_notifications(1, timeout=10)
    assert (sender, seq, msg) == (f"prefill-{n}", 1, b"request 7")
    assert torch.equal(cache[2:6], torch.from_numpy(src))
    assert not cache[:2].any() and not cache[6:].any()
    # READ back from the cache into the agent's own segment.
    cache[7] = 3.5
    b = prefill.transfer(peer, [("read", "scratch", 0, "kv", 7 * 16384, 16384)])
    b.wait()
    got = np.frombuffer(prefill.read_local("scratch", 0, 16384), dtype=np.float32)
    assert (got == 3.5).all()


def test_bad_descriptors_fail_alone_with_typed_errors():
    decode, prefill = pair(1)
    cache = np.zeros(4096, dtype=np.uint8)
    decode.register("kv", cache)
    prefill.register("src", np.full(4096, 7, dtype=np.uint8))
    peer = prefill.connect(decode.address)
    b = prefill.transfer(
        peer,
        [
            ("write", "src", 0, "nope", 0, 16),  # unknown remote segment
            ("write", "src", 0, "kv", 4090, 16),  # runs past the cache's end
            ("write", "src", 0, "kv", 100, 16),  # fine
            ("write", "src", 4095, "kv", 0, 2),  # runs past the local segment's end
        ],
        notify=b"never",
    )
    with pytest.raises(xfer.BatchError) as e:
        b.wait()
    errs = e.value.errors
    assert isinstance(errs[0], xfer.UnknownSegmentError)
    assert isinstance(errs[1], xfer.OutOfRangeError)
    assert errs[2] is None
    assert isinstance(errs[3], xfer.OutOfRangeError)
    # Only the good descriptor's 16 bytes landed, and the failed batch sent no notification.
    assert (cache[100:116] == 7).all()
    assert cache[:100].sum() == 0 and cache[116:].sum() == 0
    with pytest.raises(InvalidArgumentError, match="read or write"):
        prefill.transfer(peer, [("copy", "src", 0, "kv", 0, 1)])
    with pytest.raises(InvalidArgumentError):
        decode.register("kv", 64)  # a segment of this name exists
    ro = np.zeros(64, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="read-only"):
        decode.register("ro", ro)
    with pytest.raises(xfer.UnknownSegmentError):
        decode.deregister("nope")
    # The agent goes on serving after all of it.
    b = prefill.transfer(peer, [("write", "src", 0, "kv", 0, 8)], notify=b"ok")
    assert b.wait() == ["done"]
    # The next notification is this one: the failed batch sent none.
    assert [m for _, _, m in decode.wait_notifications(1, timeout=10)] == [b"ok"]
    assert (cache[:8] == 7).all()


def test_a_peer_without_the_secret_is_refused_and_the_agent_goes_on():
    decode, intruder = pair(2, secret_b="not the secret")
    decode.register("kv", 4096)
    with pytest.raises(xfer.XferError, match="authentication failed"):
        intruder.connect(decode.address)
    assert decode.peers() == []
    friend = xfer.Agent("friend", "127.0.7.7", secret=SECRET, udp_port=0)
    assert friend.connect(decode.address) == "decode-2"
    with pytest.raises(PeerLostError):
        friend.transfer("someone-else", [])


@pytest.mark.parametrize("transport", ["rdma", "tcp", "shm"])
def test_the_disaggregated_example_generates_exactly_the_single_process_tokens(transport):
    r = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "kv_disagg.py"),
            "--port",
            str(free_port()),
            "--transport",
            transport,
            "--requests",
            "4",
            "--dim",
            "128",
            "--layers",
            "2",
            "--heads",
            "4",
            "--min-prompt",
            "20",
            "--max-prompt",
            "90",
            "--new-tokens",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4/4 requests generated exactly the single-process tokens" in r.stdout, r.stdout
    assert r.stdout.count("tokens equal") == 4, r.stdout
    assert f"over {transport}" in r.stdout, r.stdout


def test_agents_meet_by_name_through_a_real_etcd():
    etcd = shutil.which("etcd")
    assert etcd, "etcd is needed: Debian's etcd-server (scripts/test.sh installs it)"
    client, peer = free_port(), free_port()
    with tempfile.TemporaryDirectory() as d:
        url, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        p = subprocess.Popen(
            [
                etcd,
                "--name",
                "t",
                "--data-dir",
                d,
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                purl,
                "--initial-advertise-peer-urls",
                purl,
                "--initial-cluster",
                f"t={purl}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ep = f"127.0.0.1:{client}"
            end = time.monotonic() + 20
            while True:
                try:
                    decode = xfer.Agent(
                        "decode-e", "127.0.7.21", secret=SECRET, udp_port=0, etcd=ep, job="py"
                    )
                    break
                except xfer.XferError:
                    assert time.monotonic() < end, "etcd did not start"
                    time.sleep(0.2)
            prefill = xfer.Agent(
                "prefill-e", "127.0.7.22", secret=SECRET, udp_port=0, etcd=ep, job="py"
            )
            assert prefill.connect_name("decode-e") == "decode-e"
            assert sorted(prefill.registered()) == ["decode-e", "prefill-e"]
            with pytest.raises(InvalidArgumentError):
                xfer.Agent("decode-e", "127.0.7.23", secret=SECRET, udp_port=0, etcd=ep, job="py")
            del decode
            with pytest.raises(PeerLostError, match="no agent named"):
                prefill.connect_name("decode-e")
        finally:
            p.kill()
            p.wait()
