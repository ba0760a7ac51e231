"""Who am I and with whom: one place that resolves rank, world size and master address of a run.

Precedence: explicit arguments > torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT; the torchstage launcher sets the same ones) > a SLURM job step > processes to spawn on
this host (``nprocs``, env ``TORCHSTAGE_NPROC``, or one per visible GPU) > a single process.
"""
import os
from dataclasses import dataclass, fields
from typing import Mapping, Optional

NPROC_ENV = "TORCHSTAGE_NPROC"
#: Set by the torchstage launcher in the processes it starts.
LAUNCHED_ENV = "TORCHSTAGE_LAUNCHED"


@dataclass(frozen=True)
class World:
    """The distributed world of this process, or of the processes it must spawn (``spawn > 0``).

    ``spawn == 0``: this process *is* rank ``rank`` of ``world_size`` and trains here (``world_size == 1``
    is a plain single-process run). ``spawn == n > 0``: this process is a launcher; it starts ``n``
    local processes with global ranks ``rank .. rank + n - 1`` (``rank`` = node index x n).
    ``master_port`` is ``None`` when the launcher is to pick a free port.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None
    source: str = "single"  # 'arguments' | 'torchrun' | 'slurm' | 'local' | 'single'
    spawn: int = 0
    backend: str = "gloo"  # 'nccl' when the processes use GPUs

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def device_type(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"

    def __str__(self) -> str:
        width = max(len(f.name) for f in fields(self))
        return "\n".join(f"{f.name:<{width}}  {getattr(self, f.name)}" for f in fields(self))


def local_gpus() -> int:
    """Number of visible GPUs (``CUDA_VISIBLE_DEVICES`` respected); 0 without CUDA."""
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver is a machine without GPUs
        return 0


def launched_into_world(environ: Mapping = None) -> bool:
    """True when torchrun or a SLURM job step started this process as one of a world of several."""
    world = resolve_world(environ=environ)
    return world.source in ("torchrun", "slurm") and (world.is_distributed or world.spawn > 1)


def resolve_world(nprocs: Optional[int] = None, environ: Mapping = None, *, rank: int = None,
                  world_size: int = None, local_rank: int = None, master_addr: str = None,
                  master_port: int = None, gpus: int = None) -> World:
    """Resolve the world once; raise ValueError naming the setting when it cannot work.

    ``nprocs`` is the number of processes to start on this host when no world exists yet;
    ``rank``/``world_size`` (and friends) state this process's place explicitly. ``gpus`` overrides
    the visible-GPU count (for tests and ``torchstage env``).
    """
    environ = os.environ if environ is None else environ
    gpus = local_gpus() if gpus is None else gpus
    backend = "nccl" if gpus else "gloo"
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError(f"give both rank and world_size explicitly, got rank={rank!r}, world_size={world_size!r}")
        _check_place(rank, world_size, "rank", "world_size")
        return World(rank=rank, world_size=world_size, local_rank=rank if local_rank is None else local_rank,
                     master_addr=master_addr or environ.get("MASTER_ADDR", "127.0.0.1"),
                     master_port=_port(master_port or environ.get("MASTER_PORT"), "master_port"),
                     source="arguments", backend=backend)
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return _from_torchrun(environ, backend)
    count, source = _local_count(nprocs, environ, gpus)
    slurm = _from_slurm(environ, count, backend)
    if slurm is not None:
        return slurm
    if count <= 1:
        return World(source=source if nprocs is not None else "single", backend=backend)
    return World(rank=0, world_size=count, master_addr=master_addr or "127.0.0.1",
                 master_port=_port(master_port, "master_port"), source=source, spawn=count, backend=backend)


def _from_torchrun(environ, backend) -> World:
    rank, world_size = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    _check_place(rank, world_size, "RANK", "WORLD_SIZE")
    local_rank = _int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank
    if world_size > 1 and ("MASTER_ADDR" not in environ or "MASTER_PORT" not in environ):
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world_size} are set but MASTER_ADDR/MASTER_PORT are not; "
                         f"set both (torchrun does) so the processes can meet")
    return World(rank=rank, world_size=world_size, local_rank=local_rank,
                 master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
                 master_port=_port(environ.get("MASTER_PORT"), "MASTER_PORT"), source="torchrun", backend=backend)


def _from_slurm(environ, local_devices: int, backend: str) -> Optional[World]:
    """SLURM PLUG-IN POINT: the World of a SLURM job step task, or None outside a step.

    ``local_devices`` is what one node offers: visible GPUs, or on CPU ``nprocs``/TORCHSTAGE_NPROC
    (so one task per node spawns that many processes). Layout, address and port rules live in
    :mod:`torchstage.distributed.slurm`.
    """
    try:
        from torchstage.distributed import slurm
    except ImportError:  # a build without SLURM support
        return None
    step = slurm.slurm_step(environ)
    if step is None:
        return None
    layout = slurm.slurm_world(step, local_devices)
    return World(rank=layout.rank, world_size=layout.world_size, local_rank=layout.local_rank,
                 master_addr=slurm.master_addr(step, environ), master_port=slurm.master_port(step.job_id, environ),
                 source="slurm", spawn=layout.spawn_local, backend=backend)


def _local_count(nprocs, environ, gpus):
    """How many processes to run on this host, and where that number came from."""
    if nprocs is not None:
        if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
            raise ValueError(f"nprocs must be an integer >= 1, got {nprocs!r}")
        count, source, name = nprocs, "arguments", f"nprocs={nprocs}"
    elif environ.get(NPROC_ENV, "").strip():
        count, source, name = _int(environ, NPROC_ENV), "local", f"{NPROC_ENV}={environ[NPROC_ENV]}"
        if count < 1:
            raise ValueError(f"{NPROC_ENV} must be an integer >= 1, got {environ[NPROC_ENV]!r}")
    else:
        return gpus, "local"
    if gpus and count > gpus:
        raise ValueError(f"{name} asks for {count} processes but only {gpus} GPU(s) are visible; one process "
                         f"per GPU is the limit (use CUDA_VISIBLE_DEVICES to choose GPUs)")
    return count, source


def _int(environ, name) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {environ[name]!r}") from None


def _port(value, name) -> Optional[int]:
    if value is None or value == "":
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise ValueError(f"{name} must be a TCP port number 1-65535, got {value!r}")
    return port


def _check_place(rank, world_size, rank_name, size_name) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"{rank_name}={rank} and {size_name}={world_size} do not form a world: expected "
                         f"{size_name} >= 1 and 0 <= {rank_name} < {size_name}")
