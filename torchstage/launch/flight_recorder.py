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
import time

from torchstage.launch.resolve import job_identity, restart_attempt

FOLDER = "flight-recorder"
#: The note a finished run leaves beside a failed attempt's records (see :func:`mark_finished`).
FINISHED = "finished.json"
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
    """One Flight Recorder entry as what a report needs: group, sequence number, kind, shapes, dtypes, call site
    (ValueError for an entry that is not one)."""
    if not isinstance(entry, dict):
        raise ValueError(f"a Flight Recorder entry is a dict, not {type(entry).__name__}")
    p2p = bool(entry.get("is_p2p"))
    group = entry.get("process_group")
    name, desc = (list(group) + ["?", "?"])[:2] if isinstance(group, (list, tuple)) else ("?", "?")
    frames = entry.get("frames") or []
    return checked({"group": group_label(name, desc), "seq": entry.get(f"{'p2p' if p2p else 'collective'}_seq_id", 0),
                    "p2p": p2p, "op": str(entry.get("profiling_name", "?")).split(":")[-1],
                    "sizes": entry.get("input_sizes") or [], "dtypes": entry.get("input_dtypes") or [],
                    "site": call_site(frames if isinstance(frames, list) else [])})


def valid_entries(entries) -> list:
    """The entries of ``entries`` that are records of collectives (see :func:`checked`); [] for anything else."""
    valid = []
    for entry in entries if isinstance(entries, list) else ():
        try:
            valid.append(checked(entry))
        except ValueError:
            pass
    return valid


def group_label(name, desc) -> str:
    """How a report names a process group: its description (``default_pg``), with its unique name where torch gave
    none (``new_group()`` without ``group_desc``: DeepSpeed's groups are all 'undefined') or it is not the default."""
    name, desc = str(name), str(desc or "")
    if desc in ("", "undefined", "?"):
        return f"pg {name}"
    return desc if desc == "default_pg" else f"{desc} (pg {name})"


def checked(entry) -> dict:
    """``entry`` if it is a compact record of one collective (the keys and types :func:`compact` gives), else
    ValueError: a crafted or damaged file must not reach the comparison."""
    if not isinstance(entry, dict):
        raise ValueError(f"a collective is a dict, not {type(entry).__name__}")
    types = {"group": str, "seq": int, "p2p": bool, "op": str, "sizes": list, "dtypes": list, "site": str}
    for key, kind in types.items():
        if not isinstance(entry.get(key), kind) or (kind is int and isinstance(entry[key], bool)):
            raise ValueError(f"a collective's {key!r} is {type(entry.get(key)).__name__}, not {kind.__name__}")
    if not all(isinstance(size, list) and all(isinstance(n, int) for n in size) for size in entry["sizes"]) \
            or not all(isinstance(dtype, str) for dtype in entry["dtypes"]):
        raise ValueError("a collective's sizes are lists of integers and its dtypes strings")
    return {key: entry[key] for key in types}


def call_site(frames: list) -> str:
    """``file:line in function`` of the innermost frame outside torch (who called the collective); '?' if none."""
    for frame in frames:  # innermost first
        if isinstance(frame, dict) and TORCH_FILES not in str(frame.get("filename", TORCH_FILES)):
            return f"{frame['filename']}:{frame.get('line')} in {frame.get('name')}"
    return "?"


def describe(entry: dict) -> str:
    """``all_reduce(Float[3]) #41 called from train.py:12 in step``."""
    shapes = ", ".join(f"{dtype}{list(size)}" for dtype, size in zip(entry["dtypes"], entry["sizes"]))
    return f"{entry['op']}({shapes}) #{entry['seq']} called from {entry['site']}"


def write_dump(logdir, rank: int, entries: list = None) -> str:
    """Write this rank's recorded collectives to ``logdir/flight-recorder/rank-N.json`` with the attempt (restart)
    and job they belong to; the path, or None when there is no logdir or nothing was recorded (never raises: the
    run is failing already)."""
    if logdir is None:
        return None
    entries = (recent() if entries is None else entries)[-DUMPED:]
    if not entries:
        return None
    return _write(logdir, f"rank-{rank}.json", {"rank": rank, **_stamp(), "entries": entries})


def mark_finished(logdir) -> None:
    """Note in ``logdir/flight-recorder/``, where a failed attempt left records, that the run then finished: the
    records describe a failure a restart recovered from (``torchstage diagnose`` says so)."""
    if logdir is not None and os.path.isdir(os.path.join(os.fspath(logdir), FOLDER)):
        _write(logdir, FINISHED, _stamp())


def _stamp() -> dict:
    return {"attempt": restart_attempt(), "job": job_identity(), "time": time.time()}


def _write(logdir, name: str, data: dict):
    folder = os.path.join(os.fspath(logdir), FOLDER)
    path = os.path.join(folder, name)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(f"{path}.{os.getpid()}.tmp", "w") as f:
            json.dump(data, f)
        os.replace(f"{path}.{os.getpid()}.tmp", path)
    except (OSError, TypeError, ValueError):
        return None
    return path


