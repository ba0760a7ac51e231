"""The probes of the pre-flight check, each timed on one rank: matmul throughput, host-memory bandwidth, a
two-rank exchange, and an all-reduce over the world. On a GPU the matmul runs on it and the collectives on NCCL.

The matmul and memory probes run for a fixed time rather than a fixed amount of work: every rank starts them
together and stops together, so ranks that share a machine (or a core) are measured over the same seconds.
"""
import statistics
import time

import torch
import torch.distributed as dist

#: Matmul size and dtype: small enough for one CPU thread to finish one in about a millisecond; on a GPU, large
#: enough to keep it busy, in bfloat16 where it has it.
CPU_MATMUL, GPU_MATMUL = 256, 4096
#: Bytes of the host-memory copy (larger than a CPU's caches), of each exchange and of the all-reduce.
MEMORY_BYTES = 64 * 2**20
CPU_MESSAGE, GPU_MESSAGE = 2 * 2**20, 64 * 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul(device: torch.device, seconds: float) -> float:
    """Matmul throughput on ``device`` in GFLOP/s, over about ``seconds``."""
    cuda = device.type == "cuda"
    n = GPU_MATMUL if cuda else CPU_MATMUL
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.mm(a, b, out=out)
    _sync(device)
    chunk, count = (10 if cuda else 1), 0
    start = time.perf_counter()
    while True:
        for _ in range(chunk):
            torch.mm(a, b, out=out)
        _sync(device)
        count += chunk
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * n ** 3 * count / elapsed / 1e9


class HostMemory:
    """Host-memory bandwidth: copies of a buffer larger than the caches (GB/s counting what is read and written).
    The buffers are made once and reused by each :meth:`probe`."""

    def __init__(self, nbytes: int = MEMORY_BYTES):
        self.src = torch.ones(nbytes // 4, dtype=torch.float32)
        self.dst = torch.empty_like(self.src)
        self.dst.copy_(self.src)

    def probe(self, seconds: float) -> float:
        count, start = 0, time.perf_counter()
        while True:
            self.dst.copy_(self.src)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return 2 * self.src.numel() * 4 * count / elapsed / 1e9


def message_bytes(device: torch.device) -> int:
    """The size of one exchange or all-reduce on ``device``."""
    return GPU_MESSAGE if device.type == "cuda" else CPU_MESSAGE


def exchange(peer: int, device: torch.device, times: int = 2) -> float:
    """Bandwidth (GB/s, both directions counted) of simultaneous sends and receives with ``peer``, which runs the
    same call: the median of ``times`` timed exchanges, after one untimed."""
    nbytes = message_bytes(device)
    send = torch.ones(nbytes // 4, device=device)
    receive = torch.empty_like(send)
    seconds = []
    for index in range(times + 1):
        start = time.perf_counter()
        ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, receive, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        _sync(device)
        if index:
            seconds.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(seconds) / 1e9


def all_reduce(device: torch.device, times: int = 5) -> float:
    """Bus bandwidth (GB/s, as nccl-tests count it) of an all-reduce over the whole world: the median of ``times``
    timed all-reduces, after one untimed."""
    nbytes, size = message_bytes(device), dist.get_world_size()
    tensor = torch.ones(nbytes // 4, device=device)
    dist.all_reduce(tensor)
    _sync(device)
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return nbytes / statistics.median(seconds) / 1e9 * 2 * (size - 1) / size


def rounds(nodes: dict, max_rounds: int = 8) -> list:
    """Which ranks exchange in each round: lists of disjoint ``(rank, rank)`` pairs. ``nodes`` maps each node to its
    ranks (in order). With several nodes, each round pairs whole nodes (round-robin, so every pair of nodes meets,
    within ``max_rounds``), rank i of one with rank i of the other: the links between nodes. On one node, its
    ranks meet each other (at most 3 rounds)."""
    names = list(nodes)
    if len(names) == 1:
        return _round_robin(list(nodes[names[0]]))[:min(3, max_rounds)]
    found = []
    for pairing in _round_robin(names)[:max_rounds]:
        found.append([pair for a, b in pairing for pair in zip(nodes[a], nodes[b])])
    return found


def _round_robin(items: list) -> list:
    """Every pair of ``items`` once, as rounds of disjoint pairs (the circle method; with an odd count one item sits
    out of each round)."""
    items = list(items) + ([None] if len(items) % 2 else [])
    n, found = len(items), []
    for _ in range(n - 1):
        pairs = [(items[i], items[n - 1 - i]) for i in range(n // 2)]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if pairs:
            found.append(pairs)
        items = [items[0], items[-1], *items[1:-1]]
    return found
