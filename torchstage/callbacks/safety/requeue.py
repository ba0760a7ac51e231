"""SLURM preemption: a requeue signal stops the run gracefully, then the main rank requeues the job.

Built on the graceful stop (:mod:`torchstage.callbacks.safety.stop`): the signal handlers only record the
request; the stop callback makes every rank agree at a batch boundary and writes ``last.pth``. Once the
loop has ended, this callback (the last in the chain) runs ``scontrol requeue $SLURM_JOB_ID`` on the main
rank; SLURM then ends this run and starts the job again, which resumes from ``last.pth``
(``SLURM_RESTART_COUNT`` > 0 means ``resume='last'``, see :mod:`torchstage.launch.slurm.requeue`).
"""
import logging
import os
import signal

from torchstage.callbacks.base import Callback
from torchstage.callbacks.safety.stop import StopCallback
from torchstage.launch.slurm import requeue as slurm_requeue
from torchstage.stop_request import SignalStop

logger = logging.getLogger("torchstage")

#: Signals after which the job is requeued: SLURM's ``--signal=USR1@T`` warning and SIGTERM (preemption,
#: ``scancel -s TERM``); a plain ``scancel`` also sends SIGTERM but leaves the job CANCELLED: not requeued. Under
#: torchrun SIGTERM is its agent's, which ends its workers to start them again (a rank failed, a node was lost or
#: joined an elastic job): the run stops with a checkpoint and torchrun restarts it; only SIGUSR1 requeues.
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class RequeueCallback(Callback):
    """Requeue the SLURM job after a graceful stop caused by one of ``signals``.

    At experiment start the main rank asks ``scontrol`` whether the job can be requeued (a batch job
    without ``--no-requeue``); if not, the callback does nothing, or raises when ``required``
    (``train(requeue=True)``). Signals in ``signals`` that do not already stop the run (``runner.shared.stop_signals``:
    the stop callback's; SIGUSR1 by default) get a handler that only records a stop request.
    """

    order = StopCallback.order + 1  # after the stop callback and every logger: requeueing ends the process
    name = "requeue"

    def __init__(self, signals=REQUEUE_SIGNALS, required: bool = False, job_id: str = None):
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.required, self.job_id = bool(required), job_id
        self.enabled, self._handlers = False, None

    def on_experiment_start(self, runner):
        job_id = self.job_id or slurm_requeue.slurm_job_id()
        blocker = "not inside a SLURM job (SLURM_JOB_ID is not set)" if job_id is None else None
        if blocker is None and runner.engine.is_main:
            try:
                blocker = slurm_requeue.requeue_blocker(job_id)
            except slurm_requeue.RequeueError as e:
                blocker = str(e)
        blocker = runner.engine.broadcast_object(blocker)  # every rank acts on the main rank's answer
        if blocker is not None:
            if self.required:
                raise ValueError(f"requeue=True cannot work: {blocker}")
            logger.debug("requeue off: %s", blocker)
            self.enabled = False
            return
        self.job_id, self.enabled = job_id, True
        if os.environ.get("TORCHELASTIC_RESTART_COUNT") is not None:  # torchrun's worker: its SIGTERM restarts
            self.signals = tuple(s for s in self.signals if s != signal.SIGTERM)
        caught = runner.shared.stop_signals
        self._handlers = SignalStop([s for s in self.signals if s not in caught])
        self._handlers.install()
        if runner.engine.is_main:
            logger.info("SLURM job %s: on %s the run stops with a checkpoint and the job is requeued", job_id,
                        "/".join(s.name for s in self.signals))

    def on_experiment_end(self, runner):
        self._release()
        request = runner.loop.stop_request
        if not self.enabled or request is None or request.signum not in self.signals:
            return
        requeued = self._requeue(request) if runner.engine.is_main else None
        # No rank exits before the main one has requeued: under `srun --kill-on-bad-exit` an early exit
        # would end the step, main rank included, before the job is back in the queue.
        requeued = runner.engine.broadcast_object(requeued)
        runner.requeued = requeued

    def on_exception(self, runner):
        self._release()

    def _release(self):
        if self._handlers is not None:
            self._handlers.restore()
            self._handlers = None

    def _requeue(self, request) -> bool:
        try:
            state = slurm_requeue.job_state(self.job_id)
            if state.startswith("CANCELLED"):
                logger.warning("SLURM job %s was cancelled (%s): not requeued", self.job_id, request.reason)
                return False
            logger.warning("requeueing SLURM job %s after %s (scontrol requeue %s); it resumes from last.pth",
                           self.job_id, request.reason, self.job_id)
            slurm_requeue.requeue_job(self.job_id)
            return True
        except slurm_requeue.RequeueError as e:
            logger.error("could not requeue SLURM job %s: %s", self.job_id, e)
            return False
