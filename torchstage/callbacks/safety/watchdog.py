"""Hang detection: a rank that makes no progress for ``hang_timeout`` seconds ends the job with a report.

Each event stores a timestamp (the only per-batch cost: no lock, no host sync). A daemon thread wakes a
few times per timeout, publishes this rank's position to the process group's store when it changed and,
once no event came for ``timeout`` seconds, writes to stderr where every rank was (read back from the
store), which ranks stopped outside a collective (what the others wait for), and the Python stack of this rank's training thread, then ends the
process (exit code :data:`HANG_EXIT_CODE`); the launcher, torchrun or ``srun --kill-on-bad-exit`` stops
the others. A rank waiting in a collective for a stuck peer fires too, but gives that peer a few seconds
to report first.
"""
import json
import os
import sys
import threading
import time
import traceback

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope
from torchstage.callbacks.safety.hang_report import (describe, hang_report, hung_rank, position, record_position,
                                                     state, where)
from torchstage.launch.enter import check_hang_timeout
from torchstage.launch.failures import record_failure
from torchstage.launch.flight_recorder import TAIL, behind, compare, recent, write_dump


#: Exit code of a rank ended by the watchdog (the convention of GNU ``timeout``).
HANG_EXIT_CODE = 124
#: Firing ranks that read every rank's state from the store: rank 0 and the first few stopped outside a
#: collective (the ones the others wait for). The rest report only themselves: with thousands of ranks, each
#: reading every other's state would be N² reads of one store.
FULL_REPORTS = 4
_REPORTERS = "torchstage/watchdog/reporters"
_BEAT, _FIRED, _COLLECTIVES = ("torchstage/watchdog/beat{}", "torchstage/watchdog/fired{}",
                               "torchstage/watchdog/collectives{}")
#: The rank a full report found the others waiting for (and where it was), for the ranks that report only
#: themselves: they wait this long for it beyond their pause, then this long for the full reporter to end first.
_HUNG, _HUNG_WAIT, _AFTER_FULL = "torchstage/watchdog/hung", 10.0, 2.0


