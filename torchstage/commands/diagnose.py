"""``torchstage diagnose``: after a distributed failure, which rank was behind, in which collective, from where."""
import argparse
import os
import sys

from torchstage.launch.flight_recorder import FOLDER, agreement, describe, first_difference, read_dumps

EPILOG = f"""\
examples:
  torchstage diagnose logdir        # reads logdir/{FOLDER}/

The files are written by each rank when a distributed run fails or its hang watchdog fires (rank-N.json,
from torch's Flight Recorder), and by NCCL on a collective timeout (nccl-rank-N, pickles read without running
any code). Exit status 0: the ranks agree; 1: they differ; 2: no records."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "diagnose", help="compare the collectives each rank ran before a distributed failure",
        description="Merge the per-rank Flight Recorder records in LOGDIR: each rank's last collectives, and\n"
                    "the first collective where the ranks differ (who is behind, which call, from where).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir", metavar="LOGDIR", help="the logdir of a run")
    parser.add_argument("--last", type=int, default=3, metavar="N", help="collectives listed per rank (default 3)")
    parser.set_defaults(func=diagnose_command)


def diagnose_command(args) -> int:
    ranks = read_dumps(args.logdir)
    if not ranks:
        sys.stderr.write(f"torchstage diagnose: error: no collective records in "
                         f"{os.path.join(args.logdir, FOLDER)} (they are written when a run of several processes "
                         f"fails or hangs)\n")
        return 2
    out = [f"collective records of {len(ranks)} rank{'s' * (len(ranks) > 1)} in {os.path.join(args.logdir, FOLDER)}"]
    for rank in sorted(ranks):
        out.append(f"rank {rank}: {len(ranks[rank])} collectives recorded; the last {min(args.last, len(ranks[rank]))}:")
        out.extend(f"  {describe(entry)}" for entry in ranks[rank][-args.last:])
    difference = first_difference(ranks)
    out.append(difference or agreement(ranks) or "(one rank's records: nothing to compare)")
    sys.stdout.write("\n".join(out) + "\n")
    return 1 if difference else 0
