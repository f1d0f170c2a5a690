"""Typed stub of the native module (see monel/__init__.py for the documented API)."""

from typing import Any, Optional

class MonelError(Exception):
    ranks: list[int]

class InvalidArgumentError(MonelError): ...
class MismatchError(MonelError): ...
class CommTimeoutError(MonelError): ...
class PeerLostError(MonelError): ...
class AbortedError(MonelError): ...
class BootstrapError(MonelError): ...

class Work:
    """An operation in flight."""

    def wait(self, timeout: Optional[float] = None) -> bool: ...
    def is_completed(self) -> bool: ...
    def is_success(self) -> bool: ...
    @property
    def source(self) -> Optional[int]: ...

class Comm:
    def __init__(
        self, size: int, rank: int, unique_id: str, timeout: Optional[float] = None
    ) -> None: ...
    @staticmethod
    def from_env() -> "Comm": ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def paths(self) -> list[str]: ...
    def collective(
        self,
        name: str,
        dtype: str,
        count: int,
        send: Optional[Any],
        recv: Any,
        op: str = "sum",
        root: int = 0,
        async_op: bool = False,
        defer: bool = False,
    ) -> Work: ...
    def group(
        self, ops: list[tuple[bool, Any, int, str, int, int]], async_op: bool = False, defer: bool = False
    ) -> Work: ...
    def recv_from(
        self,
        buffer: Any,
        count: int,
        dtype: str,
        src: Optional[int],
        tag: int,
        async_op: bool = False,
        defer: bool = False,
    ) -> Work: ...
    def monitored_barrier(
        self, timeout: float, wait_all: bool = False, async_op: bool = False
    ) -> Work: ...
    def set_timeout(self, seconds: float) -> None: ...
    def split(self, color: Optional[int], key: int = 0) -> Optional["Comm"]: ...
    def alloc_window(self, nbytes: int) -> "Win": ...
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
        recv_cq: Optional[CompletionQueue] = None,
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
    imm: Optional[int]
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
        udp_port: Optional[int] = None,
        mtu: int = 1024,
        access: Optional[int] = None,
        ack_timeout: int = 14,
        retry_cnt: int = 7,
    ) -> None: ...
    def post_recv(
        self, mr: MemoryRegion, offset: int = 0, length: Optional[int] = None, wr_id: int = 0
    ) -> None: ...
    def post_send(
        self,
        mr: MemoryRegion,
        offset: int = 0,
        length: Optional[int] = None,
        wr_id: int = 0,
        imm: Optional[int] = None,
        signaled: bool = True,
    ) -> None: ...
    def post_write(
        self,
        mr: MemoryRegion,
        remote_addr: int,
        rkey: int,
        offset: int = 0,
        length: Optional[int] = None,
        wr_id: int = 0,
        imm: Optional[int] = None,
        signaled: bool = True,
    ) -> None: ...
    def post_read(
        self,
        mr: MemoryRegion,
        remote_addr: int,
        rkey: int,
        offset: int = 0,
        length: Optional[int] = None,
        wr_id: int = 0,
        signaled: bool = True,
    ) -> None: ...
    def post_fetch_add(
        self, mr: MemoryRegion, remote_addr: int, rkey: int, add: int, offset: int = 0, wr_id: int = 0
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
    def remote_buffer(self) -> Optional[tuple[int, int, int]]: ...
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
        mr: Optional[MemoryRegion] = None,
        secret: Optional[bytes] = None,
        timeout: float = 10.0,
        mtu: int = 4096,
        ack_timeout: int = 14,
        retry_cnt: int = 7,
        auth: Optional[str] = None,
        wait: Optional[float] = None,
    ) -> Connection: ...

def connect(
    address: str,
    qp: QueuePair,
    mr: Optional[MemoryRegion] = None,
    secret: Optional[bytes] = None,
    timeout: float = 10.0,
    mtu: int = 4096,
    ack_timeout: int = 14,
    retry_cnt: int = 7,
    auth: Optional[str] = None,
) -> Connection: ...
