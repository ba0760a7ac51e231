"""Errors of the runner that a user's setup causes (kept under Catalyst 20.12's name, RunnerException), and how a
user error reaches the user: its message under the user's own call, without torchstage's frames."""
import logging
import os
import types

from torchstage.files.checkpoint_format import CheckpointError

#: Set (to anything but "" or "0") to keep torchstage's own frames in the traceback of a user error.
FULL_TRACEBACK_VAR = "TORCHSTAGE_FULL_TRACEBACK"
#: What torchstage's checks raise for a user's argument, config, logdir or checkpoint.
USER_ERRORS = (ValueError, TypeError, KeyError, FileExistsError, FileNotFoundError, NotADirectoryError, PermissionError,
               CheckpointError)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class RunnerException(ValueError):
    """A run that cannot start as given, such as an empty loader; a ValueError, raised before training."""


class LogdirHoldsRun(FileExistsError):
    """The logdir holds what this run cannot start on: another run, or an earlier run's logs without its
    checkpoints. The message gives the fixes in ``train()``'s spelling; ``text(cli=True)`` in ``--set`` options."""

    def __init__(self, problem: str, fixes):
        self.problem, self.fixes = problem, tuple(fixes)  # ((train() spelling, command-line spelling), ...)
        super().__init__(self.text())

    def text(self, cli: bool = False) -> str:
        """The problem and its fixes, as ``train()`` arguments or (``cli``) as ``torchstage run --set`` options."""
        fixes = [line if cli else python for python, line in self.fixes]
        return f"{self.problem}; {', '.join(fixes[:-1])} or {fixes[-1]}" if len(fixes) > 1 else \
            f"{self.problem}; {fixes[0]}"


def is_user_error(exc: BaseException) -> bool:
    """An error of what a user gave torchstage (arguments, config, logdir, checkpoint file), raised by
    torchstage's own checks, not inside a model, a dataset or torch."""
    if not isinstance(exc, USER_ERRORS):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE)


def shorten_user_error(exc: BaseException, runner=None) -> bool:
    """Drop torchstage's own frames from ``exc`` (and from the errors it was raised from), noting how to see them, so
    that whatever ends ``train()`` shows the user's call and the user's own frames (their model, dataset, handle_batch,
    and torch's under them): an argument error found before training and an error at the first batch alike. Not when
    a full traceback is asked for (``TORCHSTAGE_FULL_TRACEBACK=1``, or the ``torchstage`` logger at DEBUG). Returns
    whether it did."""
    if os.environ.get(FULL_TRACEBACK_VAR, "") not in ("", "0") or logging.getLogger("torchstage").isEnabledFor(
            logging.DEBUG):
        return False
    seen = set()
    while exc is not None and id(exc) not in seen and len(seen) < 8:
        seen.add(id(exc))
        exc.with_traceback(_without_own_frames(exc.__traceback__))
        if NOTE not in getattr(exc, "__notes__", ()) and not seen - {id(exc)}:
            exc.add_note(NOTE)
        exc = exc.__cause__ or exc.__context__
    return True


NOTE = f"(torchstage's own frames are hidden; {FULL_TRACEBACK_VAR}=1 shows them)"


def _without_own_frames(tb):
    """The traceback ``tb`` without the frames of torchstage's files."""
    kept = []
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE):
            kept.append(tb)
        tb = tb.tb_next
    chain = None
    for frame in reversed(kept):
        chain = types.TracebackType(chain, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return chain
