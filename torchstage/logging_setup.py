"""Console output through ``logging``: a stdout handler for the ``torchstage`` logger unless the user set one."""
import logging
import sys


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
