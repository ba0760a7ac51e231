"""Checkpoint files written by one background thread, in the order the training thread handed them over.

The training thread takes the snapshot (serializes the state to bytes) and goes on training; the thread
writes each file atomically (temporary file, fsync, rename), so a crash at any moment leaves the previous
file or the new one, never a mix, and files land in order: the ``last.pth`` of epoch 5 never replaces that
of epoch 6. A failed write stops the queue (nothing handed over after it runs, so no kept top-k file is
deleted after its successor failed to land) and is raised in the training thread at its next hand-over or
at :meth:`FileWriter.wait`, which the run calls before anything reads the files and when it ends.
"""
import queue
import threading

#: Jobs that may wait for the thread (an epoch hands over two: its checkpoint files, then the summary and
#: deletions); a further hand-over blocks until one starts. So besides the checkpoint being written at most
#: one more serialized checkpoint is held in memory: a large model on a slow disk cannot fill the host's RAM.
MAX_PENDING = 2


def hand_over(writer, job) -> None:
    """``job`` to ``writer``'s thread, or run here when there is no writer (outside a run)."""
    if writer is None:
        job()
    else:
        writer.submit(job)


class FileWriter:
    """One daemon thread running file jobs in order; started at the first job, so a run that writes nothing
    (or a rank that writes no files) has no thread."""

    def __init__(self, max_pending: int = MAX_PENDING):
        self._jobs = queue.Queue(max_pending)
        self._error = None
        self._thread = None

    def submit(self, job) -> None:
        """Run ``job()`` (a callable writing files) after every job handed over before it."""
        self._raise_error()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="torchstage-file-writer", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def wait(self) -> None:
        """Block until every job handed over so far has run; raise the first failure (once)."""
        if self._thread is not None:
            self._jobs.join()
        self._raise_error()

    def close(self) -> None:
        """Wait for the pending jobs, then end the thread; raises the first failure like :meth:`wait`."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread.join()
                self._thread = None

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:  # after a failure nothing more runs until it was raised
                    job()
            except BaseException as error:  # raised in the training thread, which knows what to do with it
                self._error = error
            finally:
                self._jobs.task_done()
