"""Typed stub of the native module (see monel/__init__.py for the documented API)."""

from typing import Any

class MonelError(Exception):
    ranks: list[int]

class InvalidArgumentError(MonelError): ...
class MismatchError(MonelError): ...
class CommTimeoutError(MonelError): ...
class PeerLostError(MonelError): ...
class AbortedError(MonelError): ...
class BootstrapError(MonelError): ...

class Coll:
    """A collective."""

    ALL_REDUCE: Coll
    BROADCAST: Coll
    REDUCE: Coll
    ALL_GATHER: Coll
    REDUCE_SCATTER: Coll
    ALL_TO_ALL: Coll
    GATHER: Coll
    SCATTER: Coll
    BARRIER: Coll

class DType:
    """An element type; str() is the package's name for it ("float32")."""

    INT8: DType
    UINT8: DType
    INT32: DType
    UINT32: DType
    INT64: DType
    UINT64: DType
    FLOAT16: DType
    BFLOAT16: DType
    FLOAT32: DType
    FLOAT64: DType
    FLOAT8E4M3: DType
    FLOAT8E5M2: DType

class RedOp:
    """A reduction; str() is its name ("sum")."""

    SUM: RedOp
    PROD: RedOp
    MIN: RedOp
    MAX: RedOp
    AVG: RedOp

class Work:
    """An operation in flight."""

    def wait(self, timeout: float | None = None) -> bool: ...
    def is_completed(self) -> bool: ...
    def is_success(self) -> bool: ...
    @property
    def source(self) -> int | None: ...

class Comm:
    def __init__(
        self, size: int, rank: int, unique_id: str, timeout: float | None = None
    ) -> None: ...
    @staticmethod
    def from_env() -> Comm: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def paths(self) -> list[str]: ...
    def collective(
        self,
        coll: Coll,
        dtype: DType,
        count: int,
        send: Any | None,
        recv: Any,
        *,
        op: RedOp = ...,
        root: int = 0,
        async_op: bool = False,
        defer: bool = False,
    ) -> Work: ...
    def group(
        self,
        ops: list[tuple[bool, Any, int, DType, int, int]],
        *,
        async_op: bool = False,
        defer: bool = False,
    ) -> Work: ...
    def recv_from(
        self,
        buffer: Any,
        count: int,
        dtype: DType,
        src: int | None,
        tag: int,
        *,
        async_op: bool = False,
        defer: bool = False,
    ) -> Work: ...
    def monitored_barrier(
        self, timeout: float, *, wait_all: bool = False, async_op: bool = False
    ) -> Work: ...
    def set_timeout(self, seconds: float) -> None: ...
    def split(self, color: int | None, key: int = 0) -> Comm | None: ...
    def alloc_window(self, nbytes: int) -> Win: ...
    def destroy(self) -> None: ...

