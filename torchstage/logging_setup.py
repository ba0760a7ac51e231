"""Console output through ``logging``: a stdout handler for the ``torchstage`` logger unless the user set one, and
the one-time notes that name torchstage's spelling of another framework's (Catalyst's) names."""
import contextlib
import logging
import os
import sys

_noted = set()


def ensure_console_handler() -> None:
    """Show INFO messages of ``torchstage`` on stdout when neither it nor the root logger has a handler."""
    log = logging.getLogger("torchstage")
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.propagate = False


def is_main_process() -> bool:
    """Rank 0 of an initialised process group, else what the launcher's ``RANK`` says (0 if unset)."""
    import torch.distributed as dist  # imported here: torch is heavy and rarely needed for a note
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def note_alias(old: str, preferred: str, version: str = "20.12") -> None:
    """Log once per process (main rank only) that ``old`` is Catalyst ``version``'s spelling of ``preferred``."""
    if old in _noted:
        return
    _noted.add(old)
    if is_main_process():
        ensure_console_handler()
        logging.getLogger("torchstage").info("note: %s is Catalyst %s's spelling; torchstage's is %s", old, version,
                                             preferred)


@contextlib.contextmanager
def at_level(name: str, level: int):
    """Logger ``name`` at ``level`` for the block, as it was after it."""
    log = logging.getLogger(name)
    before = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(before)
