"""Hang detection: a thread per rank ends the job when the loop makes no progress for ``timeout`` seconds.

Every batch boundary counts as progress. A rank whose main thread is stuck outside a collective (a
sleeping callback, a deadlock in user code) logs its rank, its place in the loop and its Python stack,
and exits with code 124, so the launcher ends the other ranks within seconds. A rank that waits inside
a collective names itself as waiting for the others and exits only after twice the timeout.
"""
import os
import sys
import threading
import time
import traceback

from torchstage.callbacks.base import Callback

#: The exit code of a rank ended by the watchdog (as coreutils' ``timeout``).
HANG_EXIT_CODE = 124


class HangWatchdogCallback(Callback):
    """Ends this process when no batch starts or ends for ``timeout`` seconds (``train(hang_timeout=...)``)."""

    order = -1  # before the loop callback: a batch start counts as soon as it happens
    name = "watchdog"

    def __init__(self, timeout: float = 300):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"hang_timeout must be a number of seconds > 0 (or None: no watchdog), got {timeout!r}")
        self.timeout = float(timeout)
        self._last, self._where, self._stop, self._thread = 0.0, "starting", None, None

    def on_experiment_start(self, runner):
        self._last, self._stop = time.monotonic(), threading.Event()
        main = threading.main_thread().ident if threading.current_thread() is threading.main_thread() \
            else threading.get_ident()
        self._thread = threading.Thread(target=self._watch, args=(runner.engine.rank, main), daemon=True,
                                        name="torchstage-watchdog")
        self._thread.start()

    def _progress(self, runner, event):
        self._last = time.monotonic()
        self._where = (f"stage {runner.stage_key!r}, epoch {runner.epoch}, loader {runner.loader_key!r}, "
                       f"batch {runner.batch_step} (in {event} or later)")

    def on_batch_start(self, runner):
        self._progress(runner, "on_batch_start")

    def on_batch_end(self, runner):
        self._progress(runner, "on_batch_end")

    def on_loader_start(self, runner):
        self._progress(runner, "on_loader_start")

    def on_loader_end(self, runner):
        self._progress(runner, "on_loader_end")

    def on_experiment_end(self, runner):
        self._release()

    def on_exception(self, runner):
        self._release()

    def _release(self):
        if self._stop is not None:
            self._stop.set()

    def _watch(self, rank: int, main_ident: int) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last
            if idle < self.timeout:
                continue
            frame = sys._current_frames().get(main_ident)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)\n"
            waiting = "torch/distributed" in stack
            if waiting and idle < 2 * self.timeout:
                continue  # in a collective: give the rank that is really stuck the time to say so
            what = "waits in a collective for the other ranks" if waiting else "is stuck"
            # Straight to stderr: this rank may not be the main one, whose logger alone prints.
            sys.stderr.write(f"torchstage hang: rank {rank} made no progress for {idle:.0f} s "
                             f"(hang_timeout={self.timeout:g}) and {what}; it was at {self._where}. "
                             f"Its Python stack:\n{stack}")
            sys.stderr.flush()
            os._exit(HANG_EXIT_CODE)