class Win:
    """A symmetric memory window: writable bytes through the buffer protocol."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    @property
    def shared(self) -> bool: ...
    @property
    def id(self) -> int: ...

def create_unique_id(bind: str = "127.0.0.1:0") -> str: ...

# Verbs (re-exported, with documentation, by `monel.verbs`).

ACCESS_LOCAL_WRITE: int
ACCESS_REMOTE_WRITE: int
ACCESS_REMOTE_READ: int
ACCESS_REMOTE_ATOMIC: int

class VerbsError(MonelError):
    """A verb failed; `verb` names it as libibverbs does, `kind` says why."""

    verb: str
    kind: str  # invalid_argument, modify, post, busy, not_found, unsupported, peer, io, timeout

class Device:
    """A soft RoCE device: one IP interface, or one address of it."""

    @property
    def name(self) -> str: ...
    @property
    def ifname(self) -> str: ...
    @property
    def gids(self) -> list[str]: ...
    @property
    def ips(self) -> list[str]: ...
    @property
    def state(self) -> str: ...
    @property
    def active_mtu(self) -> int: ...
    @property
    def link_mtu(self) -> int: ...
    def open(self, udp_port: int = 4791, busy_poll: bool = False, gso: bool = True) -> Context: ...

def device_list() -> list[Device]: ...
def get_device(address_or_name: str) -> Device: ...

class Context:
    """An open device: its UDP sockets and its progress thread."""

    @property
    def device_name(self) -> str: ...
    @property
    def udp_port(self) -> int: ...
    def alloc_pd(self) -> ProtectionDomain: ...
    def create_cq(self, cqe: int = 256) -> CompletionQueue: ...
    def counters(self) -> list[tuple[str, int]]: ...

class ProtectionDomain:
    def reg_mr(self, buffer: Any, access: int) -> MemoryRegion: ...
    def create_qp(
        self,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue | None = None,
        max_send_wr: int = 128,
        max_recv_wr: int = 512,
        max_inline_data: int = 256,
        sq_sig_all: bool = False,
    ) -> QueuePair: ...

class MemoryRegion:
    @property
    def addr(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def lkey(self) -> int: ...
    @property
    def rkey(self) -> int: ...
    @property
    def access(self) -> int: ...
    def dereg(self) -> None: ...

class WorkCompletion:
    wr_id: int
    status: int
    status_name: str
    opcode: str
    byte_len: int
    imm: int | None
    qp_num: int
    src_qp: int
    @property
    def ok(self) -> bool: ...

class CompletionQueue:
    def poll(self, max: int = 16) -> list[WorkCompletion]: ...
    def wait(self, n: int = 1, timeout: float = 10.0) -> list[WorkCompletion]: ...
    @property
    def capacity(self) -> int: ...
    @property
    def overflowed(self) -> bool: ...

class QueuePair:
    @property
    def qp_num(self) -> int: ...
    @property
    def state(self) -> str: ...
    def info(self) -> tuple[int, int, str, int]: ...
    def connect(
        self,
        qpn: int,
        psn: int,
        gid: str,
        udp_port: int | None = None,
        mtu: int = 1024,
        access: int | None = None,
        ack_timeout: int = 14,
        retry_cnt: int = 7,
    ) -> None: ...
    def post_recv(
        self, mr: MemoryRegion, offset: int = 0, length: int | None = None, wr_id: int = 0
    ) -> None: ...
    def post_send(
        self,
        mr: MemoryRegion,
        offset: int = 0,
        length: int | None = None,
        wr_id: int = 0,
        imm: int | None = None,
        signaled: bool = True,
    ) -> None: ...
    def post_write(
        self,
        mr: MemoryRegion,
        remote_addr: int,
        rkey: int,
        offset: int = 0,
        length: int | None = None,
        wr_id: int = 0,
        imm: int | None = None,
        signaled: bool = True,
    ) -> None: ...
    def post_read(
        self,
        mr: MemoryRegion,
        remote_addr: int,
        rkey: int,
        offset: int = 0,
        length: int | None = None,
        wr_id: int = 0,
        signaled: bool = True,
    ) -> None: ...
    def post_fetch_add(
        self,
        mr: MemoryRegion,
        remote_addr: int,
        rkey: int,
        add: int,
        offset: int = 0,
        wr_id: int = 0,
    ) -> None: ...
    def post_compare_swap(
        self,
        mr: MemoryRegion,
        remote_addr: int,
        rkey: int,
        compare: int,
        swap: int,
        offset: int = 0,
        wr_id: int = 0,
    ) -> None: ...
    def stats(self) -> list[tuple[str, int]]: ...

class Connection:
    @property
    def remote_qpn(self) -> int: ...
    @property
    def remote_gid(self) -> str: ...
    @property
    def remote_buffer(self) -> tuple[int, int, int] | None: ...
    @property
    def mtu(self) -> int: ...
    @property
    def auth(self) -> str: ...
    def barrier(self) -> None: ...

class Listener:
    def __init__(self, address: str) -> None: ...
    @property
    def address(self) -> str: ...
    @property
    def dropped(self) -> int: ...
    def accept(
        self,
        qp: QueuePair,
        mr: MemoryRegion | None = None,
        secret: bytes | None = None,
        timeout: float = 10.0,
        mtu: int = 4096,
        ack_timeout: int = 14,
        retry_cnt: int = 7,
        auth: str | None = None,
        wait: float | None = None,
    ) -> Connection: ...

def connect(
    address: str,
    qp: QueuePair,
    mr: MemoryRegion | None = None,
    secret: bytes | None = None,
    timeout: float = 10.0,
    mtu: int = 4096,
    ack_timeout: int = 14,
    retry_cnt: int = 7,
    auth: str | None = None,
) -> Connection: ...

class XferError(MonelError): ...
class UnknownSegmentError(XferError): ...
class OutOfRangeError(XferError): ...
class XferTimeoutError(XferError): ...
class DuplicateNotificationError(XferError): ...

class XferAgent:
    def __init__(
        self,
        name: str,
        device: str,
        listen: str,
        secret: bytes | None = None,
        udp_port: int = 4791,
        timeout: float = 10.0,
        transport: str = "auto",
        etcd: str | None = None,
        job: str = "default",
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    def register(self, name: str, buffer: Any) -> None: ...
    def deregister(self, name: str) -> None: ...
    def write_local(self, name: str, offset: int, data: bytes) -> None: ...
    def read_local(self, name: str, offset: int, length: int) -> bytes: ...
    def connect(self, address: str) -> str: ...
    def connect_name(self, name: str) -> str: ...
    def registered(self) -> list[str]: ...
    def transport(self, peer: str) -> str: ...
    def peers(self) -> list[str]: ...
    def remote_segments(self, peer: str) -> dict[str, int]: ...
    def transfer(
        self,
        peer: str,
        descs: list[tuple[str, str, int, str, int, int]],
        notification: bytes | None = None,
    ) -> int: ...
    def status(self, batch: int) -> list[Any]: ...
    def wait(self, batch: int, timeout: float = 30.0) -> list[Any]: ...
    def notifications(self) -> list[tuple[str, int, bytes]]: ...
    def wait_notifications(self, timeout: float = 30.0) -> list[tuple[str, int, bytes]]: ...
    def flush(self, timeout: float = 10.0) -> None: ...
    def refused(self) -> list[Any]: ...
