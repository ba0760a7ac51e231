"""The collectives each rank ran, read from torch's Flight Recorder, and the first one where the ranks differ.

torch records every collective of every process group (gloo and NCCL: kind, shapes, dtypes, sequence number and
the Python stack) in a ring of 2000 entries, on by default (``TORCH_FR_BUFFER_SIZE``; 0 turns it off). torchstage
reads that ring only when something failed: the hang watchdog and a failing rank write its last entries to
``LOGDIR/flight-recorder/rank-N.json`` and hand its tail to the launcher's summary; NCCL's own dump on a timeout is
pointed at the same folder. :func:`first_difference` compares the ranks' records. Reading a dump never unpickles
code: NCCL's pickled dumps are read with an unpickler that refuses every global.
"""
import io
import json
import os
import pickle

FOLDER = "flight-recorder"
#: Collectives per rank that failure records and the hang watchdog carry, and that a rank's file keeps (where
#: ranks part is near the end; 8,192 ranks' files stay at about 60 KB each).
TAIL, DUMPED = 12, 256
#: Where NCCL writes its dump on a timeout (``<prefix><rank>``), under the logdir; the legacy name too.
_DUMP_FILE_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
#: A file of torch itself: not a call site worth naming.
TORCH_FILES = f"{os.sep}torch{os.sep}"


def point_dumps_to(logdir) -> None:
    """Make NCCL's own dump on a collective timeout land in ``logdir/flight-recorder/`` (unless the user set where);
    call before the process group exists."""
    if logdir is None or any(os.environ.get(name) for name in _DUMP_FILE_ENV):
        return
    prefix = os.path.join(os.path.abspath(os.fspath(logdir)), FOLDER, "nccl-rank-")
    for name in _DUMP_FILE_ENV:
        os.environ[name] = prefix
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


def recent(limit: int = None) -> list:
    """This process's recorded collectives, oldest first (the last ``limit``), as plain dicts; [] when torch has
    none (no process group, the recorder off, or a torch without it)."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace  # not public API: any failure means no record
        raw = _dump_fr_trace(includeStackTraces=True)
    except Exception:
        return []
    entries = [compact(entry) for entry in _loads(raw).get("entries", ())]
    return entries[-limit:] if limit else entries


def compact(entry: dict) -> dict:
    """One Flight Recorder entry as what a report needs: group, sequence number, kind, shapes, dtypes, call site."""
    p2p = bool(entry.get("is_p2p"))
    group = entry.get("process_group") or ("?", "?")
    return {"group": str(group[1] or group[0]), "seq": int(entry.get(f"{'p2p' if p2p else 'collective'}_seq_id", 0)),
            "p2p": p2p, "op": str(entry.get("profiling_name", "?")).split(":")[-1],
            "sizes": entry.get("input_sizes") or [], "dtypes": entry.get("input_dtypes") or [],
            "site": call_site(entry.get("frames") or [])}


def call_site(frames: list) -> str:
    """``file:line in function`` of the innermost frame outside torch (who called the collective); '?' if none."""
    for frame in frames:  # innermost first
        if TORCH_FILES not in frame.get("filename", TORCH_FILES):
            return f"{frame['filename']}:{frame.get('line')} in {frame.get('name')}"
    return "?"


def describe(entry: dict) -> str:
    """``all_reduce(Float[3]) #41 called from train.py:12 in step``."""
    shapes = ", ".join(f"{dtype}{list(size)}" for dtype, size in zip(entry["dtypes"], entry["sizes"]))
    return f"{entry['op']}({shapes}) #{entry['seq']} called from {entry['site']}"


def write_dump(logdir, rank: int, entries: list = None) -> str:
    """Write this rank's recorded collectives to ``logdir/flight-recorder/rank-N.json``; the path, or None when
    there is no logdir or nothing was recorded (never raises: the run is failing already)."""
    if logdir is None:
        return None
    entries = (recent() if entries is None else entries)[-DUMPED:]
    if not entries:
        return None
    folder = os.path.join(os.fspath(logdir), FOLDER)
    path = os.path.join(folder, f"rank-{rank}.json")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(f"{path}.{os.getpid()}.tmp", "w") as f:
            json.dump({"rank": rank, "entries": entries}, f)
        os.replace(f"{path}.{os.getpid()}.tmp", path)
    except OSError:
        return None
    return path


