"""The ``torchstage`` command: a small argparse router; each subcommand lives with the code it drives."""
import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from torchstage import __version__
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
    from torchstage.commands import checkpoint_tools, env, plot, run, slurm, tune
    return [run.add_parser, tune.add_parser, env.add_parser, plot.add_parser, checkpoint_tools.add_parser,
            slurm.add_parser]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
