"""The graceful-stop callback: at a batch boundary after a stop request, checkpoint on every rank and end the run."""
import logging
import signal

from torchstage.callbacks.base import Callback, CancelRun
from torchstage.callbacks.checkpoints.checkpoint_saver import CheckpointCallback
from torchstage.stop_request import DEFAULT_SIGNALS, SignalStop, agree, clear_stop_request, control_group, stop_requested

logger = logging.getLogger("torchstage")


class StopCallback(Callback):
    """Stops after the current train batch (or at epoch end) once ``signals`` or ``request_stop()`` asked.

    Every checkpoint callback writes ``last.pth`` at that point, then ``train()`` raises
    :class:`~torchstage.RunStopped`. Under several processes the ranks agree every ``check_every`` train
    batches and at each epoch end (one all-reduce of two integers on a CPU group: no GPU sync), so all
    stop after the same batch; raise ``check_every`` to trade stop latency for that small per-step cost.
    It runs after every other callback, so each one sees the last batch complete.
    """

    order = 10_000
    name = "stop"
    train_batches_only = True

    def __init__(self, signals=DEFAULT_SIGNALS, check_every: int = 1):
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"check_every must be an integer >= 1, got {check_every!r}")
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.check_every = check_every
        self._handlers, self._group, self._distributed = None, None, False

    def on_experiment_start(self, runner):
        clear_stop_request()
        runner.stop_request = None
        self._handlers = SignalStop(self.signals)
        self._handlers.install()
        self._distributed = runner.engine.is_distributed
        self._group = control_group() if self._distributed else None

    def on_batch_end(self, runner):
        if not self._distributed:  # one process: a look at the flag that a signal handler sets
            if stop_requested() is not None and runner.is_train_loader:
                self._check(runner)
        elif runner.is_train_loader and runner.global_batch_step % self.check_every == 0:
            self._check(runner)

    def on_epoch_end(self, runner):
        self._check(runner)

    def on_experiment_end(self, runner):
        self._release()

    def on_exception(self, runner):
        self._release()

    def _release(self):
        if self._handlers is not None:
            self._handlers.restore()
            self._handlers = None
        clear_stop_request()

    def _check(self, runner):
        request = stop_requested()
        if runner.engine.is_distributed:
            request = agree(request, self._group)
        if request is None:
            return
        runner.stop_request = request
        paths = [cb.save_last(runner) for cb in runner.callbacks.values() if isinstance(cb, CheckpointCallback)]
        if runner.file_writer is not None:
            runner.file_writer.wait()  # on disk before any rank exits (a launcher may then stop the main one)
        runner.engine.barrier()  # no rank exits while the main one is still writing
        if runner.engine.is_main:
            where = f"checkpoint {paths[0]}; continue with train(..., resume='last')" if paths else \
                "no checkpoint (no logdir)"
            logger.warning("graceful stop (%s) after stage %r epoch %d batch %d (global batch %d): %s; exit code %d",
                           request.reason, runner.stage_key, runner.epoch, runner.train_batches_done,
                           runner.global_batch_step, where, request.exit_code)
        raise CancelRun()
