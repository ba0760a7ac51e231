"""The ``torchstage`` command: a small argparse router; each subcommand lives with the code it drives."""
import argparse
import os
import sys

from torchstage import __version__
from torchstage.files.format import CheckpointError
from torchstage.commands import checkpoint_tools, diagnose, env, plot, report, run, slurm, tune

_USER_ERRORS = (ValueError, TypeError, KeyError, FileExistsError, FileNotFoundError, NotADirectoryError, PermissionError,
                CheckpointError)
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchstage", description="Train PyTorch models from configs, inspect checkpoints and the "
                                       "distributed environment.",
        epilog="Run 'torchstage COMMAND --help' for the options of a command.")
    parser.add_argument("--version", action="version", version=f"torchstage {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_parser in _subcommands():
        add_parser(sub)
    return parser


def _subcommands():
    """The ``add_parser(subparsers)`` function of every subcommand, in help order."""
    return [run.add_parser, tune.add_parser, env.add_parser, plot.add_parser, report.add_parser,
            checkpoint_tools.add_parser, diagnose.add_parser, slurm.add_parser]


def main(argv=None) -> int:
    """Run one command; a user error (a check of torchstage's refusing what it was given) is one line on
    stderr and exit status 2, anything else keeps its traceback."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        message = " ".join(str(exc).split())
        sys.stderr.write(f"torchstage {args.command}: error: {message}\n")
        return 2


def is_user_error(exc: BaseException) -> bool:
    """An error of what a user gave torchstage (arguments, config, logdir, checkpoint file), raised by
    torchstage's own checks, not inside a model, a dataset or torch."""
    if not isinstance(exc, _USER_ERRORS):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE)


if __name__ == "__main__":
    sys.exit(main())