class MalformedRecord(ValueError):
    """A file of ``flight-recorder/`` that is not a record of collectives; the message names the file."""


def read_records(logdir) -> tuple:
    """The records in a logdir's ``flight-recorder/``, newest first, each a dict of path, rank, entries, attempt,
    job and time: torchstage's JSON files and NCCL's pickled dumps (``nccl-rank-N``, read without running code;
    no attempt, the file's time); and a line per file that is not a record (a crafted or damaged one), skipped."""
    folder = os.path.join(os.fspath(logdir), FOLDER)
    records, malformed = [], []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        path = os.path.join(folder, name)
        nccl = name.startswith("nccl-rank-") and name[len("nccl-rank-"):].isdigit()
        if nccl or (name.startswith("rank-") and name.endswith(".json")):
            try:
                records.append(_read(path, _read_nccl if nccl else _read_json))
            except MalformedRecord as error:
                malformed.append(str(error))
    return sorted(records, key=lambda record: record["time"], reverse=True), malformed


def read_finished(logdir):
    """The note :func:`mark_finished` left (attempt, job, time), or None; MalformedRecord names a damaged one."""
    path = os.path.join(os.fspath(logdir), FOLDER, FINISHED)
    return _read(path, _read_json) if os.path.isfile(path) else None


def last_attempt(records: list) -> dict:
    """Rank -> record of the attempt that wrote the newest of ``records`` (see :func:`read_records`); NCCL's dumps,
    which carry no attempt, join it for the ranks it has no file of."""
    stamped = [record for record in records if record["attempt"] is not None]
    key = _attempt_key(stamped[0]) if stamped else None
    shown = {r["rank"]: r for r in reversed(stamped) if _attempt_key(r) == key}
    for record in records:
        if record["attempt"] is None:
            shown.setdefault(record["rank"], record)
    return shown


def read_dumps(logdir) -> dict:
    """Rank -> recorded collectives of the last attempt in a logdir's ``flight-recorder/`` (see
    :func:`last_attempt`); a file that is not a record is skipped."""
    return {rank: record["entries"] for rank, record in last_attempt(read_records(logdir)[0]).items()}


def _attempt_key(record: dict) -> str:
    return json.dumps([record["job"], record["attempt"]], sort_keys=True)


def _read(path: str, reader) -> dict:
    try:
        return reader(path)
    except OSError as error:
        raise MalformedRecord(f"{path} cannot be read ({error.strerror or error})") from None
    except Exception as error:  # anything a crafted file causes (RecursionError included) names the file
        raise MalformedRecord(f"{path} is not a record of collectives ({type(error).__name__}: "
                              f"{str(error)[:200]})") from None


def _read_json(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"a record is a JSON object, not {type(data).__name__}")
    job, stamp = data.get("job", {}), data.get("time", os.path.getmtime(path))
    numbers = {"rank": data.get("rank", 0), "attempt": data.get("attempt", 0)}
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in numbers.values()) \
            or not isinstance(stamp, (int, float)) or isinstance(stamp, bool) or not isinstance(job, dict) \
            or not all(isinstance(value, str) for value in job.values()):
        raise ValueError("rank and attempt are integers >= 0, time a number and job an object of strings")
    entries = data.get("entries", [])
    if not isinstance(entries, list):
        raise ValueError(f"entries is a list, not {type(entries).__name__}")
    return {"path": path, **numbers, "entries": [checked(entry) for entry in entries], "job": job,
            "time": float(stamp)}


def _read_nccl(path: str) -> dict:
    with open(path, "rb") as f:
        entries = _loads(f.read()).get("entries", ())
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"entries is a list, not {type(entries).__name__}")
    rank = int(os.path.basename(path)[len("nccl-rank-"):])
    return {"path": path, "rank": rank, "attempt": None, "entries": [compact(entry) for entry in entries], "job": {},
            "time": os.path.getmtime(path)}


def differences(ranks: dict) -> list:
    """The report lines naming where the ranks' records (rank -> entries, oldest first) part: the first collective
    the ranks called from different lines with the same kind and shapes (an extra collective on one side pairs
    silently with another), when it comes before the first collective where they differ; and that one. [] when
    they agree or fewer than 2 ranks recorded any."""
    scans = _scan(ranks)
    parting = next((scan["parting"] for scan in scans if scan["parting"]), None)
    return [line for line in (parting, next((s["difference"] for s in scans if s["difference"]), None)) if line]


def first_difference(ranks: dict):
    """The report line naming the first collective where the ranks' records differ in kind or shapes, or which
    some ranks never reached: who was in which, from where; None when there is none."""
    return next((scan["difference"] for scan in _scan(ranks) if scan["difference"]), None)


