"""RDMA verbs from Python, on Monel's software RoCEv2 NIC (the same wire format as a RoCE NIC
and Linux's rdma_rxe).

    from monel import verbs
    dev = verbs.get_device("10.0.0.1")          # or verbs.device_list()
    ctx = dev.open()                            # UDP 4791; udp_port=0 for a free port
    pd, cq = ctx.alloc_pd(), ctx.create_cq()
    buf = np.zeros(1 << 20, np.float32)
    mr = pd.reg_mr(buf, verbs.ACCESS_LOCAL_WRITE | verbs.ACCESS_REMOTE_WRITE)  # in place
    qp = pd.create_qp(cq)
    conn = verbs.Listener("10.0.0.1:18600").accept(qp, mr)   # or verbs.connect(addr, qp)
    addr, rkey, length = conn.remote_buffer
    qp.post_write(mr, addr, rkey); wc = cq.wait()[0]; assert wc.ok

Memory regions register numpy arrays, CPU torch tensors and writable buffers (bytearray,
memoryview) where they lie: the NIC reads and writes them directly, so do not touch a buffer
while an operation on it is in flight, exactly as with hardware RDMA. Keep a `MemoryRegion`
referenced until the work that names it completes: a region garbage-collected (or `dereg()`ed)
is deregistered at once, and work still naming it completes with `loc_prot_err` (or, at the
peer, `rem_access_err`), never touching freed memory. Control-path failures
raise `VerbsError` (its `verb` names the libibverbs call); data-path outcomes are
`WorkCompletion`s whose `status_name` follows `ibv_wc_status` (`success`, `rem_access_err`,
`wr_flush_err`, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from monel import _is_tensor, _u8_view
from monel._monel import (
    ACCESS_LOCAL_WRITE,
    ACCESS_REMOTE_ATOMIC,
    ACCESS_REMOTE_READ,
    ACCESS_REMOTE_WRITE,
    CompletionQueue,
    Connection,
    Context,
    Device,
    InvalidArgumentError,
    Listener,
    MemoryRegion,
    ProtectionDomain,
    QueuePair,
    VerbsError,
    WorkCompletion,
    connect,
    device_list,
    get_device,
)

__all__ = [
    "ACCESS_LOCAL_WRITE",
    "ACCESS_REMOTE_ATOMIC",
    "ACCESS_REMOTE_READ",
    "ACCESS_REMOTE_WRITE",
    "CompletionQueue",
    "Connection",
    "Context",
    "Device",
    "Listener",
    "MemoryRegion",
    "ProtectionDomain",
    "QueuePair",
    "VerbsError",
    "WorkCompletion",
    "connect",
    "device_list",
    "get_device",
]


def _byte_view(x: Any) -> Any:
    """A flat uint8 view of `x`'s memory (no copy) for registration; called by `reg_mr`."""
    if isinstance(x, np.ndarray) or _is_tensor(x):
        return _u8_view(x, "reg_mr").reshape(-1)
    try:
        m = memoryview(x)
    except TypeError:
        raise InvalidArgumentError(
            f"reg_mr: want a numpy array, a CPU tensor or a buffer, got {type(x).__name__}"
        ) from None
    if not m.c_contiguous:
        raise InvalidArgumentError("reg_mr: the buffer is not contiguous")
    return m.cast("B")
