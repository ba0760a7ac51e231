"""Who am I and with whom: one place that resolves rank, world size and master address of a run.

Precedence: explicit arguments > torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT; the torchstage launcher sets the same ones) > a SLURM job step > an MPI launch (LSF
jsrun, PBS/PALS, Open MPI, MPICH hydra) > processes to spawn on this host (``nprocs``, env
``TORCHSTAGE_NPROC``, or one per visible GPU) > a single process. Each launcher is one object of
:mod:`torchstage.launch.environments`; :data:`ENVIRONMENTS` is the order they are asked in.
"""
import os
from dataclasses import replace
from typing import Mapping, Optional

from torchstage.launch.environments.base import check_place, check_visible_gpus, int_var
from torchstage.launch.environments.lsf import LsfEnvironment
from torchstage.launch.environments.mpi import MpiEnvironment
from torchstage.launch.environments.mpich import MpichEnvironment
from torchstage.launch.environments.openmpi import OpenMpiEnvironment
from torchstage.launch.environments.pals import PalsEnvironment
from torchstage.launch.environments.slurm import SlurmEnvironment
from torchstage.launch.environments.torchrun import TorchrunEnvironment, parse_port
from torchstage.launch.slurm import step as slurm
from torchstage.launch.slurm.checks import check_not_batch_script, check_second_launcher
from torchstage.launch.world import World

NPROC_ENV = "TORCHSTAGE_NPROC"
#: Set by the torchstage launcher in the processes it starts.
LAUNCHED_ENV = "TORCHSTAGE_LAUNCHED"
#: Set by the torchstage launcher: how often it restarted the world (0 first), and one id for every attempt.
RESTART_ENV, JOB_ID_ENV = "TORCHSTAGE_RESTART_COUNT", "TORCHSTAGE_JOB_ID"
#: ``train(max_restarts=...)``'s default, for scripts run unchanged.
MAX_RESTARTS_ENV = "TORCHSTAGE_MAX_RESTARTS"
#: MPI launchers, most specific first: jsrun and PALS also set Open MPI's or MPICH's variables.
MPI_ENVIRONMENTS = (LsfEnvironment(), PalsEnvironment(), OpenMpiEnvironment(), MpichEnvironment())
#: Launcher environments in precedence order (explicit arguments come before all, local spawn after).
ENVIRONMENTS = (TorchrunEnvironment(), SlurmEnvironment()) + MPI_ENVIRONMENTS
LAUNCHERS = tuple(e.name for e in ENVIRONMENTS)
#: Variables that decide a launch on this host, besides the launcher environments' own.
LOCAL_VARIABLES = (NPROC_ENV, "CUDA_VISIBLE_DEVICES")


def local_gpus() -> int:
    """Number of visible GPUs (``CUDA_VISIBLE_DEVICES`` respected); 0 without CUDA."""
    try:
        import torch  # inside the try: a broken torch/CUDA install counts as no GPUs
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver is a machine without GPUs
        return 0


def launched_into_world(environ: Mapping = None) -> bool:
    """True when a launcher (torchrun, a SLURM step, an MPI launch) started this process as one of several."""
    return started_by_launcher(resolve_world(environ=environ))


def started_by_launcher(world: World) -> bool:
    """True when ``world`` came from a launcher (torchrun, a SLURM step, an MPI launch) and has several ranks."""
    return world.source in LAUNCHERS and (world.is_distributed or world.spawn > 1)


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
        check_place(rank, world_size, "rank", "world_size")
        return World(rank=rank, world_size=world_size, local_rank=rank if local_rank is None else local_rank,
                     master_addr=master_addr or environ.get("MASTER_ADDR", "127.0.0.1"),
                     master_port=parse_port(master_port or environ.get("MASTER_PORT"), "master_port"),
                     source="arguments", backend=backend, why=f"rank={rank}, world_size={world_size} given")
    launched = _from_launcher(nprocs, environ, gpus, backend)
    if launched is not None:
        return launched
    check_not_batch_script(environ)
    count, source = _local_count(nprocs, environ, gpus)
    if count <= 1:
        return World(source=source if nprocs is not None else "single", backend=backend, local_size=1,
                     nnodes=1, why=f"nprocs={nprocs}" if nprocs is not None else "no launcher variables")
    return World(rank=0, world_size=count, master_addr=master_addr or "127.0.0.1",
                 master_port=parse_port(master_port, "master_port"), source=source, spawn=count, backend=backend,
                 local_size=count, nnodes=1,
                 why=f"nprocs={nprocs}" if nprocs is not None else
                 f"{NPROC_ENV}={environ[NPROC_ENV]}" if environ.get(NPROC_ENV, "").strip() else f"{gpus} visible GPUs")


