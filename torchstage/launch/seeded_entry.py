"""The workers' entry: seed every generator the same way on every rank, then run the user's program as ``__main__``.

torchstage's launcher starts each worker by running the program again (:func:`relaunch_command`). Data a script
builds at module level without a seed (``X = torch.rand(...)``, as Catalyst's tutorial does) would then differ
between ranks: each rank would train on its own data and validation would mix them. The launcher therefore starts
``python -m torchstage.launch.seeded_entry <the program>``, which seeds python, numpy and torch with the launch's
seed (:data:`SEED_ENV`, the same on every rank) before the program's first line. ``train(seed=...)`` seeds each
rank again once training starts, as without this entry.
"""
import atexit
import importlib.machinery
import io
import os
import runpy
import signal
import sys
import types

from torchstage.launch.local_launcher import PARENT_ENV, die_with_parent
from torchstage.launch.script_seed import seed_launched_rank


def main(argv: list):
    """Seed, then run ``argv`` (``script args...``, ``-m module args...`` or ``-c code args...``) as ``__main__``;
    the module it ran in (None where runpy made it: ``-m``, a directory or a zip file)."""
    seed_launched_rank(force=True)  # before the program's first line, whatever importing this entry (or a fork) did
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.modules.pop(argv[1], None)  # loaded already in a forked rank: a new interpreter would not have it
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return None
    module = types.ModuleType("__main__")
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        code = compile(argv[1], "<string>", "exec")
    else:
        sys.argv = list(argv)
        if not sys.flags.safe_path:
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        if not argv[0].endswith(".py") or not os.path.isfile(argv[0]):
            runpy.run_path(argv[0], run_name="__main__")
            return None
        with io.open_code(argv[0]) as source:  # as python runs a script: its own __main__, kept after it ends
            code = compile(source.read(), argv[0], "exec", dont_inherit=True)
        module.__file__, module.__cached__ = argv[0], None
        module.__loader__ = importlib.machinery.SourceFileLoader("__main__", argv[0])
    sys.modules["__main__"] = module
    exec(code, module.__dict__)  # noqa: S102 (the user's own program)
    return module


def without_entry_frames(tb, entry_files=()):
    """``tb`` from the program's first frame on: this entry's, runpy's (and ``entry_files``') frames are no part of
    the user's error."""
    ours = {main.__code__.co_filename, runpy.run_path.__code__.co_filename, *entry_files}
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


def _end_by_sigint() -> None:
    """After an uncaught Ctrl-C, end by SIGINT as python does (its status tells the launcher); registered first, it
    runs after the program's own ``atexit`` functions."""
    if _INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


_INTERRUPTED = []


if __name__ == "__main__":
    if os.environ.get(PARENT_ENV):
        die_with_parent(int(os.environ[PARENT_ENV]))  # from the first line on, not only once the rank joins its world
    atexit.register(_end_by_sigint)
    try:
        main(sys.argv[1:])
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 (shown as python would: exit code 1, or SIGINT after a Ctrl-C)
        error.with_traceback(without_entry_frames(error.__traceback__))
        sys.excepthook(type(error), error, error.__traceback__)
        if isinstance(error, KeyboardInterrupt):
            _INTERRUPTED.append(True)
        sys.exit(1)
