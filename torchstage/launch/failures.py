"""What each failing rank says about its failure, for the launcher that started it.

A launcher of torchstage's own sets ``TORCHSTAGE_FAILURE_DIR`` in its workers; a rank whose run raises writes
one small JSON record there (its error and where the loop stood). The launcher reads the records to name the
first failing rank and its error, and to tell a failure that repeats at the same point (deterministic: not
worth a restart) from one that does not. A graceful stop (a signal, ``request_stop``) is recorded too, as
``"stopped"``: it ended the run on purpose and is not restarted. Without the variable nothing is written.
"""
import json
import os
import time
from typing import Optional

FAILURE_DIR_ENV = "TORCHSTAGE_FAILURE_DIR"


def record_failure(rank: int, error: BaseException, position: dict) -> None:
    """Write ``rank``'s failure record (never raises: the run is failing already)."""
    _record(rank, f"{type(error).__name__}: {error}".strip()[:2000], position)


def record_stop(rank: int, reason: str, position: dict) -> None:
    """Write ``rank``'s record of a graceful stop: the run ended on purpose, with its checkpoint written."""
    _record(rank, f"stopped gracefully ({reason})", position, stopped=True)


def _record(rank: int, error: str, position: dict, stopped: bool = False) -> None:
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder:
        return
    record = {"rank": rank, "error": error, "stopped": stopped, "time": time.time(),
              "position": {k: position.get(k) for k in ("stage", "epoch", "epoch_done", "loader", "loader_batch",
                                                         "global_batch_step")}}
    try:
        path = os.path.join(folder, f"rank-{rank}.json")
        with open(f"{path}.{os.getpid()}.tmp", "w") as f:
            json.dump(record, f)
        os.replace(f"{path}.{os.getpid()}.tmp", path)
    except (OSError, TypeError, ValueError):
        pass


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
