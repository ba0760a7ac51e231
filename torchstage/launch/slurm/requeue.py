"""SLURM requeue: can this job go back to the queue, put it there, and resume it when it comes back.

Pure functions of an environment mapping plus thin ``scontrol`` calls; nothing here knows about
runners or callbacks. A requeued SLURM job runs its batch script again with ``SLURM_RESTART_COUNT``
set (1, 2, ...); :func:`resume_after_requeue` turns that into ``resume='last'``.
"""
import logging
import os
import re
import subprocess
from typing import Mapping, Optional

logger = logging.getLogger("torchstage")

SCONTROL_TIMEOUT_S = 30


class RequeueError(RuntimeError):
    """``scontrol`` could not tell about the job or could not requeue it."""


def slurm_job_id(environ: Mapping = os.environ) -> Optional[str]:
    """The id of the SLURM job this process belongs to (a batch script, srun or salloc), or None."""
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None


def restart_count(environ: Mapping = os.environ) -> int:
    """How many times SLURM has requeued this job (``SLURM_RESTART_COUNT``; 0 on the first run)."""
    value = environ.get("SLURM_RESTART_COUNT", "").strip()
    return int(value) if value.isdigit() else 0


def check_requeue_arg(requeue, resume, environ: Mapping = os.environ):
    """Validate ``train(requeue=...)`` and return the ``resume`` to use; raises before training.

    ``requeue=None`` (default): on inside a requeueable SLURM batch job; ``True``: must be one (raises
    here outside any SLURM job); ``False``: off. Unless off, a job that SLURM has requeued
    (``SLURM_RESTART_COUNT`` > 0) resumes from ``last.pth`` when ``resume`` is not given.
    """
    if requeue not in (None, True, False):
        raise TypeError(f"requeue must be None (on inside a requeueable SLURM batch job), True or False, "
                        f"got {requeue!r}")
    if requeue is True and slurm_job_id(environ) is None:
        raise ValueError("requeue=True needs a SLURM batch job (SLURM_JOB_ID is not set): submit the script with "
                         "sbatch (e.g. `torchstage slurm --requeue ... --submit -- python run.py`), or pass "
                         "requeue=None to requeue only where possible")
    return resume_after_requeue(resume, requeue, environ)


def resume_after_requeue(resume, requeue, environ: Mapping = os.environ):
    """``'last'`` for a job SLURM has requeued (and requeue not off) that names no checkpoint; else ``resume``."""
    if resume is None and requeue is not False and restart_count(environ) > 0:
        logger.info("SLURM job %s restarted (SLURM_RESTART_COUNT=%d): resume='last'", slurm_job_id(environ),
                    restart_count(environ))
        return "last"
    return resume


def job_info(job_id: str) -> dict:
    """``scontrol show job -o JOB_ID`` as a dict of its ``Key=Value`` fields (first record)."""
    out = _scontrol("show", "job", "-o", str(job_id))
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", out.splitlines()[0] if out.strip() else ""))


def requeue_blocker(job_id: str) -> Optional[str]:
    """Why this job cannot be requeued (not a batch job, submitted with --no-requeue), or None if it can."""
    info = job_info(job_id)
    if info.get("BatchFlag") == "0":
        return (f"SLURM job {job_id} is not a batch job (srun/salloc); only jobs submitted with sbatch can be "
                f"requeued")
    if info.get("Requeue") == "0":
        return f"SLURM job {job_id} cannot be requeued (Requeue=0): submit it with `sbatch --requeue`"
    return None


def job_state(job_id: str) -> str:
    """The job's state as ``scontrol`` shows it (RUNNING, CANCELLED, TIMEOUT, ...)."""
    return job_info(job_id).get("JobState", "UNKNOWN")


def requeue_job(job_id: str) -> None:
    """``scontrol requeue JOB_ID``: SLURM ends this run of the job (SIGTERM to every task) and queues it again."""
    _scontrol("requeue", str(job_id))


def _scontrol(*args) -> str:
    try:
        proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except FileNotFoundError:
        raise RequeueError("scontrol not found: requeueing needs the SLURM client tools on the compute nodes") \
            from None
    except subprocess.TimeoutExpired:
        raise RequeueError(f"scontrol {' '.join(args)} did not answer in {SCONTROL_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        raise RequeueError(f"scontrol {' '.join(args)} failed (exit code {proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout
