"""The folder where a launcher's ranks write their failure records: made for the launcher, removed as it ends, and
removed by the next launcher of the machine where a kill (SIGKILL, the OOM killer) left it no time to.

The launcher holds a lock (``flock``) on a file in the folder for as long as it lives. The kernel releases the lock
when the last process holding it dies, however it dies, so a folder whose lock can be taken is an orphan.
"""
import fcntl
import os
import shutil
import tempfile
import time

PREFIX = "torchstage-failures-"
LOCK = ".held"
#: A folder whose lock is younger than this is never removed: its launcher may not have taken the lock yet.
SETTLE_SECONDS = 10.0


class FailureFolder:
    """A new, locked failure folder in ``parent`` (the temp directory), once the orphans there are removed."""

    def __init__(self, parent: str = None):
        sweep(parent)
        self.path = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
        self._lock = os.open(os.path.join(self.path, LOCK), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def clear(self) -> None:
        """Remove the records of an earlier attempt (the lock stays)."""
        for name in os.listdir(self.path):
            if name != LOCK:
                os.remove(os.path.join(self.path, name))

    def remove(self) -> None:
        os.close(self._lock)
        shutil.rmtree(self.path, ignore_errors=True)


def sweep(parent: str = None, settle: float = SETTLE_SECONDS) -> list:
    """Remove the failure folders in ``parent`` whose launcher died without removing them; their paths. Folders
    without a lock file (made by torchstage before 2026-11-30) are left alone."""
    parent = parent or tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(parent) if name.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(parent, name)
        if _orphan(os.path.join(path, LOCK), settle):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _orphan(lock: str, settle: float) -> bool:
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # no lock file, not ours to read, or removed meanwhile
        return False
    try:
        if time.time() - os.fstat(fd).st_mtime < settle:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held: its launcher lives
        return False
    finally:
        os.close(fd)
