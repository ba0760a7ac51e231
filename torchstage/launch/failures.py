"""What each failing rank says about its failure, for the launcher that started it.

A launcher of torchstage's own sets ``TORCHSTAGE_FAILURE_DIR`` in its workers; a rank whose run raises writes
one small JSON record there (its error and where the loop stood). The launcher reads the records to name the
first failing rank and its error, and to tell a failure that repeats at the same point (deterministic: not
worth a restart) from one that does not. A graceful stop (a signal, ``request_stop``) is recorded too, as
``"stopped"``: it ended the run on purpose and is not restarted. Without the variable nothing is written.
"""
import json
import os
import re
import time
from typing import Optional

from torchstage.launch.flight_recorder import agreement, call_site, differences, valid_entries

FAILURE_DIR_ENV = "TORCHSTAGE_FAILURE_DIR"
#: The file by which the launcher asks its live workers, after a rank failed, to record where they are (a rank
#: stuck in a collective among the survivors never raises: without it, it would be stopped with no record).
ASKED = "asked.json"
#: How the record of a rank that wrote one because the launcher asked begins.
STILL_RUNNING = "no error of its own:"
#: How the record of a rank that left a distributed run on its own (``sys.exit`` while its peers train) begins.
LEFT_THE_RUN = "left the run:"
#: Words of gloo's and NCCL's own errors when the ranks ran different collectives (or different sizes in one).
_MISMATCH = ("collective mismatch", "op.preamble.length", "Received data size", "desync", "mismatch between collectives")


def record_failure(rank: int, error, position: dict, collectives: list = None, origin_rank: int = None) -> None:
    """Write ``rank``'s failure record: ``error`` (an exception, or what happened as text), where, and the last
    collectives it ran (see :mod:`torchstage.launch.flight_recorder`). Never raises: the run is failing already.

    An error that says which rank caused it (an ``origin_rank`` attribute: a NaN seen on one rank stops all; or
    ``origin_rank``: the rank a hang report found stuck) keeps that rank in the record."""
    # the message stripped first: torch's pipeline stage errors open with a blank line, which a one-line summary
    # (the record's first line) would show as "RuntimeError: "
    text = error if isinstance(error, str) else f"{type(error).__name__}: {str(error).strip()}"
    _record(rank, text.strip()[:2000], position, collectives=collectives or [],
            origin_rank=getattr(error, "origin_rank", origin_rank))


def record_stop(rank: int, reason: str, position: dict) -> None:
    """Write ``rank``'s record of a graceful stop: the run ended on purpose, with its checkpoint written."""
    _record(rank, f"stopped gracefully ({reason})", position, stopped=True)


def record_outcome(rank: int, text: str) -> None:
    """Write ``rank``'s record of a command that ended with a result, not a failure (``torchstage preflight``
    finding slow ranks): not restarted, and said as ``text`` alone (no run stopped, nothing before training)."""
    _record(rank, text, {}, stopped=True, outcome=True)


def _record(rank: int, error: str, position: dict, stopped: bool = False, **extra) -> None:
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder:
        return
    record = {"rank": rank, "error": error, "stopped": stopped, "time": time.time(), **extra,
              "position": {k: position.get(k) for k in ("stage", "epoch", "epoch_done", "loader", "loader_batch",
                                                         "global_batch_step")}}
    try:
        path = os.path.join(folder, f"rank-{rank}.json")
        with open(f"{path}.{os.getpid()}.tmp", "w") as f:
            json.dump(record, f)
        os.replace(f"{path}.{os.getpid()}.tmp", path)
    except (OSError, TypeError, ValueError):
        pass


def ask_for_records(folder: str, failed: int) -> None:
    """Ask the workers that share ``folder`` to record where they are now (rank ``failed`` failed)."""
    try:
        with open(os.path.join(folder, f"{ASKED}.tmp"), "w") as f:
            json.dump({"failed": failed, "time": time.time()}, f)
        os.replace(os.path.join(folder, f"{ASKED}.tmp"), os.path.join(folder, ASKED))
    except OSError:
        pass


def asked_path() -> Optional[str]:
    """Where this worker's launcher would ask it for a record (:func:`ask_for_records`); None without one."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    return os.path.join(folder, ASKED) if folder else None


def read_asked(path: str) -> Optional[dict]:
    """The launcher's request at ``path`` (the rank that failed, when), or None while there is none."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_failures(folder: str) -> dict:
    """Rank -> failure record of each rank that wrote one in ``folder``."""
    records = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as f:
                    record = json.load(f)
                records[int(record["rank"])] = record
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return records


