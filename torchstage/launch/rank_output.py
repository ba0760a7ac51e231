"""The ranks' output around a failure: one traceback, the others' echoes held back, and the error line it ends with.

When a rank fails, its peers fail in turn (gloo's "Connection closed by peer", a stop signal): their tracebacks are
consequences and would bury the first one. :class:`OutputGate` lets the launcher print the rank whose traceback
began first and hold the others' lines back; once the failure is known the held lines become a one-line note,
and if no failure follows (a traceback that was logged and handled) they are printed after a few seconds.
:func:`alike` tells apart the ranks that raised the very same error (one mistake every rank met: said once, not
listed as consequences). :func:`last_error` reads the error a traceback ends with (its type and message), to name a failure that left no
failure record (an error in the script before ``train()``, in setup or during resume).
"""
import re
import threading
import time
from typing import Callable, Iterable, Optional

TRACEBACK = "Traceback (most recent call last):"
#: Seconds the other ranks' output waits after a traceback that no failing exit follows (a handled error).
HOLD_SECONDS = 10.0


def last_error(lines: Iterable[str]) -> Optional[str]:
    """``ValueError: lr must be > 0``: the line the last Python traceback in ``lines`` ends with; None without one."""
    lines = [line.rstrip("\n") for line in lines]
    start = max((i for i, line in enumerate(lines) if line.startswith(TRACEBACK)), default=None)
    if start is None:
        return None
    return next((line.strip() for line in lines[start + 1:] if line.strip() and not line[:1].isspace()), None)


def comparable(error: Optional[str]) -> Optional[str]:
    """``error`` without what differs between two runs of the same code (object addresses)."""
    return None if error is None else re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", error)


class OutputGate:
    """Decides, line by line, whether a rank's output goes out now or is held back behind another rank's failure.

    The first rank whose output begins a traceback (or that :meth:`fails` first) is the origin; from then on the
    other ranks' lines are held until :meth:`take` (the launcher saw the failure) or :meth:`release_stale`.
    """

    def __init__(self, hold_seconds: float = HOLD_SECONDS):
        self.hold_seconds = hold_seconds
        self.origin, self.since = None, 0.0
        self.held = []  # (rank, text, emit) in arrival order
        self.lock = threading.Lock()

    def admit(self, rank: int, text: str, emit: Callable[[], None]) -> None:
        """Emit ``rank``'s line ``text`` now (``emit()``), or keep it while another rank's failure unfolds."""
        with self.lock:
            if self.origin is None and text.startswith(TRACEBACK):
                self.origin, self.since = rank, time.monotonic()
            if self.origin is not None and rank != self.origin:
                self.held.append((rank, text, emit))
                return
            emit()

    def fails(self, rank: int) -> None:
        """``rank`` exited with an error: the origin, unless a traceback named one first."""
        with self.lock:
            if self.origin is None:
                self.origin, self.since = rank, time.monotonic()

    def release_stale(self) -> None:
        """Print what was held behind a traceback that no failure followed within ``hold_seconds``."""
        with self.lock:
            if self.origin is not None and time.monotonic() - self.since > self.hold_seconds:
                self._emit_all()

    def release(self) -> None:
        """Print everything held (the run ended without a failure to explain it)."""
        with self.lock:
            self._emit_all()

    def take(self, cause: int) -> dict:
        """After a failure: print ``cause``'s held lines (its own error, behind a handled traceback of another rank)
        and return the other ranks' held lines, rank -> texts, as that failure's consequences."""
        with self.lock:
            rest = {}
            for rank, text, emit in self.held:
                if rank == cause:
                    emit()
                else:
                    rest.setdefault(rank, []).append(text)
            self.held = []
            return rest

    def _emit_all(self) -> None:
        for _, _, emit in self.held:
            emit()
        self.held, self.origin = [], None


def alike(held: dict, error: Optional[str]) -> tuple:
    """``(ranks, rest)``: the ranks of ``held`` whose output ends with ``error`` (the first failure's error line: one
    mistake every rank met alike, such as a mesh that does not divide the world), and the other ranks' held lines."""
    if error is None:
        return [], held
    same = sorted(rank for rank, texts in held.items() if comparable(last_error(texts)) == comparable(error))
    return same, {rank: texts for rank, texts in held.items() if rank not in same}


def consequences(held: dict) -> Optional[str]:
    """One line for the other ranks' held output: the error each ended with; None when none of them has one."""
    errors = [(rank, last_error(texts)) for rank, texts in sorted(held.items())]
    errors = [f"rank {rank}: {error[:300]}" for rank, error in errors if error]
    if not errors:
        return None
    return f"The other ranks failed after it (consequences; their tracebacks are left out): {'; '.join(errors)}"
