"""The world of one process: its place among the run's processes and how they meet, as one record.

Every launcher environment answers with a :class:`World`; :func:`~torchstage.launch.enter.run_in_world`
hands the world it entered to what runs in it, and the engine is built from it. It is the only record of
a process's rank: environment variables are written for child processes only, never read back.
"""
from dataclasses import dataclass, field, fields, replace
from typing import Optional


@dataclass(frozen=True)
class World:
    """The distributed world of this process, or of the processes it must spawn (``spawn > 0``).

    ``spawn == 0``: this process *is* rank ``rank`` of ``world_size`` and trains here (``world_size == 1``
    is a plain single-process run). ``spawn == n > 0``: this process is a launcher; it starts ``n``
    local processes with global ranks ``rank .. rank + n - 1`` (``rank`` = node index x n), each
    :meth:`child` of this world. ``master_port`` is ``None`` when the launcher is to pick a free port;
    ``local_size`` and ``nnodes`` are ``None`` where the launcher does not say.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None
    source: str = "single"  # 'arguments' | a launcher environment's name | 'local' | 'single' | 'process group'
    spawn: int = 0
    backend: str = "gloo"  # 'nccl' when the processes use GPUs
    node_rank: int = 0
    local_size: Optional[int] = None  # processes on this node
    nnodes: Optional[int] = None
    why: str = field(default="", compare=False)  # the variables or arguments that decided

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def device_type(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"

    def child(self, local_rank: int) -> "World":
        """The world of local process ``local_rank`` that this launcher world spawns."""
        if not 0 <= local_rank < self.spawn:
            raise ValueError(f"local_rank must be in [0, {self.spawn}), got {local_rank}")
        return replace(self, rank=self.rank + local_rank, local_rank=local_rank, local_size=self.spawn,
                       spawn=0)

    def __str__(self) -> str:
        width = max(len(f.name) for f in fields(self))
        return "\n".join(f"{f.name:<{width}}  {getattr(self, f.name)}" for f in fields(self))
