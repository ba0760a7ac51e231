"""What a run of several processes writes about its slow ranks, and how ``torchstage diagnose`` and
``torchstage report`` read it back.

- ``logs/ranks.json``: where each rank ran (host, local rank), written once per process start by the main rank;
- ``logs/stragglers.jsonl``: one JSON object per line and per finding of the straggler detector: a rank named
  slow (``"slow"``), worse, recovered, or still slow when the run ended (``"ended"``), with when it was found
  (``time``, ``stage``, ``epoch``, ``global_batch_step``), when the change it reports began (``began``,
  ``began_at``: the start of the first window that showed it) and when its episode began (``since``,
  ``since_at``). Lines are appended, never rewritten: a resumed run adds its own (``attempt`` tells restarts
  apart);
- ``logs/ranks/<loader>.csv``: per train loader and epoch, each rank's data, compute and wait time per batch
  (milliseconds), written by the CSV logger like any metric (see ``torchstage.callbacks.loggers``).
"""
import csv
import glob
import json
import os

RANKS_FILE = os.path.join("logs", "ranks.json")
EPISODES_FILE = os.path.join("logs", "stragglers.jsonl")
#: The folder (under ``logs/``) of the per-rank CSV files; also the logger scope that writes them.
RANK_FIGURES = "ranks"


def ranks_text(places: list) -> bytes:
    """The content of ``logs/ranks.json`` for ``places`` (one ``(host, local rank)`` per rank, in rank order)."""
    ranks = [{"rank": rank, "host": host, "local_rank": local} for rank, (host, local) in enumerate(places)]
    return (json.dumps({"ranks": ranks}, indent=1) + "\n").encode()


def event_line(event: dict) -> bytes:
    """One line of ``logs/stragglers.jsonl``."""
    return (json.dumps(event, sort_keys=True) + "\n").encode()


def read_ranks(logdir) -> dict:
    """Rank -> ``{"host", "local_rank"}`` from ``logs/ranks.json`` (empty when the run wrote none)."""
    path = os.path.join(logdir, RANKS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {int(r["rank"]): {"host": r["host"], "local_rank": r["local_rank"]} for r in json.load(f)["ranks"]}


def read_events(logdir) -> list:
    """The detector's findings, in the order they were written; a line that is not a finding (a write cut short
    by a crash) is skipped."""
    path = os.path.join(logdir, EPISODES_FILE)
    if not os.path.exists(path):
        return []
    events = []
    with open(path) as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and {"kind", "rank", "part"} <= event.keys():
                events.append(event)
    return events


def episodes(events: list) -> list:
    """The findings grouped into episodes, one per rank and part from its ``"slow"`` finding to its recovery or
    the run's end: dicts with ``start`` (the slow finding), ``updates`` (worse findings), ``end`` (the recovered or
    ended finding, None when the file stops before), ``rank``, ``part`` and ``worst`` (the largest share)."""
    found, open_ = [], {}
    for event in events:
        key = (event.get("attempt", 0), event["rank"], event["part"])
        if event["kind"] == "slow":
            open_[key] = {"rank": event["rank"], "part": event["part"], "start": event, "updates": [], "end": None,
                          "worst": event.get("share", 0.0)}
            found.append(open_[key])
        elif key in open_:
            episode = open_[key]
            episode["worst"] = max(episode["worst"], event.get("worst", 0.0), event.get("share", 0.0))
            if event["kind"] == "worse":
                episode["updates"].append(event)
            else:
                episode["end"] = event
                del open_[key]
    return found


def read_rank_figures(logdir) -> dict:
    """Loader -> rows of ``logs/ranks/<loader>.csv`` (``step``, ``stage``, ``epoch`` and float columns such as
    ``rank3/compute_ms``); empty when the run wrote none."""
    figures = {}
    for path in sorted(glob.glob(os.path.join(logdir, "logs", RANK_FIGURES, "*.csv"))):
        with open(path, newline="") as f:
            rows = []
            for row in csv.DictReader(f):
                parsed = {"stage": row.get("stage", ""), "epoch": int(row["epoch"]), "step": int(row["step"])}
                for key, value in row.items():
                    if key not in ("stage", "epoch", "step") and value not in (None, ""):
                        try:
                            parsed[key] = float(value)
                        except ValueError:
                            pass
                rows.append(parsed)
        figures[os.path.splitext(os.path.basename(path))[0]] = rows
    return figures