def _from_launcher(nprocs, environ, gpus, backend) -> Optional[World]:
    """The World a launcher gives this process, or None when no launcher started it.

    The first environment (in :data:`ENVIRONMENTS` order) that applies decides; a SLURM step beside
    another launcher is checked so that the two cannot build mismatched worlds.
    """
    winner = next((env for env in ENVIRONMENTS if env.applies(environ)), None)
    if winner is None:
        return None
    why = f"{winner.name}: {winner.why(environ)}"
    if isinstance(winner, TorchrunEnvironment):
        step = _slurm_step_or_none(environ)
        if step is not None and step.ntasks > 1:
            inner = winner.place(environ, 0)
            check_second_launcher(environ, "torchrun", inner.rank, inner.world_size, step)
            why += f"; inside SLURM step {step.job_id}.{step.step_id} of {step.ntasks} tasks, torchrun's variables win"
    elif isinstance(winner, SlurmEnvironment):
        mpi = next((env for env in MPI_ENVIRONMENTS if env.applies(environ)), None)
        if mpi is not None:
            step = slurm.slurm_step(environ)
            rank, size = int_var(environ, mpi.rank_var), int_var(environ, mpi.size_var)
            if check_second_launcher(environ, mpi.name, rank, size, step) == "ignore-slurm":
                winner, why = mpi, f"{mpi.name}: {mpi.why(environ)}; started inside SLURM job {step.job_id}"
    per_node = isinstance(winner, (SlurmEnvironment, MpiEnvironment))  # one task per node may start several ranks
    local_devices = _local_count(nprocs, environ, gpus)[0] if per_node else gpus
    world = replace(winner.place(environ, local_devices), source=winner.name, backend=backend, why=why)
    if backend == "nccl":
        check_visible_gpus(environ, world, gpus)
    return world


def _slurm_step_or_none(environ):
    """The SLURM step around a torchrun worker, or None (its variables are not needed when torchrun decides)."""
    try:
        return slurm.slurm_step(environ)
    except ValueError:
        return None


#: The restart count the ranks of this process's world agreed on (:func:`agree_restart_attempt`): the largest of
#: theirs, for a node that joined an elastic job later counts its own restarts from 0.
_agreed_attempt = 0
#: The restart counters of a launcher (a SLURM requeue's, SLURM_RESTART_COUNT, is decided apart).
LAUNCHER_COUNTERS = ("TORCHELASTIC_RESTART_COUNT", RESTART_ENV)


def restart_attempt(environ: Mapping = None) -> int:
    """How often this job was restarted by its scheduler or launcher (SLURM requeue, ``torchrun --max-restarts``);
    0 on its first attempt. Without ``environ``, at least what the ranks of this world agreed on."""
    agreed = _agreed_attempt if environ is None else 0
    environ = os.environ if environ is None else environ
    counts = [environ.get(name, "").strip() for name in ("SLURM_RESTART_COUNT", *LAUNCHER_COUNTERS)]
    return max([agreed, *(int(count) for count in counts if count.isdigit())])


def launcher_attempt() -> int:
    """How often a launcher (torchrun, torchstage's) restarted this process's workers; a SLURM requeue not counted."""
    return restart_attempt({name: os.environ.get(name, "") for name in LAUNCHER_COUNTERS})


def set_agreed_attempt(count: int) -> None:
    """The restart count the ranks of this world agreed on (the largest of theirs, see
    :func:`~torchstage.launch.membership.agree_membership`): :func:`restart_attempt` is at least that from now on."""
    global _agreed_attempt
    _agreed_attempt = count


def job_identity(environ: Mapping = None) -> dict:
    """The ids of the job this process belongs to, kept the same by its restarts: the SLURM job, the torchrun
    run (``TORCHELASTIC_RUN_ID``) and the torchstage launch; only those that are set."""
    environ = os.environ if environ is None else environ
    names = {"slurm_job": "SLURM_JOB_ID", "torchelastic_run": "TORCHELASTIC_RUN_ID", "torchstage_job": JOB_ID_ENV}
    return {key: environ[name] for key, name in names.items() if environ.get(name, "none") != "none"}


def same_job(recorded: Mapping, now: Mapping = None):
    """True when ``recorded`` (a :func:`job_identity`) names this job, False when it names another, None when
    they share no id to tell by."""
    now = job_identity() if now is None else now
    shared = [key for key in recorded if key in now]
    if not shared:
        return None
    return all(recorded[key] == now[key] for key in shared)


def variables_read() -> tuple:
    """Every environment variable the resolution reads, launchers' first (what ``torchstage env`` shows)."""
    names = [name for env in ENVIRONMENTS for name in env.variables] + list(LOCAL_VARIABLES)
    return tuple(dict.fromkeys(names))


def detected(environ: Mapping = None) -> list:
    """``(environment, applies, why)`` for every launcher environment, in precedence order (for ``torchstage env``)."""
    environ = os.environ if environ is None else environ
    rows = []
    for env in ENVIRONMENTS:
        try:
            applies = env.applies(environ)
        except ValueError as exc:
            applies = f"error: {exc}"
        rows.append((env, applies, env.why(environ)))
    return rows


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
