"""The checkpoints and resume part of ``train()``'s arguments: where the run writes (``logdir``), what it keeps
(``checkpoint_period``, ``topk``, ``load_best_on_end``) and what it continues (``resume``, ``overwrite``,
``resume_lr``, ``requeue``): a logdir that is a file, a ``resume`` that names nothing, an argument that needs a
logdir without one, refused before training."""
import difflib
import glob
import os

from torchstage.launch.slurm.requeue import check_requeue_arg
from torchstage.runner.resume import resume_of_this_attempt

#: What ``resume_lr`` accepts.
RESUME_LR = ("refuse", "new", "checkpoint")


def check_checkpoints(spec, runner) -> None:
    """The logdir, then the checkpoint this attempt resumes from; ``checkpoint_period`` and ``topk`` configure the
    default CheckpointCallback, which checks them (:mod:`torchstage.runner.defaults`)."""
    check_logdir(spec.logdir)
    if spec.load_best_on_end and spec.logdir is None:
        raise ValueError("load_best_on_end=True needs a logdir to write best.pth in; pass logdir=...")
    if spec.resume_lr not in RESUME_LR:
        raise ValueError(f"resume_lr must be 'refuse' (a learning rate that differs from the checkpoint's fails), "
                         f"'new' (use the one given now) or 'checkpoint' (keep the saved one), got {spec.resume_lr!r}")
    spec.resume = resume_of_this_attempt(check_requeue_arg(spec.requeue, spec.resume))  # SLURM's, then a launcher's
    check_resume(spec.resume, spec.logdir)


def check_logdir(logdir) -> None:
    """``logdir`` must be a path: a directory, or nothing yet (it is created) under a directory this process can
    write."""
    if logdir is None:
        return
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a path (str or os.PathLike), got {type(logdir).__name__}")
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ValueError(f"logdir={os.fspath(logdir)!r} is an existing file, not a directory; pass the path of a "
                         f"directory (created if missing) for checkpoints and logs")
    existing = os.path.abspath(os.fspath(logdir))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"logdir={os.fspath(logdir)!r} lies under {existing!r}, which is a file, not a directory; "
                         f"pass a logdir in a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"logdir={os.fspath(logdir)!r}: this process cannot write in {existing!r} (permission "
                              f"denied, or a read-only file system); pass a logdir where it can create files")


def check_resume(resume, logdir) -> None:
    """``resume`` is None, ``"last"``, ``"auto"`` or an existing checkpoint (a file, or a sharded checkpoint's
    directory); else say what was probably meant."""
    if resume in (None, "last", "auto") or (isinstance(resume, (str, os.PathLike)) and os.path.exists(resume)):
        return
    if not isinstance(resume, (str, os.PathLike)):
        raise TypeError(f"resume must be None, 'last' or the path of a checkpoint file, got {type(resume).__name__}")
    resume = os.fspath(resume)
    folder = os.path.dirname(resume) or (os.path.join(logdir, "checkpoints") if logdir is not None else ".")
    candidates = ["last", "auto"] + sorted(glob.glob(os.path.join(folder, "*.pth")))
    close = difflib.get_close_matches(resume, candidates, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"resume={resume!r} is neither 'last' (continue the logdir's run) nor an existing checkpoint "
                     f"file{hint}; 'auto' continues the logdir's run when it is this job's, else starts one")
