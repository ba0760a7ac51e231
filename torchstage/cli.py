"""The ``torchstage`` command: a small argparse router; each subcommand lives with the code it drives."""
import argparse
import sys

from torchstage import __version__
from torchstage.commands import checkpoint_tools, diagnose, env, plan, plot, preflight, report, run, slurm, tune
from torchstage.runner.errors import is_user_error


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
    return [run.add_parser, tune.add_parser, plan.add_parser, env.add_parser, preflight.add_parser, plot.add_parser,
            report.add_parser, checkpoint_tools.add_parser, diagnose.add_parser, slurm.add_parser]


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


if __name__ == "__main__":
    sys.exit(main())
