"""DataLoader workers that never start, started again instead of hanging the run.

A worker started by ``fork`` while another thread of the rank holds a lock the child needs waits forever before its
first line: CPython before 3.11.10 (and 3.9.20, 3.10.15) deadlocks such a child in ``PyOS_AfterFork_Child`` when
another thread was creating or deleting a Python thread state (gh-112275; under torch.distributed gloo's threads do,
as they release tensors). The rank then waits for a batch that never comes until the hang watchdog ends the job.
Persistent workers (:func:`~torchstage.data.fork_check.keeps_workers`) make the fork rare, not impossible.

So each fork-started worker first marks itself started (its ``worker_init_fn`` is wrapped, in shared memory), and
the loop waits for every mark after a pass starts its workers (a resumed pass's too). A worker without one after
:data:`START_SECONDS` (``$TORCHSTAGE_WORKER_START_SECONDS``) is killed, the workers are ended and started again
from the random state the pass began with (the same batches; a resumed pass skips the same ones), with a warning.
Later passes of persistent workers fork nothing and wait for nothing.
"""
import logging
import multiprocessing
import os
import signal
import sys
import time

from torchstage.data.fork_check import fork_deadlock_risk, forks_workers
from torchstage.data.loader_rng import apply_loader_rng, capture_loader_rng, reuses_iterator

logger = logging.getLogger("torchstage")

#: Seconds a forked worker has to reach its first line: a started one takes milliseconds, a loaded machine seconds.
START_SECONDS = 30.0
START_ENV = "TORCHSTAGE_WORKER_START_SECONDS"
#: Starts of one pass's workers before the run fails naming the stuck worker.
MOST_STARTS = 3


class MarkStart:
    """A loader's ``worker_init_fn`` that marks its worker started (shared memory a fork inherits), then runs the
    loader's own ``then``."""

    def __init__(self, workers: int, then=None):
        self.marks = multiprocessing.get_context("fork").RawArray("b", workers)
        self.then = then

    def __call__(self, worker_id: int) -> None:
        self.marks[worker_id] = 1
        if self.then is not None:
            self.then(worker_id)

    def reset(self) -> None:
        self.marks[:] = bytes(len(self.marks))

    def missing(self) -> list:
        return [index for index, mark in enumerate(self.marks) if not mark]


def start_seconds(environ=None) -> float:
    """:data:`START_SECONDS`, or ``$TORCHSTAGE_WORKER_START_SECONDS`` (a number > 0); ValueError otherwise."""
    value = (os.environ if environ is None else environ).get(START_ENV, "")
    if value == "":
        return START_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{START_ENV} must be a number of seconds > 0, got {value!r}")
    return seconds


def started(loader, make=None):
    """``make()`` (default ``iter(loader)``; a resumed pass passes its own), an iterator over ``loader`` whose
    fork-started workers all reached their first line; a start again calls ``make`` again from the random state
    the first call began with, so ``make`` builds what it returns anew (see the module's text)."""
    make = make or (lambda: iter(loader))
    if not forks_workers(loader) or not sys.platform.startswith("linux"):
        return make()
    mark = loader.worker_init_fn
    if not isinstance(mark, MarkStart) or len(mark.marks) != loader.num_workers:
        mark = loader.worker_init_fn = MarkStart(loader.num_workers, loader.worker_init_fn)
    if reuses_iterator(loader):
        return make()  # its workers started with an earlier pass
    rng = capture_loader_rng(loader)
    limit = start_seconds()
    for attempt in range(1, MOST_STARTS + 1):
        mark.reset()
        iterator = make()
        stuck = _stuck(mark, iterator, limit)
        if not stuck:
            return iterator
        pids = [iterator._workers[index].pid for index in stuck]
        cause = ("CPython gh-112275, fixed in 3.11.10 and 3.12: upgrade Python" if fork_deadlock_risk()
                 else "a lock another thread held when it was forked")
        if attempt == MOST_STARTS:
            _end(loader, iterator, stuck)
            raise RuntimeError(f"DataLoader worker(s) {stuck} (pid(s) {pids}) did not start within {limit:g} s of "
                               f"their fork, {MOST_STARTS} times ({cause})")
        logger.warning("DataLoader worker(s) %s (pid(s) %s) did not reach their first line within %g s of their "
                       "fork (%s); they are killed and the pass's workers started again (start %d of at most %d)",
                       stuck, pids, limit, cause, attempt + 1, MOST_STARTS)
        _end(loader, iterator, stuck)
        apply_loader_rng(loader, rng)  # the new iterator draws its seeds and order as the first did


def _stuck(mark: MarkStart, iterator, limit: float) -> list:
    """The workers of ``iterator`` still alive without a mark after ``limit`` s (a dead one is the loader's to
    report), or [] once every live one marked."""
    workers = getattr(iterator, "_workers", [])
    deadline = time.monotonic() + limit
    while True:
        missing = [index for index in mark.missing() if index < len(workers) and workers[index].is_alive()]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.005)


def _end(loader, iterator, stuck) -> None:
    """Kill the stuck workers and end the iterator's others, without the loader taking the kill for a failure."""
    from torch.utils.data._utils import signal_handling
    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for index in stuck:
        try:
            os.kill(iterator._workers[index].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    iterator._shutdown_workers()
    if loader.persistent_workers:
        loader._iterator = None
