"""The start-up watch: a rank that makes no progress before its first step ends the job like a hung collective.

From the moment a rank enters its world (``train()``, through :func:`~torchstage.launch.enter.run_in_world`) to
its first step, one-line phase marks (:func:`phase`: forming the world, building the datasets, setting up the
strategy, loading the checkpoint, compiling...) say where the start-up is; each mark is progress. A daemon thread
wakes about once a second; a phase that lasts ``hang_timeout`` seconds ends the process with exit code 124 (as the
hang watchdog does), its report on stderr and a failure record (the rank, the phase, the line where it waits) for
the launcher's summary. The training loop's hang watchdog takes over at the first step (:func:`stop`). Nothing
here runs per batch.

Known waits are named early (see :mod:`torchstage.launch.startup_waits`): torch's extension build lock and a
rendezvous still missing ranks. A rank compiling a torch extension, or waiting for a build lock that a process
on this machine holds (a build at work), is making progress.
"""
import contextlib
import logging
import os
import sys
import threading
import time
import traceback

from torchstage.launch.failures import record_failure
from torchstage.launch.startup_waits import Arrivals, build_progress, format_age, lock_note, lock_wait

logger = logging.getLogger("torchstage")
#: Exit code of a rank ended by the start-up watch: the hang watchdog's (GNU ``timeout``'s convention).
EXIT_CODE = 124
#: A wait for torch's extension build lock is named after this many seconds.
LOCK_NOTE_SECONDS = 5.0
#: A rendezvous that takes this long registers this rank on its store (cheap, once), ...
REGISTER_SECONDS = 2.0
#: ... and after this long says which ranks arrived and which it lacks.
RENDEZVOUS_NOTE_SECONDS = 10.0
FORMING = "forming the world"
_current = None  # the watch of this process, while one runs


@contextlib.contextmanager
def watching(hang_timeout, world, first_phase: str = FORMING):
    """Watch this rank's start-up during the block, from ``first_phase`` on (nothing for one process, for
    ``hang_timeout`` None or 0, or inside a block that already watches); stopped at the latest when it ends."""
    if not hang_timeout or not world.is_distributed or _current is not None:
        yield None
        return
    watch = start(float(hang_timeout), world, first_phase)
    try:
        yield watch
    finally:
        if _current is watch:
            stop()
        else:
            watch.stop()


def start(timeout: float, world, first_phase: str = FORMING) -> "StartupWatch":
    """Start watching the calling thread's start-up as rank ``world.rank`` (the one watch of this process)."""
    global _current
    if _current is not None:
        _current.stop()
    _current = StartupWatch(timeout, world, first_phase)
    return _current


def phase(name: str) -> None:
    """Mark that this rank's start-up entered phase ``name`` (progress); nothing when no watch runs."""
    watch = _current
    if watch is not None:
        watch.mark(name)


def stop() -> None:
    """End this process's start-up watch (its first step is near: the hang watchdog takes over)."""
    global _current
    watch, _current = _current, None
    if watch is not None:
        watch.stop()


class StartupWatch:
    """Watches the thread that created it; see the module's docstring."""

    def __init__(self, timeout: float, world, first_phase: str):
        self.timeout, self.world = timeout, world
        self.beat = (time.monotonic(), first_phase)  # (monotonic time, phase) of the last progress
        self._watched = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="torchstage-startup-watch", daemon=True)
        self._thread.start()

    def mark(self, name: str) -> None:
        self.beat = (time.monotonic(), name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        interval = min(max(self.timeout / 10, 0.05), 1.0)
        noted, seen, arrivals, lock = set(), {}, None, None
        building = 0.0  # the last progress of an extension build seen (kept once the build is over)
        while not self._stop.wait(interval):
            started, name = self.beat
            now = time.monotonic()
            frame = sys._current_frames().get(self._watched)
            lock = lock_wait(frame)
            if lock is not None:
                if now - seen.setdefault(lock.path, now) >= LOCK_NOTE_SECONDS and lock.path not in noted:
                    noted.add(lock.path)
                    logger.warning("torchstage: rank %d %s", self.world.rank, lock_note(lock, lock.holder()))
            building = max(building, build_progress(frame, lock, now))
            last = max(started, building)
            if name == FORMING and now - started >= REGISTER_SECONDS:
                arrivals = arrivals or Arrivals(self.world)
                arrivals.register()
                if now - started >= RENDEZVOUS_NOTE_SECONDS and "rendezvous" not in noted:
                    noted.add("rendezvous")
                    logger.warning("torchstage: rank %d has waited %.0f s to form the world: %s", self.world.rank,
                                   now - started, arrivals.describe())
            if now - last >= self.timeout:
                break
        else:
            return
        self._fire(frame, name, lock, arrivals)

    def _fire(self, frame, name: str, lock, arrivals) -> None:
        rank = self.world.rank
        entries = traceback.extract_stack(frame) if frame is not None else []
        waiting = _collective(entries)
        if waiting:  # let the peer this rank waits for (stuck elsewhere) report first, with its stack
            if self._stop.wait(5.0 if rank == 0 else 10.0):
                return
        if lock is not None:
            state = (f"waiting for torch's extension build lock {lock.path} ({format_age(lock.age())} old; delete "
                     f"it if no build is running)")
        elif waiting:
            state = f"waiting in {waiting}"
        else:
            state = f"stopped in {_short(entries[-1])}" if entries else "stopped (no stack)"
        lines = [f"torchstage: rank {rank} made no progress for {self.timeout:g} s during start-up, while {name} "
                 f"(hang_timeout={self.timeout:g}). Python stack of its main thread (most recent call last):"]
        lines.extend(line.rstrip("\n") for line in traceback.format_list(entries))
        if lock is not None:
            lines.append(f"torchstage: rank {rank} {lock_note(lock, lock.holder())}")
        if arrivals is not None:
            lines.append(f"torchstage: forming the world: {arrivals.describe()}")
        lines.append(f"torchstage: start-up hang on rank {rank} while {name}; {state}; ending the job with exit "
                     f"code {EXIT_CODE}.")
        record_failure(rank, f"hang during start-up: no progress for {self.timeout:g} s while {name}; {state}", {})
        try:
            sys.stderr.write("\n".join(lines) + "\n")  # a dying process's report, like a traceback
            sys.stderr.flush()
        finally:
            os._exit(EXIT_CODE)


def _collective(entries) -> str:
    """``torch.distributed.barrier called from setup.py:40 in prepare`` when the stack waits in a collective."""
    marker = f"{os.sep}torch{os.sep}distributed{os.sep}"
    for index, entry in enumerate(entries):
        if marker in entry.filename:
            callers = [e for e in entries[:index] if f"{os.sep}torch{os.sep}" not in e.filename]
            name = next((e.name for e in entries[index:] if e.filename.endswith("distributed_c10d.py")), entry.name)
            return f"torch.distributed.{name}" + (f" called from {_short(callers[-1])}" if callers else "")
    return ""


def _short(entry) -> str:
    return f"{entry.filename}:{entry.lineno} in {entry.name}"
