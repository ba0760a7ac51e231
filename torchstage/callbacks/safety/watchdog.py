"""Hang detection: a rank that makes no progress for ``hang_timeout`` seconds ends the job with a report.

Each event stores a timestamp (the only per-batch cost: no lock, no host sync). A daemon thread wakes a
few times per timeout, posts this rank's position to the watchdogs' board in the process group's store
(:mod:`~torchstage.distributed.hang_board`) when it changed and, once no event came for ``timeout`` seconds,
writes to stderr where every rank was (read back from the board), which ranks stopped outside a collective
(what the others wait for), and the Python stack of this rank's training thread, then ends the
process (exit code :data:`HANG_EXIT_CODE`); the launcher, torchrun or ``srun --kill-on-bad-exit`` stops
the others. A rank waiting in a collective for a stuck peer fires too, but gives that peer a few seconds
to report first.
"""
import os
import sys
import threading
import time
import traceback

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope
from torchstage.callbacks.safety.hang_report import (describe, hang_report, hung_rank, position, record_position,
                                                     state, where)
from torchstage.distributed.hang_board import HangBoard
from torchstage.launch.enter import check_hang_timeout
from torchstage.launch.failures import STILL_RUNNING, asked_path, read_asked, record_failure
from torchstage.launch.flight_recorder import TAIL, behind, compare, recent, write_dump


#: Exit code of a rank ended by the watchdog (the convention of GNU ``timeout``).
HANG_EXIT_CODE = 124
#: A rank that reports only itself waits this long for the rank a full report names (beyond its pause), then this
#: long for the full reporter to end first.
_HUNG_WAIT, _AFTER_FULL = 10.0, 2.0
#: Seconds between looks for the launcher's request for a record (a stat of one file).
ASK_POLL = 0.2


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
    def _answer(self, runner, loop_thread: int, request) -> None:
        """Record where this rank is, as its launcher asked after another rank failed: its collectives (for the
        summary and ``torchstage diagnose``) and its place, with the collective its loop waits in, if any."""
        rank, frame = runner.engine.rank, sys._current_frames().get(loop_thread)
        mine = {**position(runner, self._beat), **where(frame)}
        collectives = recent()
        write_dump(getattr(runner.spec, "logdir", None), rank, collectives)
        failed = (request or {}).get("failed")
        record_failure(rank, f"{STILL_RUNNING} still running when rank {failed} failed, at {describe(mine)}"
                             f"{state(mine)}", runner.loop_position(), collectives[-TAIL:])

    def _watch(self, runner, loop_thread: int, stop: threading.Event) -> None:
        rank = runner.engine.rank
        board = HangBoard(runner.engine.world_size)
        interval = min(max(self.timeout / 10, 0.05), 5.0)
        asked = asked_path()  # the launcher's request for a record, after another rank failed
        poll, due = (min(interval, ASK_POLL) if asked else interval), 0.0
        published = None
        while not stop.wait(poll):
            if asked is not None and os.path.exists(asked):
                return self._answer(runner, loop_thread, read_asked(asked))
            if time.monotonic() < due:
                continue
            due = time.monotonic() + interval
            beat = self._beat
            if beat is not published:
                published = beat
                board.post_beat(rank, position(runner, beat))
            if time.monotonic() - beat[0] >= self.timeout:
                break
        else:
            return
        frame = sys._current_frames().get(loop_thread)
        mine = {**position(runner, beat), **where(frame)}
        collectives = recent()  # torch's Flight Recorder: what this rank ran, for the report and the logdir
        board.post_fired(rank, mine, collectives[-TAIL:])
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
        full = rank == 0 or (not mine["waiting"] and board.take_report_slot())
        ranks = board.read_positions() if full else {}
        ranks[rank] = mine
        recorded = board.read_collectives(deadline=time.monotonic() + 2 * interval) if full else {}
        compared = (compare(recorded) if full else [
            f"(rank {rank} waits for a peer and reports only itself; rank 0's report and that of a rank stopped "
            f"outside any collective list every rank)"])
        hung = hung_rank(ranks, behind(recorded), rank)
        if not full:  # a full report names the rank the others wait for: this one's headline names it too
            told = board.await_hung(time.monotonic() + _HUNG_WAIT)
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
                board.post_hung(hung, None if hung is None else ranks.get(hung))
        finally:
            os._exit(HANG_EXIT_CODE)

