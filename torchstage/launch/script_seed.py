"""The seed of module-level code on every rank: the same on all ranks of a world, whichever launcher started it.

The workers torchstage starts run the program through :mod:`torchstage.launch.seeded_entry`, which seeds every
generator with :data:`SEED_ENV` before the program's first line. A rank another launcher started (torchrun, a
SLURM step, mpirun/mpiexec) is seeded when it imports torchstage (:func:`seed_launched_rank`), with
:data:`SEED_ENV` or a seed derived from an id every rank of the job reads alike (:func:`launched_seed`). So the
tutorial's module-level ``torch.rand`` made after ``import torchstage`` is the same data on every rank.
"""
import logging
import os
import sys
import zlib
from typing import Mapping, Optional

import torch

from torchstage.rng import set_seed

#: The seed of the workers' module-level code, set by the launcher (a user's value is kept).
SEED_ENV = "TORCHSTAGE_SCRIPT_SEED"
ENTRY = "torchstage.launch.seeded_entry"
#: The seed of a launched world whose launcher names no job (MPICH's hydra across hosts without a scheduler).
FIXED_SEED = 42
#: A scheduler's job id, which every rank of the job reads alike whichever launcher runs inside it, and which
#: survives requeues and elastic joins: the seed comes from the first one set, else from the launcher's own id.
JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
logger = logging.getLogger("torchstage")
#: The seed this process's module-level code was seeded with (None: not seeded), recorded in checkpoints' meta.
_applied = None


def launch_seed(world) -> int:
    """The seed the workers of ``world`` start with: the launching process's own torch seed, so the workers draw
    what it drew; across nodes (one launcher per node) one derived from the shared master address and port."""
    if (world.nnodes or 1) > 1:
        return zlib.crc32(f"{world.master_addr}:{world.master_port}".encode())
    return torch.initial_seed()


def seeded_command(command: list) -> list:
    """``command`` (this interpreter's command line, see :func:`relaunch_command`) started through this entry;
    ``command`` unchanged where this program's command line cannot be told apart from the interpreter's options."""
    split = program_of(command)
    if split is None:
        return command
    options, program = split
    return [command[0], *options, "-m", ENTRY, *program]


def program_of(command: list):
    """``(interpreter options, program)`` of ``command`` (this interpreter's command line): the program is
    ``[script, args...]``, ``["-m", module, args...]`` or ``["-c", code, args...]``, as :func:`seeded_entry.main
    <torchstage.launch.seeded_entry.main>` takes it; None where the program cannot be told apart from the options."""
    argv = list(getattr(sys, "orig_argv", []))
    head = len(argv) - len(sys.argv)  # orig_argv ends with the program and its arguments, as sys.argv does
    if not argv or head < 1 or argv[head + 1:] != sys.argv[1:] or command[1:] != argv[1:]:
        return None
    options = argv[1:head]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if sys.argv[0] == "-c":
        program = ["-c", argv[head]]
    elif spec is not None and getattr(spec, "name", None):
        program = ["-m", spec.name]
    else:
        program = [argv[head]]
    if len(program) == 2:
        if not options or options[-1] != program[0]:
            return None  # -c/-m combined with other options in one word: run as given, unseeded
        options = options[:-1]
    if not _plain_options(options):
        return None
    return options, [*program, *sys.argv[1:]]


def _plain_options(options: list) -> bool:
    """True when ``options`` are interpreter options only: flags, and the values of ``-W``/``-X``."""
    value = False
    for option in options:
        if not value and (not option.startswith("-") or option[1:2] in ("c", "m")):
            return False
        value = not value and option in ("-W", "-X", "--check-hash-based-pycs")
    return True


def launched_seed(environ: Mapping = None) -> Optional[int]:
    """The seed of this rank's module-level code: :data:`SEED_ENV` where set, else (in a world of several ranks a
    launcher started) one derived from the job's id, the same on every rank; None for a process alone."""
    environ = os.environ if environ is None else environ
    given = environ.get(SEED_ENV, "").strip()
    if given:
        try:
            return int(given)
        except ValueError:
            raise ValueError(f"{SEED_ENV} must be an integer (the seed of every rank's module-level code), got "
                             f"{given!r}") from None
    launcher = _launcher_of_several(environ)
    if launcher is None:
        return None
    name = next((name for name in JOB_VARIABLES if environ.get(name)), None)
    job = f"{name}={environ[name]}" if name else launcher.job_id(environ)
    return zlib.crc32(f"{job}".encode()) if job else FIXED_SEED


#: Variables one of which every launcher torchstage knows sets in each rank (torchrun, SLURM, Open MPI, MPICH, PALS,
#: LSF): without any, a process is alone, and ``import torchstage`` need not load the launchers to say so.
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PALS_RANKID", "JSM_NAMESPACE_RANK")


def _launcher_of_several(environ: Mapping):
    """The launcher environment that started this process as one rank of several, or None."""
    if not any(name in environ for name in _RANK_VARIABLES):
        return None
    from torchstage.launch.resolve import ENVIRONMENTS  # the launchers, in the order that decides between them
    try:
        launcher = next((env for env in ENVIRONMENTS if env.applies(environ)), None)
        return launcher if launcher is not None and launcher.ranks(environ) > 1 else None
    except ValueError:  # variables that do not add up: resolving the world says what is wrong
        return None


def seed_launched_rank(force: bool = False) -> None:
    """Seed python, numpy and torch with :func:`launched_seed` when this process is a launched rank: module-level
    data made after it agrees across ranks. ``import torchstage`` calls it, and seeds only while torch's generator
    is as ``import torch`` left it (a seed the script set before the import is kept: it is the same on every rank
    already); the entry of torchstage's workers calls it with ``force`` before the program's first line.
    ``train(seed=...)`` seeds each rank again when training starts."""
    global _applied
    seed = launched_seed()
    if seed is not None and (force or _as_torch_left_it()):
        set_seed(seed)
        _applied = seed
        logger.debug("module-level code seeded with %d, the same on every rank of this launched world", seed)


def _as_torch_left_it() -> bool:
    """True while torch's default generator holds the random 64-bit seed ``import torch`` gave it and has drawn
    nothing since (a script's ``torch.manual_seed(42)`` gives a small seed; any draw changes the state)."""
    seed = torch.initial_seed()
    return seed >= 2**32 and torch.equal(torch.Generator().manual_seed(seed).get_state(), torch.get_rng_state())


def applied_seed() -> Optional[int]:
    """The seed :func:`seed_launched_rank` gave this process's module-level code, or None (not a launched rank):
    ``TORCHSTAGE_SCRIPT_SEED=<it>`` draws the same module-level data again."""
    return _applied