class HangWatchdog(Callback):
    """Ends the job when this rank makes no progress (no batch, loader, epoch or stage event) for ``timeout`` s.

    Active with several processes only (one process has no peer waiting on it, and a debugger
    breakpoint must not kill it). ``timeout=None`` or ``0`` disables it.
    """

    order = CallbackOrder.Internal
    scope = CallbackScope.Distributed  # no cost in a single process

    def __init__(self, timeout=300):
        self.timeout = check_hang_timeout(timeout)
        self._beat = None  # (monotonic time, event) of the last progress, written per event (one clock read)
        self._thread = self._stop = None

    def handles(self, event: str) -> bool:
        return self.timeout is not None and super().handles(event)

    def attach(self, shared) -> None:
        shared.keep_in_nested_passes(self)  # a validation pass in the middle of an epoch beats on

    # ---- events: each one is progress ----------------------------------------------------------
    def on_experiment_start(self, runner):
        if self.timeout is None or not runner.engine.is_distributed:
            return
        self._mark("experiment start")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(runner, threading.get_ident(), self._stop),
                                        name="torchstage-hang-watchdog", daemon=True)
        self._thread.start()

    def on_stage_start(self, runner): self._mark("stage start")
    def on_epoch_start(self, runner): self._mark("epoch start")
    def on_loader_start(self, runner): self._mark("loader start")
    def on_batch_start(self, runner): self._mark("batch start")
    def on_batch_end(self, runner): self._mark("batch end")
    def on_loader_end(self, runner): self._mark("loader end")
    def on_epoch_end(self, runner): self._mark("epoch end")
    def on_stage_end(self, runner): self._mark("stage end")

    def on_experiment_end(self, runner):
        self._end()

    def on_exception(self, runner):
        self._end()

    def _mark(self, event: str) -> None:
        self._beat = (time.monotonic(), event)

    def _end(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join(timeout=5)
        self._thread = self._stop = None

    # ---- the watching thread ----------------------------------------------------------------------
    def _watch(self, runner, loop_thread: int, stop: threading.Event) -> None:
        store, rank, world_size = _store(), runner.engine.rank, runner.engine.world_size
        interval = min(max(self.timeout / 10, 0.05), 5.0)
        published = None
        while not stop.wait(interval):
            beat = self._beat
            if beat is not published:
                published = beat
                _publish(store, _BEAT.format(rank), position(runner, beat))
            if time.monotonic() - beat[0] >= self.timeout:
                break
        else:
            return
        frame = sys._current_frames().get(loop_thread)
        mine = {**position(runner, beat), **where(frame)}
        _publish(store, _FIRED.format(rank), mine)
        collectives = recent()  # torch's Flight Recorder: what this rank ran, for the report and the logdir
        _publish(store, _COLLECTIVES.format(rank), collectives[-TAIL:])
        write_dump(getattr(runner.spec, "logdir", None), rank, collectives)
        # A rank waiting in a collective lets the peer it waits for report first (with that peer's stack);
        # a rank stuck elsewhere gives the others a moment to say where they wait, then reports. When all
        # wait (mismatched collectives), rank 0, which holds the store, reports first.
        if mine["waiting"]:
            pause = 2 * interval + (5.0 if rank == 0 else 10.0)
        else:
            pause = min(1.0, self.timeout / 2)
        if stop.wait(pause):
            return
        full = rank == 0 or (not mine["waiting"] and _report_slot(store))
        ranks = _read_all(store, world_size) if full else {}
        ranks[rank] = mine
        recorded = _read_collectives(store, world_size, deadline=time.monotonic() + 2 * interval) if full else {}
        compared = (compare(recorded) if full else [
            f"(rank {rank} waits for a peer and reports only itself; rank 0's report and that of a rank stopped "
            f"outside any collective list every rank)"])
        hung = hung_rank(ranks, behind(recorded), rank)
        if not full:  # a full report names the rank the others wait for: this one's headline names it too
            told = _await(store, _HUNG, time.monotonic() + _HUNG_WAIT)
            if told:
                time.sleep(_AFTER_FULL)  # the full reporter is ending its process: its record and report come first
                if isinstance(told.get("rank"), int):
                    hung = told["rank"]
                    if told.get("info") and hung != rank:
                        ranks[hung] = told["info"]
        report = hang_report(rank, self.timeout, ranks, traceback.format_stack(frame) if frame else [], HANG_EXIT_CODE,
                             compared, hung)
        if hung is None or hung == rank:
            record_failure(rank, f"hang: no progress for {self.timeout:g} s after {describe(mine)}{state(mine)}",
                           runner.loop_position(), collectives[-TAIL:])
        else:  # the record names the rank the others wait for, where it was
            info = ranks.get(hung, {})
            since = f" after {describe(info)}{state(info)}" if info else ""
            record_failure(rank, f"hang: rank {hung} made no progress{since}; the other ranks wait for it (the "
                                 f"watchdog of rank {rank} fired after {self.timeout:g} s)",
                           record_position(info) if info else runner.loop_position(), collectives[-TAIL:],
                           origin_rank=hung)
        try:
            sys.stderr.write(report)  # a dying process's report, like a traceback: stderr, on every rank
            sys.stderr.flush()
            if full:  # last: the ranks that report only themselves wait for it
                _publish(store, _HUNG, {"rank": hung, "info": None if hung is None else ranks.get(hung)})
        finally:
            os._exit(HANG_EXIT_CODE)


def _store():
    """The default process group's store (shared by all ranks), or None (this rank then reports alone)."""
    try:
        from torch.distributed import distributed_c10d  # the store is not public API; any failure: no store
        return distributed_c10d._get_default_store()
    except Exception:
        return None


def _publish(store, key: str, info: dict) -> None:
    if store is not None:
        try:
            store.set(key, json.dumps(info))
        except Exception:
            pass


def _report_slot(store) -> bool:
    """True for the first :data:`FULL_REPORTS` ranks that ask (one atomic add on the store; True without one)."""
    try:
        return store is None or store.add(_REPORTERS, 1) <= FULL_REPORTS
    except Exception:
        return True


def _await(store, key: str, deadline: float):
    """The value a rank published under ``key``, waiting for it until ``deadline``; None without it."""
    try:
        while store is not None and not store.check([key]) and time.monotonic() < deadline:
            time.sleep(0.1)
        return json.loads(store.get(key)) if store is not None and store.check([key]) else None
    except Exception:
        return None


def _read_collectives(store, world_size: int, deadline: float) -> dict:
    """Rank -> the last collectives each firing watchdog published, waiting until ``deadline`` for all ranks."""
    keys = [_COLLECTIVES.format(rank) for rank in range(world_size)]
    if store is None:
        return {}
    try:
        while not all(store.check([key]) for key in keys) and time.monotonic() < deadline:
            time.sleep(0.1)
        return {rank: json.loads(store.get(key)) for rank, key in enumerate(keys) if store.check([key])}
    except Exception:
        return {}


def _read_all(store, world_size: int) -> dict:
    """Rank -> where it stands: what its watchdog reported when it fired, else its last heartbeat."""
    ranks = {}
    if store is None:
        return ranks
    try:
        for rank in range(world_size):
            for key in (_FIRED.format(rank), _BEAT.format(rank)):
                if store.check([key]):
                    ranks[rank] = json.loads(store.get(key))
                    break
    except Exception:
        pass
    return ranks
