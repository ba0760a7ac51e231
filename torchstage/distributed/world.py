"""Entering a world: spawn local workers, or join the process group this process belongs to.

:func:`run_in_world` is the one way in, for ``train()`` and :func:`distributed_cmd_run` alike.

Workers are started by running this program's command line again with the torchrun variables set
(see :mod:`torchstage.distributed.local_launcher`); each worker then finds itself inside the world and trains.
The launching process never trains: it waits for the workers and exits with their exit code.
"""
import contextlib
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from torchstage.distributed.engine import Engine
from torchstage.distributed.env import LAUNCHED_ENV, World, resolve_world, started_by_launcher
from torchstage.distributed.local_launcher import Launcher, relaunch_command, watch_parent
from torchstage.logging_setup import ensure_console_handler

logger = logging.getLogger("torchstage")


def in_world() -> bool:
    """True when a torch.distributed process group is initialised in this process."""
    return dist.is_available() and dist.is_initialized()


def launch_and_exit(world: World) -> None:
    """Run ``world.spawn`` workers of this program and end this process with their exit code.

    Raises ``SystemExit(0)`` when all succeed, else ``SystemExit(code of the first failing rank)``: code
    after the launching call runs only in the workers, never here with an untrained model.
    """
    ensure_console_handler()
    command = relaunch_command()
    logger.info("starting %d processes (%s, ranks %d-%d of %d): %s", world.spawn, world.backend, world.rank,
                world.rank + world.spawn - 1, world.world_size, " ".join(command))
    raise SystemExit(Launcher(command, world).run())


@contextlib.contextmanager
def joined(world: World, timeout=None):
    """Initialise this rank's process group for the block; destroy it when the block succeeds.

    ``timeout`` (a ``timedelta``, None: torch's default) ends a collective that waits longer for a peer.

    A failing block leaves the group alone: the process is about to exit and the launcher stops the
    other ranks, so nobody waits on a collective with a dead peer.
    """
    if os.environ.get(LAUNCHED_ENV):
        watch_parent()
    os.environ.setdefault("LOCAL_RANK", str(world.local_rank))  # MPI launchers set none; current_engine reads it
    if world.backend == "nccl":
        torch.cuda.set_device(world.local_rank)
    kwargs = {} if timeout is None else {"timeout": timeout}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        kwargs["store"] = _attempt_store(world, timeout)
    else:
        kwargs["init_method"] = f"tcp://{world.master_addr}:{world.master_port}"
    dist.init_process_group(world.backend, rank=world.rank, world_size=world.world_size, **kwargs)
    yield
    dist.destroy_process_group()


def _attempt_store(world: World, timeout):
    """The torchrun agent's store, namespaced by restart attempt.

    After ``--max-restarts`` the agent's store still holds the previous attempt's gloo addresses; a
    restarted rank would dial a dead peer ("connectFullMesh ... Connection refused") without a prefix.
    """

    store = dist.TCPStore(world.master_addr, world.master_port, world.world_size, is_master=False,
                          timeout=max(timeout or timedelta(0), timedelta(minutes=5)))  # a slow start is no hang
    return dist.PrefixStore(f"torchstage/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def current_engine(strategy=None) -> Engine:
    """The engine of this rank in the initialised process group (device: its GPU under NCCL, else CPU)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    return Engine(device=device, rank=rank, world_size=world_size, local_rank=local_rank, strategy=strategy)


def run_in_world(fn, distributed=True, nprocs: int = None, timeout=None):
    """Call ``fn()`` as this process's rank of the world it belongs to, entering that world first.

    Already in an initialised process group: calls ``fn`` here. ``distributed=False``: calls ``fn`` as
    one process. Otherwise the world is resolved once (:func:`~torchstage.distributed.env.resolve_world`):
    with processes to start on this host (only with ``distributed=True``, or when a SLURM task spawns
    one per device) they are launched and this process exits with their code (``SystemExit``); as one
    rank of several, the process group is joined around ``fn`` with collective ``timeout`` (a ``timedelta``;
    None: torch's default). ``distributed=None`` enters only a world that a launcher (torchrun, a SLURM step, mpirun...)
    started this process into; a plain script runs as one process.
    """
    if in_world() or distributed is False:
        return fn()
    world = resolve_world(nprocs)
    if distributed is None and not started_by_launcher(world):
        return fn()
    if world.spawn:
        launch_and_exit(world)
    if not world.is_distributed:
        return fn()
    with joined(world, timeout):
        return fn()



def distributed_cmd_run(fn, *args, distributed: bool = True, nprocs: int = None, **kwargs):
    """Run ``fn(*args, **kwargs)`` on every process of the world this program should form.

    Inside a world (torchrun, a launched worker, a SLURM step): joins it and calls ``fn``. A plain
    script with several devices (GPUs, or ``nprocs``/``TORCHSTAGE_NPROC`` on CPU): starts one worker
    per device running this program again, waits, and exits with their code (``SystemExit``), so code
    after this call never runs in the launching process. Otherwise (one device, or
    ``distributed=False``) calls ``fn`` here. ``train(...)`` calls inside ``fn`` use the world.
    """
    return run_in_world(lambda: fn(*args, **kwargs), bool(distributed), nprocs)
