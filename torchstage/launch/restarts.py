"""Restarts inside the job: when a rank dies, the launcher ends the world and starts it again, up to a limit.

Each attempt is one :class:`~torchstage.launch.local_launcher.Launcher` run; the workers of attempt ``k`` see
``TORCHSTAGE_RESTART_COUNT=k`` and continue their logdir's run from its last checkpoint (a run that failed
before its first checkpoint starts over). A failure that repeats (the same error at the same point of the
run, as the failing ranks recorded it; or, where no rank got as far as recording one, as in an error of the script
before ``train()``, in setup or while resuming: the same exit code and the same error line ending the first
traceback) is deterministic and is not retried: the job exits with it. A signal
to the launcher (the job cancelled, a SLURM time limit) and a graceful stop of the run (``request_stop``, a
signal to the workers) end the job without a restart.
"""
import logging
import os
import uuid

from torchstage.launch.failure_folder import FailureFolder
from torchstage.launch.failures import same_failure, where
from torchstage.launch.local_launcher import Launcher
from torchstage.launch.rank_output import comparable
from torchstage.launch.resolve import JOB_ID_ENV, MAX_RESTARTS_ENV
from torchstage.launch.world import World

logger = logging.getLogger("torchstage")


def check_max_restarts(value, name: str = "max_restarts"):
    """``value`` as the number of restarts (``None``: ``$TORCHSTAGE_MAX_RESTARTS``, else 0); ValueError otherwise."""
    if value is None:
        text = os.environ.get(MAX_RESTARTS_ENV, "").strip()
        if not text:
            return 0
        value, name = (int(text) if text.lstrip("-").isdigit() else text), MAX_RESTARTS_ENV
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (restarts of the world after a rank fails), got {value!r}")
    return value


def supervise(command: list, world: World, max_restarts: int, starter=None) -> int:
    """Run ``world.spawn`` workers of ``command`` (started by ``starter``, see
    :class:`~torchstage.launch.local_launcher.Launcher`); after a failure start them again, at most ``max_restarts``
    times. Returns 0, or the exit code of the last failure."""
    job_id = os.environ.get(JOB_ID_ENV) or uuid.uuid4().hex[:12]
    folder = FailureFolder()
    previous = None
    try:
        for attempt in range(max_restarts + 1):
            folder.clear()
            launcher = Launcher(command, world, attempt=attempt, job_id=job_id, failure_dir=folder.path,
                                starter=starter)
            code = launcher.run()
            if code == 0:
                if attempt:
                    logger.info("the run finished on attempt %d of %d", attempt + 1, max_restarts + 1)
                return 0
            failure, told = _failure(launcher, code), _told(launcher, code)
            if failure is not None and failure.get("stopped"):
                if failure.get("outcome"):  # a command's result (torchstage preflight), nothing to restart
                    return code
                logger.warning("attempt %d of %d ended by a graceful stop: not restarted (a stop is asked for, not a "
                               "failure)", attempt + 1, max_restarts + 1)
                return code
            if attempt == max_restarts:
                if max_restarts:
                    logger.error("attempt %d of %d failed (%s); no restart left: exit code %d", attempt + 1,
                                 max_restarts + 1, told, code)
                return code
            if same_failure(previous, failure):
                point = "" if failure.get("from_output") else " at the same point"
                logger.error("attempt %d of %d failed with the same error%s as attempt %d (%s): a deterministic "
                             "failure, not restarted; exit code %d", attempt + 1, max_restarts + 1, point, attempt,
                             told, code)
                return code
            previous = failure
            logger.warning("attempt %d of %d failed (%s); restarting the world from the run's last checkpoint "
                           "(attempt %d)", attempt + 1, max_restarts + 1, told, attempt + 2)
    finally:
        folder.remove()


def _failure(launcher: Launcher, code: int):
    """The failure record of the attempt, to compare with the next one's; without a record (the error came before
    the run could write one), one made of the exit code and the error line the first traceback ends with. None
    for a rank killed by a signal without a word: that may be the node, worth another attempt."""
    if launcher.failure is not None:
        return launcher.failure
    error = launcher.error_line()
    if code > 128 or error is None:
        return None
    return {"rank": launcher.origin, "error": f"exit code {code}: {comparable(error)}", "position": {},
            "from_output": True}


def _told(launcher: Launcher, code: int) -> str:
    failure = launcher.failure
    if failure is None:
        how = f"killed by signal {code - 128}" if code > 128 else f"exit code {code}"
        error = launcher.error_line() if code <= 128 else None
        if error is not None:
            return f"rank {launcher.origin} {how}, before its run recorded anything (in the script before train(), " \
                   f"in setup or while resuming): {error}"
        return f"rank {launcher.failed_rank} {how}, at {where(None)}"
    return f"rank {failure['rank']} at {where(failure)}: {failure['error'].splitlines()[0]}"
