"""A logger's files, kept open and written by the run's file writer thread: a row or an event costs the
training thread a hand-over, never an open, a write or a wait on the file system."""
import os

from torchstage.files.atomic import write_atomic
from torchstage.files.writer import hand_over


class LogFiles:
    """Appends and atomic rewrites of log files, run in the order they are handed over on the run's file
    writer thread (here, outside a run), so a checkpoint handed over later lands after the rows it counts.
    The open files are touched by those jobs only; each write is flushed to the OS before the next job."""

    def __init__(self):
        self._open = {}  # path -> file open for appending

    def append(self, runner, path: str, data: bytes) -> None:
        """Add ``data`` at the end of ``path`` (made, with its folder, if missing)."""
        hand_over(runner.file_writer, lambda: self._append(path, data), large=False)

    def replace(self, runner, path: str, data: bytes) -> None:
        """Make ``data`` the whole of ``path``, atomically (a crash leaves the old file or the new one)."""
        hand_over(runner.file_writer, lambda: self._replace(path, data), large=False)

    def close(self, runner) -> None:
        """Close every file once the writes handed over before have landed."""
        hand_over(runner.file_writer, self._close_all, large=False)

    def _append(self, path: str, data: bytes) -> None:
        file = self._open.get(path)
        if file is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            file = self._open[path] = open(path, "ab")
        file.write(data)
        file.flush()

    def _replace(self, path: str, data: bytes) -> None:
        file = self._open.pop(path, None)
        if file is not None:
            file.close()
        write_atomic(path, data, durable=False)

    def _close_all(self) -> None:
        files, self._open = self._open, {}
        for file in files.values():
            file.close()

    def __deepcopy__(self, memo):  # a copied logger (a config, a stage) writes through files of its own
        return LogFiles()
