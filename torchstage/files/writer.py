"""Checkpoint and log files written by one background thread, in the order the training thread handed them over.

The training thread takes the host copy of the state (:func:`~torchstage.files.checkpoint_write.host_copy`) and goes
on training; the thread serializes it and writes each file atomically (temporary file, fsync, rename), so a crash
at any moment leaves the previous file or the new one, never a mix, and files land in order: the ``last.pth`` of epoch 5 never replaces that
of epoch 6. A failed write stops the queue (nothing handed over after it runs, so no kept top-k file is
deleted after its successor failed to land) and is raised in the training thread at its next hand-over or
at :meth:`FileWriter.wait`, which the run calls before anything reads the files and when it ends. The
loggers' rows and events go through the same queue, so a log file write never makes training wait on the
file system, and a checkpoint that counts a log's rows lands after them.

Light jobs (a log row, ``metrics.json``) handed over while the thread is idle are held and handed over
together: with the next checkpoint, at :meth:`FileWriter.wait`, or after :data:`HOLD_SECONDS`. Waking the
thread costs both threads more than the write itself (the GIL changes hands at each of its system calls),
so an epoch's files wake it once instead of once per loader, logger and checkpoint.
"""
import functools
import queue
import threading

#: Large jobs (a checkpoint's host copy) handed over and not yet finished, the one being written included; a
#: further large hand-over blocks until one finishes, and a save takes its host copy only then
#: (:meth:`FileWriter.wait_for_room`). So no two saves overlap and the host holds at most one copy of the
#: state besides the live one: a large model on a slow disk cannot fill the host's RAM. Small jobs (log
#: rows, ``metrics.json``, deletions) never wait for a checkpoint to land.
MAX_PENDING = 1
#: Seconds a light job handed over to an idle thread may be held before the thread runs it (log files lag
#: the run by at most this much; a checkpoint or a wait hands the held jobs over at once).
HOLD_SECONDS = 1.0


def hand_over(writer, job, large: bool = True) -> None:
    """``job`` to ``writer``'s thread, or run here when there is no writer (outside a run); ``large=False``
    for jobs that hold little memory (a log row), which are not bounded by :data:`MAX_PENDING`."""
    if writer is None:
        job()
    else:
        writer.submit(job, large)


def _run_in_order(jobs: list) -> None:
    """Held light jobs as one job of the queue: the first that fails stops the ones after it."""
    for job in jobs:
        job()


class FileWriter:
    """One daemon thread running file jobs in order; started at the first job, so a run that writes nothing
    (or a rank that writes no files) has no thread."""

    def __init__(self, max_pending: int = MAX_PENDING, hold_seconds: float = HOLD_SECONDS):
        self._jobs = queue.Queue()
        self.max_pending = max_pending
        self._large = threading.Semaphore(max_pending)  # a permit per large job until it has run
        self._held, self._lock = [], threading.Lock()  # light jobs not handed to the idle thread yet
        self._hold_seconds = hold_seconds
        self._error = None
        self._thread = None

    def submit(self, job, large: bool = True) -> None:
        """Run ``job()`` (a callable writing files) after every job handed over before it; a ``large`` one
        first waits until fewer than ``max_pending`` large jobs are unfinished, a light one handed over while
        the thread is idle is held (see the module's docstring)."""
        self._raise_error()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="torchstage-file-writer", daemon=True)
            self._thread.start()
        if large:
            self._hand_held()  # ahead of it, before any wait for a permit
            self._large.acquire()
        with self._lock:
            if not large and not self._jobs.unfinished_tasks:  # idle thread: hold, do not wake it for this
                self._held.append(job)
                return
            self._hand_held_locked()
            self._jobs.put((job, large))

    def wait_for_room(self) -> None:
        """Block until a large job may be handed over without waiting (the previous checkpoint landed, when only
        one is allowed): call it before taking the next host copy, so two are never held at once."""
        self._raise_error()
        if self._thread is not None:
            self._hand_held()
            self._large.acquire()
            self._large.release()

    def wait(self) -> None:
        """Block until every job handed over so far has run; raise the first failure (once)."""
        if self._thread is not None:
            self._hand_held()
            self._jobs.join()
        self._raise_error()

    def close(self) -> None:
        """Wait for the pending jobs, then end the thread; raises the first failure like :meth:`wait`."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._jobs.put((None, False))
                self._thread.join()
                self._thread = None

    def _hand_held(self) -> None:
        with self._lock:
            self._hand_held_locked()

    def _hand_held_locked(self) -> None:
        """The held light jobs into the queue as one job, which stops at the first that fails."""
        if self._held:
            held, self._held = self._held, []
            self._jobs.put((functools.partial(_run_in_order, held), False))

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _work(self) -> None:
        while True:
            try:
                job, large = self._jobs.get(timeout=self._hold_seconds)
            except queue.Empty:  # idle for a while: light jobs held since are due
                self._hand_held()
                continue
            try:
                if job is None:
                    return
                if self._error is None:  # after a failure nothing more runs until it was raised
                    job()
            except BaseException as error:  # raised in the training thread, which knows what to do with it
                self._error = error
            finally:
                job = None  # a checkpoint's host copy is freed as soon as its files landed, not at the next job
                if large:
                    self._large.release()
                self._jobs.task_done()