def behind(ranks: dict) -> list:
    """The ranks that never reached the first collective where the records differ (in a hang: what the others
    wait for); [] when none."""
    return next((scan["behind"] for scan in _scan(ranks) if scan["behind"]), [])


def agreement(ranks: dict):
    """The report line saying that the ranks' records agree, with the last collective; None under 2 ranks."""
    last = {rank: entries[-1] for rank, entries in ranks.items() if entries}
    if len(last) < 2:
        return None
    return (f"Collectives: the ranks' recorded collectives agree (ranks {_ranks(last)}; the last: "
            f"{describe(next(iter(last.values())))}).")


def compare(ranks: dict) -> list:
    """The lines a report gives about the ranks' collectives: where they part, else their agreement."""
    lines = differences(ranks)
    line = None if lines else agreement(ranks)
    return lines or ([line] if line else [])


def _scan(ranks: dict) -> list:
    """Per process group (torch's unique name: sequence numbers count per group), what its comparison found."""
    ranks = {rank: entries for rank, entries in ranks.items() if entries}
    if len(ranks) < 2:
        return []
    scans = []
    for group, p2p in sorted({(e["group"], e["p2p"]) for entries in ranks.values() for e in entries}):
        seen = {rank: {e["seq"]: e for e in entries if (e["group"], e["p2p"]) == (group, p2p)}
                for rank, entries in ranks.items()}
        seen = {rank: by_seq for rank, by_seq in seen.items() if by_seq}
        if len(seen) > 1:
            scans.append(_compare_group(group, seen))
    return scans


#: Rooted collectives whose inputs only the root holds (the others record none): compared by kind alone.
ROOTED = frozenset({"scatter", "gather"})


def _kind(entry: dict) -> tuple:
    """What must be equal on every rank for one collective: its kind, input shapes and dtypes (the kind alone for
    :data:`ROOTED` ones, e.g. DTensor's ``distribute_tensor`` scatters from one rank)."""
    if entry["op"] in ROOTED:
        return (entry["op"],)
    return entry["op"], json.dumps(entry["sizes"]), json.dumps(entry["dtypes"])


def _compare_group(group: str, seen: dict) -> dict:
    start = max(min(by_seq) for by_seq in seen.values())  # the oldest sequence number every rank still holds
    end = max(max(by_seq) for by_seq in seen.values())
    where = f"(group {group!r}, #{{}})"
    parting = None
    for seq in range(start, end + 1):
        present = {rank: by_seq[seq] for rank, by_seq in seen.items() if seq in by_seq}
        if not present:
            continue  # no rank holds it (the tail a failure record keeps mixes groups)
        kinds = _sides(present, _kind)
        if len(kinds) > 1:
            return {"parting": parting, "behind": [],
                    "difference": f"First collective where the ranks differ {where.format(seq)}: {_in(kinds, present)}."}
        missing = sorted(rank for rank, by_seq in seen.items() if seq > max(by_seq))
        if missing:
            ahead = sorted(present)
            last = [f"rank {rank} last ran {describe(seen[rank][max(seen[rank])])}" for rank in missing]
            return {"parting": parting, "behind": missing, "difference": (
                f"First collective where the ranks differ {where.format(seq)}: rank{'s' * (len(ahead) > 1)} "
                f"{_ranks(ahead)} entered {describe(present[ahead[0]])}, which rank{'s' * (len(missing) > 1)} "
                f"{_ranks(missing)} never reached; " + "; ".join(last) + ".")}
        sites = _sides({r: e for r, e in present.items() if e["site"] != "?"}, lambda e: e["site"].rsplit(os.sep)[-1])
        if parting is None and len(sites) > 1:
            smallest = sorted(sites.values(), key=len)
            likely = (f" (most likely rank{'s' * (len(smallest[0]) > 1)} {_ranks(smallest[0])}'s, called from "
                      f"{present[smallest[0][0]]['site']})" if len(smallest[0]) < len(smallest[1]) else "")
            parting = (f"First collective the ranks called from different lines {where.format(seq)}: "
                       f"{_in(sites, present)}. Of the same kind and shapes, they paired silently: one side ran a "
                       f"collective the other did not{likely}, and the collectives after it pair wrongly.")
    return {"parting": parting, "difference": None, "behind": []}


def _sides(present: dict, key) -> dict:
    """The ranks of ``present`` (rank -> entry) grouped by ``key(entry)``."""
    sides = {}
    for rank, entry in sorted(present.items()):
        sides.setdefault(key(entry), []).append(rank)
    return sides


def _in(sides: dict, present: dict) -> str:
    """``ranks 0, 2 in all_reduce(...) ...; rank 1 in ...``: the largest side first."""
    order = sorted(sides.values(), key=lambda rs: (-len(rs), rs[0]))
    return "; ".join(f"rank{'s' * (len(rs) > 1)} {_ranks(rs)} in {describe(present[rs[0]])}" for rs in order)


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