def read_dumps(logdir) -> dict:
    """Rank -> recorded collectives from a logdir's ``flight-recorder/``: torchstage's JSON files, and NCCL's own
    pickled dumps (``nccl-rank-N``, read without running code; a JSON file of the same rank wins)."""
    folder = os.path.join(os.fspath(logdir), FOLDER)
    ranks = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        path = os.path.join(folder, name)
        try:
            if name.startswith("rank-") and name.endswith(".json"):
                with open(path) as f:
                    data = json.load(f)
                ranks[int(data["rank"])] = data["entries"]
            elif name.startswith("nccl-rank-") and name[len("nccl-rank-"):].isdigit():
                with open(path, "rb") as f:
                    entries = [compact(e) for e in _loads(f.read()).get("entries", ())]
                ranks.setdefault(int(name[len("nccl-rank-"):]), entries)
        except (OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError):
            continue
    return ranks


def first_difference(ranks: dict):
    """The report line naming the first collective where the ranks' records (rank -> entries, oldest first)
    differ: which rank was in which, from where, or which ranks never reached it; None when they agree or fewer
    than 2 ranks recorded any."""
    ranks = {rank: entries for rank, entries in ranks.items() if entries}
    if len(ranks) < 2:
        return None
    for group, p2p in sorted({(e["group"], e["p2p"]) for entries in ranks.values() for e in entries}):
        seen = {rank: {e["seq"]: e for e in entries if (e["group"], e["p2p"]) == (group, p2p)}
                for rank, entries in ranks.items()}
        seen = {rank: by_seq for rank, by_seq in seen.items() if by_seq}
        line = _compare_group(group, seen) if len(seen) > 1 else None
        if line:
            return line
    return None


def agreement(ranks: dict):
    """The report line saying that the ranks' records agree, with the last collective; None under 2 ranks."""
    last = {rank: entries[-1] for rank, entries in ranks.items() if entries}
    if len(last) < 2:
        return None
    return (f"Collectives: the ranks' recorded collectives agree (ranks {_ranks(last)}; the last: "
            f"{describe(next(iter(last.values())))}).")


def compare(ranks: dict) -> list:
    """The line a report gives about the ranks' collectives: the first difference, else their agreement."""
    line = first_difference(ranks) or agreement(ranks)
    return [line] if line else []


def _compare_group(group: str, seen: dict):
    start = max(min(by_seq) for by_seq in seen.values())  # the oldest sequence number every rank still holds
    end = max(max(by_seq) for by_seq in seen.values())
    where = f"First collective where the ranks differ (group {group!r}, #{{}}): "
    for seq in range(start, end + 1):
        present = {rank: by_seq[seq] for rank, by_seq in seen.items() if seq in by_seq}
        kinds = {}
        for rank, entry in present.items():
            kinds.setdefault((entry["op"], json.dumps(entry["sizes"]), json.dumps(entry["dtypes"])), []).append(rank)
        missing = sorted(set(seen) - set(present))
        if len(kinds) > 1:
            parts = [f"rank{'s' * (len(rs) > 1)} {_ranks(rs)} in {describe(present[rs[0]])}"
                     for rs in sorted(kinds.values(), key=len, reverse=True)]
            return where.format(seq) + "; ".join(parts) + "."
        if missing:
            ahead = sorted(present)
            behind = [f"rank {rank} last ran {describe(seen[rank][max(seen[rank])])}" for rank in missing]
            return (where.format(seq) + f"rank{'s' * (len(ahead) > 1)} {_ranks(ahead)} entered "
                    f"{describe(present[ahead[0]])}, which rank{'s' * (len(missing) > 1)} {_ranks(missing)} never "
                    f"reached; " + "; ".join(behind) + ".")
    return None


def _ranks(ranks) -> str:
    return ", ".join(map(str, sorted(ranks)))


class _NoGlobals(pickle.Unpickler):
    """An unpickler for Flight Recorder dumps (plain dicts, lists, strings, numbers): any class or function in the
    stream is refused, so a crafted file cannot run code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds only plain values; refused {module}.{name}")


def _loads(data: bytes) -> dict:
    loaded = _NoGlobals(io.BytesIO(data)).load()
    if not isinstance(loaded, dict):
        raise ValueError("a Flight Recorder dump is a dict")
    return loaded
