"""Entering a world: spawn local workers, or join the process group this process belongs to.

:func:`run_in_world` is the one way in, for ``train()`` and :func:`distributed_cmd_run` alike; it hands the
:class:`~torchstage.launch.world.World` it entered to the function it runs.

Workers run this program again with the torchrun variables set, forked from a preloaded process or in fresh
interpreters (see :mod:`torchstage.launch.rank_start` and :mod:`torchstage.launch.local_launcher`); each worker
then finds itself inside the world and trains. The launching process never trains: it waits for the workers and
exits with their exit code.
"""
import contextlib
import faulthandler
import logging
import math
import os
from datetime import timedelta
from numbers import Real

import torch
import torch.distributed as dist

from torchstage.arguments import ArgumentError
from torchstage.launch import startup_watch
from torchstage.launch.local_launcher import relaunch_command, watch_parent
from torchstage.launch.rank_start import check_start, rank_start
from torchstage.launch.resolve import LAUNCHED_ENV, local_gpus, resolve_world, started_by_launcher
from torchstage.launch.restarts import check_max_restarts, supervise
from torchstage.launch.script_seed import SEED_ENV, launch_seed, seeded_command
from torchstage.launch.world import World
from torchstage.logging_setup import ensure_console_handler

logger = logging.getLogger("torchstage")
#: The world whose process group :func:`joined` initialised, while it is initialised.
_joined = None
#: The process group's collective timeout is ``hang_timeout`` plus this: the watchdog, which names the rank
#: and shows its stack, speaks first; the group's timeout ends collectives no watchdog watches.
GROUP_TIMEOUT_MARGIN = 60.0


def in_world() -> bool:
    """True when a torch.distributed process group is initialised in this process."""
    return dist.is_available() and dist.is_initialized()


def current_world() -> World:
    """The world of this process's initialised process group (the one joined here, or one the user initialised);
    a single process when there is none."""
    if not in_world():
        return World()
    if _joined is not None:
        return _joined
    rank, size = dist.get_rank(), dist.get_world_size()
    try:  # the launcher's own variables, where they describe this group
        resolved = resolve_world()
        local_rank = resolved.local_rank if (resolved.rank, resolved.world_size) == (rank, size) else None
    except ValueError:
        local_rank = None
    if local_rank is None:
        local_rank = rank % max(1, local_gpus())
    return World(rank=rank, world_size=size, local_rank=local_rank, source="process group",
                 backend=dist.get_backend(), why="a process group initialised before train()")


def launch_and_exit(world: World, max_restarts: int = 0, start: str = None, preload=()) -> None:
    """Run ``world.spawn`` workers of this program and end this process with their exit code; after a failure
    start the world again, at most ``max_restarts`` times (see :mod:`torchstage.launch.restarts`).

    Raises ``SystemExit(0)`` when all succeed, else ``SystemExit(code of the failure)``: code after the
    launching call runs only in the workers, never here with an untrained model. The workers run the program
    from its first line, seeded by :mod:`~torchstage.launch.seeded_entry` so that data built at module level agrees
    across ranks; ``start`` says how they start (:func:`~torchstage.launch.rank_start.check_start`: forked from a
    preloaded process, the default, or ``"fresh"`` interpreters), ``preload`` names modules the preloaded process
    imports for them.
    """
    command = relaunch_command()
    starter = rank_start(command, start, preload)  # first: a preloaded process is a copy of this one as it is now
    try:
        ensure_console_handler()
        os.environ.setdefault(SEED_ENV, str(launch_seed(world)))
        restarts = f", up to {max_restarts} restart(s)" if max_restarts else ""
        how = (f"in fresh interpreters ({starter.why})" if starter.kind != "preloaded"
               else "forked from a preloaded process" + (f" (a fresh interpreter: this one cannot be forked: "
                                                         f"{starter.why})" if starter.why else ""))
        logger.info("starting %d process%s (%s, ranks %d-%d of %d%s) %s: %s", world.spawn,
                    "es" if world.spawn > 1 else "", world.backend, world.rank, world.rank + world.spawn - 1,
                    world.world_size, restarts, how, " ".join(command))
        code = supervise(seeded_command(command), world, max_restarts, starter)
    finally:
        starter.close()
    raise SystemExit(code)


