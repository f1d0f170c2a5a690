"""Monel's transfer engine from Python: KV-cache blocks and other buffers moved between
processes by one-sided READ and WRITE, as with Mooncake's Transfer Engine or NVIDIA's NIXL.

    from monel import xfer
    decode = xfer.Agent("decode-0", "10.0.0.2", secret=job_secret)
    kv = torch.zeros(layers, blocks, block_elems)         # the decode side's KV cache
    decode.register("kv", kv)                             # in place: peers write into kv
    ...
    prefill = xfer.Agent("prefill-0", "10.0.0.1", secret=job_secret)
    prefill.register("staging", staging_tensor)
    peer = prefill.connect(decode.address)                # -> "decode-0"
    b = prefill.transfer(peer, [("write", "staging", 0, "kv", off, n)], notify=b"req-7")
    b.wait()                                              # raises if a descriptor failed
    ...
    for sender, seq, msg in decode.notifications(): ...   # each after its data is in place

Segments register numpy arrays, CPU torch tensors and writable buffers where they lie, or
`size` bytes of the agent's own (`register(name, 1 << 20)`). Do not touch a segment while a
transfer on it may run, as with any RDMA memory. Every error is typed: `UnknownSegmentError`,
`OutOfRangeError`, `PeerLostError`, `XferTimeoutError`, `DuplicateNotificationError`
(`XferError` for the rest); a failed descriptor fails alone, the batch's others complete.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from monel import _monel
from monel._monel import (
    DuplicateNotificationError,
    OutOfRangeError,
    PeerLostError,
    UnknownSegmentError,
    XferError,
    XferTimeoutError,
)
from monel.verbs import _byte_view

__all__ = [
    "Agent",
    "Batch",
    "BatchError",
    "DuplicateNotificationError",
    "OutOfRangeError",
    "PeerLostError",
    "UnknownSegmentError",
    "XferError",
    "XferTimeoutError",
]

Desc = tuple[str, str, int, str, int, int]


def _retrying(call, retry_for: float):
    """`call()`, tried again every 50 ms while it raises an engine error (a peer not up, or
    not registered, yet), for up to `retry_for` seconds."""
    end = time.monotonic() + retry_for
    while True:
        try:
            return call()
        except (XferError, PeerLostError):
            if time.monotonic() >= end:
                raise
            time.sleep(0.05)


class BatchError(XferError):
    """Some descriptors of a batch failed: `errors` holds, per descriptor, None (done) or
    the exception it failed with."""

    def __init__(self, errors: list[BaseException | None]):
        bad = [(i, e) for i, e in enumerate(errors) if e is not None]
        first = bad[0]
        super().__init__(
            f"{len(bad)} of {len(errors)} descriptors failed; "
            f"descriptor {first[0]}: {type(first[1]).__name__}: {first[1]}"
        )
        self.errors = errors


class Batch:
    """A batch in flight: `wait()` until it ends, `status()` to look without waiting."""

    def __init__(self, agent: Agent, id: int, n: int):
        self._agent, self.id, self.n = agent, id, n
        self._outcome: list[Any] | None = None

    def status(self) -> list[Any]:
        """Each descriptor's state: "pending", "done", or the exception it failed with."""
        if self._outcome is not None:
            return list(self._outcome)
        return self._agent._native.status(self.id)

    def wait(self, timeout: float = 30.0, check: bool = True) -> list[Any]:
        """Waits until every descriptor ended; returns their outcomes ("done" or an
        exception). With `check`, raises `BatchError` if any failed."""
        if self._outcome is None:
            self._outcome = self._agent._native.wait(self.id, timeout)
        if check and any(o != "done" for o in self._outcome):
            raise BatchError([None if o == "done" else o for o in self._outcome])
        return list(self._outcome)


