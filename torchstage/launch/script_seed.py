"""The seed of module-level code in the workers torchstage starts, and the command that applies it.

See :mod:`torchstage.launch.seeded_entry`: the workers run the program through that entry, which seeds every
generator with :data:`SEED_ENV` (the same on every rank) before the program's first line.
"""
import sys
import zlib

import torch

#: The seed of the workers' module-level code, set by the launcher (a user's value is kept).
SEED_ENV = "TORCHSTAGE_SCRIPT_SEED"
ENTRY = "torchstage.launch.seeded_entry"


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
