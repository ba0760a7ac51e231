"""Waits before the first step that the start-up watch names: torch's extension build lock, a rendezvous missing ranks.

torch builds a JIT extension (``torch.utils.cpp_extension.load``, DeepSpeed's ops) under a lock file in the build
folder; a process killed while building leaves the lock behind, and every later process waits for it forever in
``FileBaton.wait()`` without a word. A rendezvous waits, also silently, for ranks that never start.
"""
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

from torchstage.launch.resolve import restart_attempt

_BATON = os.path.join("utils", "file_baton.py")
_EXTENSION = os.path.join("utils", "cpp_extension.py")
#: Functions of torch.utils.cpp_extension that compile (a running build is progress).
_BUILDING = ("_run_ninja_build", "_write_ninja_file_and_build_library", "_build_extension_module")
#: Seconds between attempts to reach a rendezvous store that does not answer yet.
RETRY_SECONDS = 5.0
#: Worlds larger than this are counted, not listed rank by rank, when a rendezvous is late.
LIST_RANKS = 1024


@dataclass(frozen=True)
class LockWait:
    """A wait in ``FileBaton.wait()`` for the lock file at ``path``."""

    path: str

    def holder(self):
        """The id of a process on this machine that holds the lock open (torch's builder does until its build
        ends), 0 when none does, None when this machine cannot tell (no /proc)."""
        return open_by(self.path)

    def age(self) -> float:
        """Seconds since the lock was created (0 once it is gone)."""
        try:
            return max(0.0, time.time() - os.stat(self.path).st_mtime)
        except OSError:
            return 0.0


def lock_wait(frame):
    """The :class:`LockWait` a thread whose innermost frame is ``frame`` is in, else None."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wait" and code.co_filename.endswith(_BATON):
            path = getattr(frame.f_locals.get("self"), "lock_file_path", None)
            return LockWait(str(path)) if path else None
        frame = frame.f_back
    return None


def open_by(path: str):
    """The id of a process on this machine with ``path`` open, 0 for none, None where /proc cannot say."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    target = os.path.realpath(path)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                if os.readlink(fd.path) == target:
                    return int(entry.name)
        except OSError:  # gone, or another user's
            continue
    return 0


def build_progress(frame, lock, now: float) -> float:
    """The monotonic time of the last progress of an extension build the thread takes part in: ``now`` while it
    compiles or while a process on this machine holds the lock it waits for (a build at work), else the newest
    change in the lock's folder (a build on another machine sharing it), else 0."""
    if lock is not None:
        if lock.holder():
            return now
        folder = os.path.dirname(lock.path)
        try:
            newest = max(entry.stat().st_mtime for entry in os.scandir(folder))
        except (OSError, ValueError):
            return 0.0
        return now - max(0.0, time.time() - newest)
    while frame is not None:
        if frame.f_code.co_name in _BUILDING and frame.f_code.co_filename.endswith(_EXTENSION):
            return now
        frame = frame.f_back
    return 0.0


def lock_note(lock: LockWait, holder=None) -> str:
    """What a wait for ``lock`` (held open by process ``holder``: see :meth:`LockWait.holder`) means and what to do."""
    start = f"waits for torch's extension build lock {lock.path}, created {format_age(lock.age())} ago"
    if holder:
        return (f"{start}: process {holder} holds it and is building the extension in {os.path.dirname(lock.path)} "
                f"(the first use of an op takes a minute or more; later runs load it)")
    why = ("no process on this machine holds it, so a build killed while it ran most likely left it behind"
           if holder == 0 else "another process builds the extension, or one killed while building left it behind")
    return (f"{start}; {why}. If no build is running (on any machine sharing {os.path.dirname(lock.path)}), delete "
            f"the lock: rm {lock.path}")


def format_age(seconds: float) -> str:
    """``45 s``, ``12 min 5 s``, ``3 h 20 min``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def ranges(ranks) -> str:
    """``0-3, 5, 7-8`` for sorted ranks."""
    parts, ranks = [], sorted(ranks)
    for rank in ranks:
        if parts and parts[-1][1] == rank - 1:
            parts[-1][1] = rank
        else:
            parts.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


class Arrivals:
    """The ranks that reached the rendezvous of ``world``, kept on its store (one key per rank, set once a
    rendezvous is late) by a client connection of this watch's own."""

    def __init__(self, world):
        self.world, self.store, self.error, self.next_try = world, None, None, 0.0
        self.prefix = f"torchstage/startup/{restart_attempt()}/arrived/"

    def register(self) -> None:
        """Set this rank's key (once; a store that does not answer yet is tried again next time)."""
        if self.store is not None or time.monotonic() < self.next_try:
            return
        self.next_try = time.monotonic() + RETRY_SECONDS
        try:  # a plain connection first: torch's client would log a C++ trace for each refused attempt
            socket.create_connection((self.world.master_addr, self.world.master_port), timeout=1).close()
        except OSError as e:
            self.error = f"{type(e).__name__}: {e}"
            return
        try:
            import torch.distributed as dist  # heavy: only once a rendezvous is late
            store = dist.TCPStore(self.world.master_addr, self.world.master_port, None, False,
                                  timedelta(seconds=2), wait_for_workers=False)
            store.set(f"{self.prefix}{self.world.rank}", "1")
            store.add(f"{self.prefix}count", 1)
            self.store, self.error = store, None
        except Exception as e:  # not up yet (rank 0 hosts it), or unreachable
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    def describe(self) -> str:
        """``ranks 0, 2-3 of 4 arrived; rank 1 is missing (...)``, or why the store cannot say."""
        where = f"{self.world.master_addr}:{self.world.master_port}"
        if self.store is None:
            return (f"the rendezvous store at {where} does not answer ({self.error}); rank 0 hosts it: rank 0 has not "
                    f"started forming the world yet (not started, or stuck before train()), or MASTER_ADDR/"
                    f"MASTER_PORT do not reach it")
        size = self.world.world_size
        try:
            if size > LIST_RANKS:
                count = self.store.add(f"{self.prefix}count", 0)
                return f"{count} of {size} ranks arrived at the rendezvous ({where}); {size - count} are missing"
            here = [r for r in range(size) if self.store.check([f"{self.prefix}{r}"])]
        except Exception as e:
            return f"the rendezvous store at {where} stopped answering ({type(e).__name__})"
        missing = sorted(set(range(size)) - set(here))
        lacks = (f"rank{'s' * (len(missing) > 1)} {ranges(missing)} {'are' if len(missing) > 1 else 'is'} missing "
                 f"(not started, or stuck before train())") if missing else "none is missing"
        return f"rank{'s' * (len(here) > 1)} {ranges(here)} of {size} arrived at the rendezvous ({where}); {lacks}"
