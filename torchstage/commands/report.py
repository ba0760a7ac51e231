"""``torchstage report``: a scalability table and figure from runs of one script at several world sizes."""
import argparse
import sys

from torchstage.files.reports.report import write_report

EPILOG = """\
examples:
  torchstage report runs/ws1 runs/ws2 runs/ws4 -o scaling    # scaling/report.md, scaling/report.png
  torchstage report runs/ws4 -o ranks                        # the ranks of one run: ranks/report.md, ranks-ws4.png

the scalability table needs runs trained with train(monitor=True); every run of several processes with a logdir
also gets its ranks side by side (each rank's compute, data and wait per batch, epoch by epoch, and the straggler
episodes with what they cost). Needs matplotlib: pip install 'torchstage[plot]'"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="compare runs at several world sizes: epoch time, throughput, speedup, efficiency",
        description="Read the monitor figures (train(monitor=True)) of each LOGDIR and write a Markdown table\n"
                    "and a PNG: epoch time, throughput, speedup, efficiency, data-loader wait and peak memory\n"
                    "against the world size; and for a run of several processes, each rank's step times and the\n"
                    "straggler episodes.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdirs", nargs="+", metavar="LOGDIR", help="logdirs of runs of the same script")
    parser.add_argument("-o", "--output", metavar="OUT", default="report",
                        help="folder for report.md and report.png (default: ./report)")
    parser.set_defaults(func=report_command)


def report_command(args) -> int:
    try:
        *paths, caveat = write_report(args.logdirs, args.output)
    except (ImportError, OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"torchstage report: error: {exc}\n")
        return 1
    if caveat:
        sys.stderr.write(f"torchstage report: warning: {caveat}\n")
    sys.stdout.write("".join(f"wrote {path}\n" for path in paths))
    return 0
