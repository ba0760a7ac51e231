"""``torchstage plot``: a run's logged metrics against epochs, as a PNG."""
import argparse
import sys

from torchstage.files.reports.plot import plot_logs

EPILOG = """\
examples:
  torchstage plot logdir                  # writes logdir/curves.png
  torchstage plot logdir -o curves.png

needs matplotlib: pip install 'torchstage[plot]'"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot", help="plot a run's logged metrics as a PNG",
        description="Draw each metric logged in LOGDIR/logs/<loader>.csv against epochs:\n"
                    "one panel per metric, one line per loader, stage boundaries dashed.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir", metavar="LOGDIR", help="the logdir of a run")
    parser.add_argument("-o", "--output", metavar="PNG", help="where to write the image (default: LOGDIR/curves.png)")
    parser.set_defaults(func=plot_command)


def plot_command(args) -> int:
    try:
        path = plot_logs(args.logdir, args.output)
    except (ImportError, OSError, ValueError) as exc:
        sys.stderr.write(f"torchstage plot: error: {exc}\n")
        return 2
    sys.stdout.write(f"wrote {path}\n")
    return 0