class Agent:
    """A transfer agent: named segments, peers, batches of READs and WRITEs, notifications.

    `device` is an IP address (the soft RNIC bound to it), an interface name, or a kernel
    RDMA device's name; peers connect to `listen` (its IP and port 0 by default: the
    device's address, any port). `secret` (bytes or str) is the job's: a peer without it is
    refused, and packets carry tags keyed from it. `udp_port` is the soft RNIC's (RoCE's 4791
    to meet hardware and rxe; 0 lets several agents share one address). `transport`: the
    links this agent opens and accepts: "auto" (shared memory with a peer on this host, else
    RDMA where it works, else TCP, each fallback logged), "shm", "rdma" or "tcp". With `etcd` ("host:port" of an etcd server) the agent registers
    its name in job `job` (one agent per name and job, gone when the agent goes or dies) and
    `connect_name` finds the others.
    """

    def __init__(
        self,
        name: str,
        device: str,
        listen: str | None = None,
        secret: bytes | str | None = None,
        udp_port: int = 4791,
        timeout: float = 10.0,
        transport: str = "auto",
        etcd: str | None = None,
        job: str = "default",
    ):
        if isinstance(secret, str):
            secret = secret.encode()
        if listen is None:
            listen = f"{device}:0"
        self._native = _monel.XferAgent(
            name, device, listen, secret, udp_port, timeout, transport, etcd, job
        )
        self._keep: dict = {}

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def address(self) -> str:
        """Where peers connect: "ip:port"."""
        return self._native.address

    def register(self, name: str, memory: Any) -> None:
        """Registers segment `name`: a numpy array, CPU tensor or writable buffer in place,
        or an int: that many zeroed bytes of the agent's own."""
        if isinstance(memory, bool) or not isinstance(memory, int):
            memory = _byte_view(memory)
        self._native.register(name, memory)

    def deregister(self, name: str) -> None:
        """Withdraws segment `name` from every peer; its memory is the caller's again."""
        self._native.deregister(name)

    def write_local(self, name: str, offset: int, data: bytes) -> None:
        """Copies `data` into this agent's segment `name` at `offset`."""
        self._native.write_local(name, offset, data)

    def read_local(self, name: str, offset: int, length: int) -> bytes:
        """`length` bytes of this agent's segment `name` at `offset`."""
        return self._native.read_local(name, offset, length)

    def connect(self, address: str, retry_for: float = 0.0) -> str:
        """Connects to the agent at `address` ("ip:port"); returns its name. With
        `retry_for`, a failed connection (the peer not up yet) is tried again for that many
        seconds."""
        return _retrying(lambda: self._native.connect(address), retry_for)

    def connect_name(self, name: str, retry_for: float = 0.0) -> str:
        """Connects to the agent registered as `name` in the job (etcd). With `retry_for`, an
        agent not registered yet is looked for again for that many seconds."""
        return _retrying(lambda: self._native.connect_name(name), retry_for)

    def registered(self) -> list[str]:
        """The agents registered in the job now (etcd), by name."""
        return self._native.registered()

    def transport(self, peer: str) -> str:
        """The link `peer` is reached over: "shm", "rdma" or "tcp"."""
        return self._native.transport(peer)

    def peers(self) -> list[str]:
        """The peers that introduced themselves and are not lost."""
        return self._native.peers()

    def remote_segments(self, peer: str) -> dict:
        """What `peer` publishes: {segment name: length in bytes}."""
        return self._native.remote_segments(peer)

    def wait_for_segment(self, peer: str, name: str, timeout: float = 10.0) -> int:
        """Waits until `peer` publishes segment `name`; returns its length."""
        end = time.monotonic() + timeout
        while True:
            segs = self._native.remote_segments(peer)
            if name in segs:
                return segs[name]
            if time.monotonic() >= end:
                raise XferTimeoutError(f"{peer} published no segment {name!r} within {timeout} s")
            time.sleep(0.005)

    def transfer(
        self, peer: str, descs: Sequence[Desc], notify: bytes | str | None = None
    ) -> Batch:
        """Starts a batch with `peer`. Each descriptor is (op, local segment, local offset,
        remote segment, remote offset, length), op "read" or "write"; `notify` reaches the
        peer once every descriptor's data is in place (and only if none failed)."""
        if isinstance(notify, str):
            notify = notify.encode()
        descs = [(str(d[0]), str(d[1]), int(d[2]), str(d[3]), int(d[4]), int(d[5])) for d in descs]
        return Batch(self, self._native.transfer(peer, descs, notify), len(descs))

    def notifications(self) -> list[tuple[str, int, bytes]]:
        """Notifications received and not yet taken, oldest first: (sender, number, bytes)."""
        return self._native.notifications()

    def wait_notifications(self, n: int = 1, timeout: float = 30.0) -> list[tuple[str, int, bytes]]:
        """Waits until at least `n` notifications arrived; returns them all, oldest first."""
        got: list[tuple[str, int, bytes]] = []
        end = time.monotonic() + timeout
        while len(got) < n:
            left = end - time.monotonic()
            if left <= 0:
                raise XferTimeoutError(f"{len(got)} of {n} notifications within {timeout} s")
            got.extend(self._native.wait_notifications(left))
        return got

    def flush(self, timeout: float = 10.0) -> None:
        """Waits until every message sent to a live peer (notifications above all) was
        delivered; an agent that goes does this first."""
        self._native.flush(timeout)

    def refused(self) -> list[BaseException]:
        """What peers sent that was refused without cutting them off, as exceptions."""
        return self._native.refused()

    def __repr__(self) -> str:
        return f"xfer.Agent({self.name!r}, address={self.address!r})"