def first_failure(records: dict) -> Optional[dict]:
    """The record written first: the rank whose error started the failure (the others' errors echo it); an error
    comes before a graceful stop recorded beside it (the stop did not end the run alone)."""
    if not records:
        return None
    return min(records.values(), key=lambda r: (bool(r.get("stopped")), r.get("time", 0.0)))


def where(record: Optional[dict]) -> str:
    """``stage 'main', epoch 2, batch 3 of loader 'train' (global batch 13)`` for a record's position."""
    if not record:
        return "an unknown point (the rank left no record: killed, or failed before training)"
    p = record["position"]
    if p.get("stage") is None:
        return "before training"
    batch = f", batch {p['loader_batch']} of loader {p['loader']!r}" if p.get("loader") and p.get("loader_batch") \
        else ""
    return f"stage {p['stage']!r}, epoch {p['epoch']}{batch} (global batch {p['global_batch_step']})"


def same_failure(a: Optional[dict], b: Optional[dict]) -> bool:
    """True when two attempts failed with the same error at the same point: a deterministic failure."""
    if not a or not b:
        return False
    keys = ("stage", "epoch", "loader", "loader_batch", "global_batch_step")
    return a["error"] == b["error"] and all(a["position"].get(k) == b["position"].get(k) for k in keys)


def explain(records: dict, silent=(), output: str = "") -> list:
    """Lines that say what the ranks' records show together: the first collective where the ranks differ (from
    the collectives each recorded), or, when ``silent`` ranks died without a record, where the others were; and
    what a gloo or NCCL abort about mismatched collectives (in a record or in the failing rank's ``output``)
    means."""
    recorded = {r: valid_entries(rec.get("collectives")) for r, rec in records.items()}
    lines = differences(recorded) or [  # else what a hang report in the output gave
        line for line in output.splitlines() if line.startswith("First collective")][:2]
    unrecorded = sorted(set(silent) - set(records))
    agreed = agreement(recorded)
    if not lines and unrecorded and agreed:
        lines = [f"{agreed} Rank{'s' * (len(unrecorded) > 1)} {', '.join(map(str, unrecorded))} died without "
                 f"recording {'their' if len(unrecorded) > 1 else 'its'} collectives."]
    lines += _still_running(records)
    crash, silent = died_in(output), sorted(silent)
    if silent and crash:
        lines.append(f"Rank {silent[0]} died inside {crash}.")
    texts = [rec.get("error", "") for rec in records.values()] + output.splitlines()
    aborts = [text.strip() for text in texts if any(word in text for word in _MISMATCH)]
    if aborts:
        lines.append(f"The process group aborted because the ranks ran different collectives (or one collective "
                     f"with different sizes): {aborts[0][:300]}")
    return lines


def _still_running(records: dict) -> list:
    """``Ranks 0, 2, 3 had no error of their own; asked, they were at ...``: where the ranks that recorded because
    the launcher asked (see :data:`ASKED`) were, one line per place."""
    places = {}
    for rank, record in sorted(records.items()):
        error = record.get("error", "")
        if error.startswith(STILL_RUNNING) and " failed, at " in error:
            places.setdefault(error.split(" failed, at ", 1)[1], []).append(rank)
    return [f"Rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} had no error of "
            f"{'their' if len(ranks) > 1 else 'its'} own; asked by the launcher, "
            f"{'they were' if len(ranks) > 1 else 'it was'} at {place}." for place, ranks in places.items()]


def died_in(output: str) -> Optional[str]:
    """``torch.distributed.all_reduce called from train.py:12 in step``: the collective a crashed rank's Python
    fault handler (its stack dump on SIGABRT/SIGSEGV, in ``output``) shows it in, else None."""
    found = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', output[output.rfind("Fatal Python error"):]
                       if "Fatal Python error" in output else "")
    frames = [{"filename": filename, "line": line, "name": name} for filename, line, name in found]  # innermost first
    for index, frame in enumerate(frames):
        if frame["filename"].endswith("distributed_c10d.py"):
            caller = call_site(frames[index + 1:])
            return f"torch.distributed.{frame['name']}" + (f" called from {caller}" if caller != "?" else "")
    return None
