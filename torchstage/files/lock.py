"""One writer per logdir: a lock file naming its holder (host, pid, start time, SLURM job), taken before any write.

The lock is a file created with ``O_EXCL`` in the logdir. A second run on a held logdir fails at once
naming the holder. A lock whose holder is gone is taken over: on the same host when the pid no longer
runs (or now belongs to another process), anywhere when it names this very SLURM job (a requeued job
restarting, possibly on another node).
"""
import json
import logging
import os
import socket
import time

from torchstage.launch.resolve import job_identity, restart_attempt, same_job

logger = logging.getLogger("torchstage")

LOCK_NAME = ".torchstage.lock"


class LogdirLocked(RuntimeError):
    """Another live run holds the logdir; the message names it and what to do."""


def _process_start(pid: int):
    """The start time (clock ticks since boot) of process ``pid`` from /proc, or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _holder() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "process_start": _process_start(pid),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "job": job_identity()}


def _alive(holder: dict) -> bool:
    """False when the holder is surely gone: same host, and its pid is free or names a newer process."""
    if holder.get("host") != socket.gethostname():
        return True  # another host: cannot tell, so it is held
    pid = holder.get("pid")
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True
    start = holder.get("process_start")
    return start is None or _process_start(int(pid)) in (None, start)


def describe(holder: dict) -> str:
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')}{job}"


class LogdirLock:
    """The lock of ``logdir``: :meth:`acquire` before the run writes anything, :meth:`release` when it ends."""

    def __init__(self, logdir: str):
        self.path = os.path.join(os.fspath(logdir), LOCK_NAME)
        self.held = False

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; raise :class:`LogdirLocked` naming a live holder."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(3):  # a takeover race with another starter: look again
            if self._create():
                return
            holder = self._read()
            if holder is None:
                continue  # released (or being written) just now
            reason = self._stale_reason(holder)
            if reason is None:
                raise self._locked(holder)
            stale = f"{self.path}.stale.{os.getpid()}"
            try:
                os.rename(self.path, stale)  # only one taker wins the rename
            except FileNotFoundError:
                continue
            os.remove(stale)
            logger.warning("logdir lock %s: taking over from %s (%s)", self.path, describe(holder), reason)
        raise LogdirLocked(f"could not take the logdir lock {self.path}: other runs keep taking it")

    def check(self) -> None:
        """Raise :class:`LogdirLocked` if a live run holds the lock now; reads only (creates nothing)."""
        holder = self._read() if os.path.exists(self.path) else None
        if holder and self._stale_reason(holder) is None:
            raise self._locked(holder)

    def _locked(self, holder: dict) -> LogdirLocked:
        return LogdirLocked(f"logdir {os.path.dirname(self.path)!r} is being written by another run "
                            f"({describe(holder)}; lock file {self.path}). Wait for it to end, or use another "
                            f"logdir; if that run is gone on another host, delete the lock file")

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(_holder(), f)
            f.flush()
            os.fsync(f.fileno())
        self.held = True
        return True

    def _read(self):
        for _ in range(20):  # the creator writes its content right after O_EXCL: give it a moment
            try:
                with open(self.path) as f:
                    return json.load(f)
            except FileNotFoundError:
                return None
            except ValueError:
                time.sleep(0.05)
        return {}  # unreadable: an old crash mid-write; the holder is unknown

    @staticmethod
    def _stale_reason(holder: dict):
        job = os.environ.get("SLURM_JOB_ID")
        if job and holder.get("slurm_job_id") == job:
            return f"the same SLURM job {job}, requeued or restarted"
        if restart_attempt() > 0 and same_job(holder.get("job") or {}):
            return f"the same job ({', '.join(f'{k} {v}' for k, v in holder['job'].items())}), restarted"
        if not holder:
            return "the lock file is empty or unreadable"
        if not _alive(holder):
            return "that process is gone"
        return None

    @classmethod
    def on_main_rank(cls, logdir, engine, take: bool):
        """Check (``take=False``) or take the lock on the main rank; every rank raises if it is held."""
        lock, error = cls(logdir), None
        if engine.is_main:
            try:
                lock.acquire() if take else lock.check()
            except LogdirLocked as e:
                error = str(e)
        error = engine.broadcast_object(error)
        if error is not None:
            raise LogdirLocked(error)
        return lock

    def release(self) -> None:
        """Remove the lock if this process holds it (it checks the pid, so a taken-over lock stays)."""
        if not self.held:
            return
        self.held = False
        holder = self._read()
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
