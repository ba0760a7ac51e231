"""What a firing hang watchdog says: where each rank stopped, which one is the likely cause, and a stack.

A rank blocked in a collective (``torch.distributed`` or a DDP backward) waits for a peer; a rank
stopped anywhere else (user code, a data loader, a lock) is what the others wait for.
"""
import os
import time

from torchstage.launch.flight_recorder import TORCH_FILES

#: Rows of the per-rank table in a report; the rest are counted.
REPORT_ROWS = 16
_WAITING_IN = (f"{os.sep}torch{os.sep}distributed{os.sep}", f"{os.sep}torch{os.sep}autograd{os.sep}")
_PIPELINING = f"{os.sep}torch{os.sep}distributed{os.sep}pipelining{os.sep}"


def position(runner, beat) -> dict:
    """Where a rank was at its last progress ``beat`` (monotonic time, event), as plain values (wall time)."""
    loop = runner.loop
    found = {"time": time.time() - (time.monotonic() - beat[0]), "event": beat[1], "stage": loop.stage_key,
             "epoch": loop.epoch, "loader": loop.loader_key, "batch": loop.batch_step,
             "global_batch_step": loop.global_batch_step}
    engine = runner.engine
    stages = getattr(engine.layout, "pipeline", 1) if engine is not None and engine.layout is not None else 1
    if stages > 1:  # under a pipeline: which of its ranks' stages this rank runs
        found["pipeline_stage"] = [engine.coordinates["pipeline"], stages]
    return found


def record_position(info: dict) -> dict:
    """A rank's published :func:`position` as a failure record's position (see :mod:`torchstage.launch.failures`)."""
    return {"stage": info.get("stage"), "epoch": info.get("epoch"), "loader": info.get("loader"),
            "loader_batch": info.get("batch"), "global_batch_step": info.get("global_batch_step")}


def hung_rank(ranks: dict, behind: list, rank: int):
    """The rank the others wait for: one stopped outside any collective, else one the ranks' collectives show
    behind (``behind``); this rank where it is one of them; None when no rank stands out (the ranks' loop
    positions are not compared: a counter read while a batch ends is off by one)."""
    stuck = [r for r, info in sorted(ranks.items()) if "waiting" in info and not info["waiting"]]
    for candidates in (stuck, sorted(behind)):
        if candidates:
            return rank if rank in candidates else candidates[0]
    return None


def state(info: dict) -> str:
    """``; waiting in torch.distributed.recv called from ...`` or ``; stopped in ...`` (empty without a stack)."""
    if "waiting" not in info:
        return ""
    return f"; waiting in {info['waiting']}" if info["waiting"] else f"; stopped in {info['frame']}"


def where(frame) -> dict:
    """The innermost frame of a stack, and what collective it waits in (None: not in one)."""
    if frame is None:
        return {"frame": None, "waiting": None}
    import traceback  # only when a watchdog fires
    frames = traceback.extract_stack(frame)
    waiting = None
    for index, entry in enumerate(frames):
        if any(part in entry.filename for part in _WAITING_IN):
            callers = [f for f in frames[:index] if TORCH_FILES not in f.filename]
            caller = f" called from {_short(callers[-1])}" if callers else ""
            if f"{os.sep}autograd{os.sep}" in entry.filename:
                waiting = f"a backward pass (DDP all-reduces gradients there){caller}"
            elif _PIPELINING in entry.filename:  # a schedule waits for a neighbouring stage's activations or grads
                inner = [f.name for f in frames[index:] if _PIPELINING in f.filename]
                waiting = f"a pipeline schedule's send/recv between stages ({inner[-1]}){caller}"
            else:
                name = next((f.name for f in frames[index:] if f.filename.endswith("distributed_c10d.py")), entry.name)
                waiting = f"torch.distributed.{name}{caller}"
            break
    return {"frame": _short(frames[-1]), "waiting": waiting}


def _short(entry) -> str:
    return f"{entry.filename}:{entry.lineno} in {entry.name}"


def describe(info: dict) -> str:
    """``stage 'main', epoch 1, loader 'train', batch 3 (after batch end)``; under a pipeline also the rank's
    ``pipeline stage 2 of 2``."""
    parts = [f"stage {info['stage']!r}", f"epoch {info['epoch']}"]
    if info.get("loader") is not None and info["event"] not in ("epoch start", "epoch end", "stage end"):
        parts.append(f"loader {info['loader']!r}")
        if info.get("batch") is not None and info["event"].startswith("batch"):
            parts.append(f"batch {info['batch']}")
    if info.get("pipeline_stage"):
        parts.append("pipeline stage {} of {}".format(info["pipeline_stage"][0] + 1, info["pipeline_stage"][1]))
    return ", ".join(parts) + f" (after {info['event']})"


def hang_report(rank: int, timeout: float, ranks: dict, stack: list, exit_code: int, collectives=(),
                hung: int = None) -> str:
    """The text a firing watchdog writes: the hung rank (``hung``, when another rank than this one) and this
    rank's stack, then (last, so a launcher's tail of the output keeps it) each rank's position and state, the
    ranks the others wait for, a hint, and ``collectives`` (lines comparing the collectives the ranks ran)."""
    now = time.time()
    stuck = sorted(r for r, info in ranks.items() if "waiting" in info and not info["waiting"])
    order = sorted(ranks.items(), key=lambda item: (item[0] not in stuck, item[1]["time"], item[0]))
    fired = f"{timeout:g} s (hang_timeout={timeout:g})"
    if hung is None or hung == rank:
        lines = [f"torchstage: rank {rank} made no progress for {fired}. Python stack of its training thread (most "
                 f"recent call last):"]
    else:
        info = ranks.get(hung)
        since = f"no progress since {describe(info)}{state(info)}" if info else "its position is unknown"
        lines = [f"torchstage: rank {hung} hangs, and the other ranks wait for it: {since}. Rank {rank}'s watchdog "
                 f"fired after {fired}; the Python stack of rank {rank}'s training thread (most recent call last):"]
    lines.extend(line.rstrip("\n") for line in stack)
    lines.append("Where each rank last made progress:")
    for other, info in order[:REPORT_ROWS]:
        lines.append(f"  rank {other}{' (this rank)' if other == rank else ''}: {now - info['time']:.1f} s ago, "
                     f"{describe(info)}{state(info)}")
    if len(order) > REPORT_ROWS:
        lines.append(f"  ... and {len(order) - REPORT_ROWS} more ranks")
    if stuck:
        lines.append(f"Stopped outside any collective (what the others wait for): rank{'s' * (len(stuck) > 1)} "
                     f"{', '.join(map(str, stuck))}.")
    lines.extend(_uneven_hint(ranks))
    lines.extend(collectives)
    of = f"hang of rank {hung} detected on rank {rank}" if hung is not None and hung != rank else \
        f"hang detected on rank {rank}"
    lines.append(f"torchstage: {of}; ending the job with exit code {exit_code}.")
    return "\n".join(lines) + "\n"


def _uneven_hint(ranks: dict) -> list:
    """A line when some ranks ended a loader that others are still running batches of."""
    ended = {r for r, i in ranks.items() if i["event"] == "loader end"}
    running = {r for r, i in ranks.items() if i["event"].startswith("batch")}
    same = {(i["stage"], i["epoch"], i["loader"]) for r, i in ranks.items() if r in ended | running}
    if not ended or not running or len(same) != 1:
        return []
    loader = next(iter(same))[2]
    return [f"Ranks {sorted(ended)} finished loader {loader!r} while ranks {sorted(running)} still run its batches: "
            f"the ranks have different numbers of batches (shard the data evenly, e.g. drop_last=True)."]