def check_hang_timeout(value, name: str = "timeout"):
    """``value`` as seconds (a float > 0), or None when disabled (None or 0); an ArgumentError otherwise."""
    if value is None or (isinstance(value, Real) and not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < math.inf:
        raise ArgumentError(name, f"must be a number of seconds > 0, or None/0 to disable hang detection, "
                                  f"got {value!r}")
    return float(value)


def process_group_timeout(hang_timeout):
    """The ``timedelta`` a run's process group gets for ``hang_timeout`` (None: torch's default)."""
    seconds = check_hang_timeout(hang_timeout, "hang_timeout")
    return None if seconds is None else timedelta(seconds=seconds + GROUP_TIMEOUT_MARGIN)


@contextlib.contextmanager
def joined(world: World, timeout=None):
    """Initialise this rank's process group for the block; destroy it when the block succeeds.

    ``timeout`` (a ``timedelta``, None: torch's default) ends a collective that waits longer for a peer.

    A failing block leaves the group alone: the process is about to exit and the launcher stops the
    other ranks, so nobody waits on a collective with a dead peer.
    """
    global _joined
    if os.environ.get(LAUNCHED_ENV):
        watch_parent()
    if not faulthandler.is_enabled():  # a rank that dies inside gloo/NCCL (SIGABRT) shows where its Python was
        faulthandler.enable(all_threads=True)
    if world.backend == "nccl":
        torch.cuda.set_device(world.local_rank)
    kwargs = {} if timeout is None else {"timeout": timeout}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        kwargs["store"] = _attempt_store(world, timeout)
    else:
        kwargs["init_method"] = f"tcp://{world.master_addr}:{world.master_port}"
    dist.init_process_group(world.backend, rank=world.rank, world_size=world.world_size, **kwargs)
    startup_watch.phase("preparing the run")
    _joined = world
    yield world
    _joined = None
    dist.destroy_process_group()


def _attempt_store(world: World, timeout):
    """The torchrun agent's store, namespaced by restart attempt.

    After ``--max-restarts`` the agent's store still holds the previous attempt's gloo addresses; a
    restarted rank would dial a dead peer ("connectFullMesh ... Connection refused") without a prefix.
    """

    store = dist.TCPStore(world.master_addr, world.master_port, world.world_size, is_master=False,
                          timeout=max(timeout or timedelta(0), timedelta(minutes=5)))  # a slow start is no hang
    return dist.PrefixStore(f"torchstage/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def run_in_world(fn, distributed=True, nprocs: int = None, timeout=None, max_restarts: int = 0, hang_timeout=None,
                 check=None, start: str = None, preload=()):
    """Call ``fn(world)`` as this process's rank of the world it belongs to, entering that world first.

    Already in an initialised process group: calls ``fn`` here with that group's world. ``distributed=False``:
    calls ``fn`` as one process. Otherwise the world is resolved once
    (:func:`~torchstage.launch.resolve.resolve_world`): with processes to start on this host (only with
    ``distributed=True``, or when a SLURM task spawns one per device) they are launched and this process exits
    with their code (``SystemExit``); as one rank of several, the process group is joined around ``fn`` with
    collective ``timeout`` (a ``timedelta``; None: torch's default). ``distributed=None`` enters only a world that
    a launcher (torchrun, a SLURM step, mpirun...) started this process into; a plain script runs as one process.

    ``max_restarts > 0``: the processes this call starts are started again after a failure (a single process
    too: it then runs as the one worker of a launcher that watches it); a world another launcher started
    restarts by that launcher's rules (``torchrun --max-restarts``, ``sbatch --requeue``).

    ``hang_timeout`` (seconds; None: not watched): as one rank of several, a start-up that makes no progress for
    that long, from here to ``fn``'s first step, ends the job (:mod:`~torchstage.launch.startup_watch`).

    ``check(world)``, when given, is called with the world of each process about to be started, in the launching
    process before any starts, and with this rank's world before its process group forms: a configuration that
    cannot work in that world (a mesh that does not divide it) raises there, once, before any rank starts.
    ``start`` and ``preload``: how the processes this call starts are made (:func:`launch_and_exit`).
    """
    if in_world():
        with startup_watch.watching(hang_timeout, current_world(), "preparing the run"):
            return fn(current_world())
    ours = bool(os.environ.get(LAUNCHED_ENV))  # a worker of torchstage's launcher: that launcher restarts it
    max_restarts = 0 if ours else max_restarts
    world = World(why="distributed=False") if distributed is False else resolve_world(nprocs)
    launched = distributed is not False and started_by_launcher(world)  # torchrun, a SLURM step, mpirun...
    if max_restarts and launched and not world.spawn:
        logger.warning("max_restarts=%d applies to the processes torchstage starts; this one was started by %s, "
                       "whose own rules restart it (torchrun --max-restarts=N, sbatch --requeue)", max_restarts,
                       world.source)
        max_restarts = 0
    if not launched and not (distributed is True and world.spawn):  # this process runs alone
        if not max_restarts:
            return fn(World(backend=world.backend, why=world.why if distributed is True else
                            f"distributed={distributed}, no launcher started this process ({world.why})"))
        world = World(world_size=1, spawn=1, local_size=1, nnodes=1, backend=world.backend,
                      why=f"one process, watched by a launcher for max_restarts={max_restarts}")
    if max_restarts and world.spawn and (world.nnodes or 1) > 1:
        raise ValueError(f"max_restarts={max_restarts}: restarts inside the job need its processes on one node, "
                         f"and this {world.source} world spans {world.nnodes} nodes; restart across nodes with "
                         f"sbatch --requeue (train(requeue=True)) or torchrun --max-restarts with a rendezvous "
                         f"backend")
    if world.spawn:
        if check is not None:
            check(world.child(0))  # each worker's world has the same size and node size
        launch_and_exit(world, max_restarts, start, preload)
    if not world.is_distributed:
        return fn(world)
    if check is not None:
        check(world)
    with startup_watch.watching(hang_timeout, world), joined(world, timeout) as entered:
        return fn(entered)


def distributed_cmd_run(fn, *args, distributed: bool = True, nprocs: int = None, max_restarts: int = None,
                        start_method: str = None, **kwargs):
    """Run ``fn(*args, **kwargs)`` on every process of the world this program should form.

    Inside a world (torchrun, a launched worker, a SLURM step): joins it and calls ``fn``. A plain
    script with several devices (GPUs, or ``nprocs``/``TORCHSTAGE_NPROC`` on CPU): starts one worker
    per device running this program again, waits, and exits with their code (``SystemExit``), so code
    after this call never runs in the launching process. Otherwise (one device, or
    ``distributed=False``) calls ``fn`` here. ``train(...)`` calls inside ``fn`` use the world.
    ``max_restarts`` (default ``$TORCHSTAGE_MAX_RESTARTS``, else 0): start the world again after a rank fails,
    at most that often (see :func:`run_in_world`). ``start_method`` (default ``$TORCHSTAGE_START``, else
    ``"preloaded"``): the workers are forked from a process that imported torch once, or ``"fresh"`` interpreters.
    """
    return run_in_world(lambda world: fn(*args, **kwargs), bool(distributed), nprocs,
                        max_restarts=check_max_restarts(max_restarts), start=check_start(start_method, "start_method"))
