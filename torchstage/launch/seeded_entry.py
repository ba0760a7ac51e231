"""The workers' entry: seed every generator the same way on every rank, then run the user's program as ``__main__``.

torchstage's launcher starts each worker by running the program again (:func:`relaunch_command`). Data a script
builds at module level without a seed (``X = torch.rand(...)``, as Catalyst's tutorial does) would then differ
between ranks: each rank would train on its own data and validation would mix them. The launcher therefore starts
``python -m torchstage.launch.seeded_entry <the program>``, which seeds python, numpy and torch with the launch's
seed (:data:`SEED_ENV`, the same on every rank) before the program's first line. ``train(seed=...)`` seeds each
rank again once training starts, as without this entry.
"""
import os
import runpy
import sys
import types

from torchstage.launch.script_seed import SEED_ENV
from torchstage.rng import set_seed


def _seed_from_environment() -> None:
    seed = os.environ.get(SEED_ENV)
    if seed:
        set_seed(int(seed))


def main(argv: list) -> None:
    """Seed, then run ``argv`` (``script args...``, ``-m module args...`` or ``-c code args...``) as ``__main__``."""
    _seed_from_environment()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        module = types.ModuleType("__main__")
        sys.modules["__main__"] = module
        exec(compile(argv[1], "<string>", "exec"), module.__dict__)  # noqa: S102 (the user's own -c program)
    else:
        sys.argv = list(argv)
        if not sys.flags.safe_path:
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def without_entry_frames(tb, entry_files=()):
    """``tb`` from the program's first frame on: this entry's, runpy's (and ``entry_files``') frames are no part of
    the user's error."""
    ours = {main.__code__.co_filename, runpy.run_path.__code__.co_filename, *entry_files}
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:  # noqa: BLE001 (shown as python would, exit code 1)
        error.with_traceback(without_entry_frames(error.__traceback__))
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)
