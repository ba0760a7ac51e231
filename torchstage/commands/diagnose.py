"""``torchstage diagnose``: after a distributed failure, which rank was behind, in which collective, from where; and
the straggler episodes of the run (who was slow, in what, when, and what it cost)."""
import argparse
import os
import sys

from torchstage.files.reports.ranks import diagnose_lines
from torchstage.launch.flight_recorder import (FOLDER, MalformedRecord, agreement, describe, differences, last_attempt,
                                               read_finished, read_records)

EPILOG = f"""\
examples:
  torchstage diagnose logdir        # reads logdir/{FOLDER}/ and logdir/logs/stragglers.jsonl

The files are written by each rank when a distributed run fails or its hang watchdog fires (rank-N.json,
from torch's Flight Recorder), and by NCCL on a collective timeout (nccl-rank-N, pickles read without running
any code). With records of several attempts (a run restarted after a failure), the last attempt's are shown; a
run that finished after them is not reported as failed. The straggler episodes of the run (a rank slower than the others while it
trained, named by the straggler detector) are listed after them. Exit status 0: the ranks agree (or the run
finished after the failure they describe), or the run left straggler findings and no collective records; 1: they
differ; 2: no logdir, no records of either kind, or a file that is not a record."""


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
    folder = os.path.join(args.logdir, FOLDER)
    if not os.path.isdir(args.logdir):
        return _error(f"no such logdir: {args.logdir}")
    records, malformed = read_records(args.logdir)
    try:
        finished = read_finished(args.logdir)
    except MalformedRecord as error:
        malformed.append(str(error))
    if malformed:
        return _error(malformed[0])
    stragglers = diagnose_lines(args.logdir)
    if not records:
        if stragglers is None:
            return _error(f"no collective records in {folder} (they are written when a run of several processes "
                          f"fails or hangs)")
        sys.stdout.write("\n".join([*stragglers, f"no collective records in {folder} (written when a run of several "
                                                  f"processes fails or hangs)"]) + "\n")
        return 0
    shown = last_attempt(records)
    ranks = {rank: record["entries"] for rank, record in shown.items()}
    out = [f"collective records of {len(ranks)} rank{'s' * (len(ranks) > 1)} in {folder}{_attempts(records, shown)}"]
    for rank in sorted(ranks):
        out.append(f"rank {rank}: {len(ranks[rank])} collectives recorded; the last {min(args.last, len(ranks[rank]))}:")
        out.extend(f"  {describe(entry)}" for entry in ranks[rank][-args.last:])
    found = differences(ranks)
    out.extend(found or [agreement(ranks) or "(one rank's records: nothing to compare)"])
    recovered = finished is not None and finished["time"] > max(record["time"] for record in shown.values())
    if recovered:
        out.append(f"The run finished afterwards (attempt {finished['attempt']}): these records describe a failure "
                   f"that a restart recovered from.")
    sys.stdout.write("\n".join(out + (stragglers or [])) + "\n")
    return 1 if found and not recovered else 0


def _attempts(records: list, shown: dict) -> str:
    """``, attempt 2 (attempts 0, 1 left records too, not shown)`` where records of other attempts are there."""
    attempts = {record["attempt"] for record in shown.values() if record["attempt"] is not None}
    ids = {id(record) for record in shown.values()}
    others = sorted({r["attempt"] for r in records if r["attempt"] is not None and id(r) not in ids} - attempts)
    if not attempts or (attempts == {0} and not others):
        return ""
    also = f" (attempt{'s' * (len(others) > 1)} {', '.join(map(str, others))} left records too, not shown)" \
        if others else ""
    return f", attempt {', '.join(map(str, sorted(attempts)))}{also}"


def _error(message: str) -> int:
    sys.stderr.write(f"torchstage diagnose: error: {message}\n")
    return 2
