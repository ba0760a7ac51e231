"""The launcher's side of the preloaded process: ask it for ranks, learn their pids and exits, fall back when needed.

:meth:`PreloadedStart.start` sends the request and returns at once, so that a launch asks for all its ranks in one
go and the preloaded process forks them back to back (no rank waits for the previous one's answer). The
:class:`RankProcess` it returns behaves as the ``subprocess.Popen`` of a fresh start: ``pid`` (known once the
preloaded process answers), ``stdout``/``stderr`` pipes, ``poll()``, ``wait()`` and ``returncode``. A rank the
preloaded process cannot start (it refused, or it is gone) is started as a fresh interpreter on the same pipes.
"""
import itertools
import logging
import os
import signal
import socket
import subprocess
import threading
import time

from torchstage.launch.zygote import receive, send

logger = logging.getLogger("torchstage")
START_SECONDS = 60.0  # an answer slower than this: the preloaded process is given up (its ranks then start fresh)


class RankProcess:
    """A rank asked of the preloaded process, as the launcher sees it (``Popen``'s interface)."""

    def __init__(self, stdout, stderr):
        """``stdout``, ``stderr``: the read ends of the rank's output pipes."""
        self.stdout, self.stderr, self.returncode = stdout, stderr, None
        self._pid, self._fresh, self.ended_at = None, None, None
        self._known, self._ended = threading.Event(), threading.Event()

    @property
    def pid(self) -> int:
        """The rank's pid (waits for the preloaded process's answer)."""
        if not self._known.wait(START_SECONDS + 10):
            raise RuntimeError("the preloaded process never said which pid a rank has")
        return self._fresh.pid if self._fresh is not None else self._pid

    def poll(self):
        """The exit code once the rank ended, else None."""
        if self._fresh is not None:
            self.returncode = self._fresh.poll()
        return self.returncode

    def wait(self, timeout=None):
        """The exit code, once the rank ended (``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""
        if self._fresh is None and not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank process {self._pid}", timeout)
        if self._fresh is not None:
            self.returncode = self._fresh.wait(timeout)
        return self.returncode

    def started(self, pid: int = None, fresh=None) -> None:
        """Forked as ``pid`` by the preloaded process, or started as the fresh interpreter ``fresh`` (a Popen)."""
        self._pid, self._fresh = pid, fresh
        self._known.set()
        if fresh is not None:
            self._ended.set()  # wait() waits on the Popen from now on

    def ended(self, code: int) -> None:
        """The preloaded process reported the rank's end with ``code``."""
        self.returncode, self.ended_at = code, time.monotonic()
        self._ended.set()


class PreloadedStart:
    """Ranks forked by the preloaded process ``pid`` (on ``sock``); ``fallback`` (a fresh start's command) where it
    cannot. ``popen``: the preloaded process as a fresh interpreter's Popen, None where it is a fork of this one;
    ``why``: why it is not a fork of this one (said on the launch line)."""

    kind = "preloaded"

    def __init__(self, sock, pid: int, program: list, fallback: list, popen=None, why: str = None):
        """Start reading the preloaded process's answers."""
        self.sock, self.pid, self.program, self.fallback, self.popen = sock, pid, program, fallback, popen
        self.why = why
        self.pending, self.procs, self.gone = {}, {}, False
        self.ids, self.lock = itertools.count(), threading.Lock()
        self.reader = threading.Thread(target=self._read, name="torchstage-preloaded-reader", daemon=True)
        self.reader.start()
        self.timer = None

    def start(self, env: dict) -> RankProcess:
        """Ask for a rank with ``env``; returns at once (the pid follows)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        proc = RankProcess(open(out_r, "rb"), open(err_r, "rb"))
        with self.lock:
            request_id = next(self.ids)
            self.pending[request_id] = (proc, env, out_w, err_w, time.monotonic())
            gone = self.gone
        if not gone:
            try:
                send(self.sock, {"id": request_id, "program": self.program, "env": env, "cwd": os.getcwd(),
                                 "orig_argv": self.fallback}, (out_w, err_w))
                self._watch_answers()
                return proc
            except OSError as exc:
                logger.debug("the preloaded process is gone (%s)", exc)
        with self.lock:
            request = self.pending.pop(request_id, None)
        if request is not None:
            self._start_fresh(request, "the preloaded process is gone")
        return proc

    def _start_fresh(self, request, why: str) -> None:
        """Start the rank of ``request`` as a fresh interpreter on its pipes (``why``: logged at debug level)."""
        proc, env, out_w, err_w, _ = request
        logger.debug("a rank starts in a fresh interpreter: %s", why)
        try:
            proc.started(fresh=subprocess.Popen(self.fallback, env=env, stdout=out_w, stderr=err_w,
                                                start_new_session=True))
        finally:
            os.close(out_w)
            os.close(err_w)

    def _watch_answers(self) -> None:
        """Give the preloaded process up when a request goes unanswered for START_SECONDS."""
        if self.timer is None:
            self.timer = threading.Timer(START_SECONDS / 4, self._check_answers)
            self.timer.daemon = True
            self.timer.start()

    def _check_answers(self) -> None:
        """End the preloaded process if a request waited START_SECONDS; check again later otherwise."""
        with self.lock:
            self.timer = None
            oldest = min((request[4] for request in self.pending.values()), default=None)
            if oldest is None or self.gone:
                return
        if time.monotonic() - oldest < START_SECONDS:
            self._watch_answers()
            return
        logger.debug("no answer from the preloaded process in %.0f s: it is ended", START_SECONDS)
        try:
            os.kill(self.pid, signal.SIGKILL)  # a rank it might start later would run unwatched
        except ProcessLookupError:
            pass

    def _read(self) -> None:
        """Answers and exits from the preloaded process, until it closes the socket."""
        while True:
            try:
                message, fds = receive(self.sock)
            except OSError:
                message, fds = None, []
            for fd in fds:
                os.close(fd)
            if message is None:
                break
            kind, fresh = message[0], None
            with self.lock:
                if kind == "exited" and message[1] in self.procs:
                    self.procs.pop(message[1]).ended(message[2])
                elif kind in ("started", "failed") and message[1] in self.pending:
                    request = self.pending.pop(message[1])
                    if kind == "started":
                        os.close(request[2])
                        os.close(request[3])
                        self.procs[message[2]] = request[0]
                        request[0].started(pid=message[2])
                    else:
                        fresh = request
            if fresh is not None:
                self._start_fresh(fresh, message[2])
        with self.lock:  # the preloaded process ended: its ranks died with it (PDEATHSIG)
            self.gone = True
            for proc in self.procs.values():
                proc.ended(-signal.SIGKILL)
            pending, self.procs, self.pending = list(self.pending.values()), {}, {}
        for request in pending:
            self._start_fresh(request, "the preloaded process ended before it answered")

    def close(self) -> None:
        """End the preloaded process (its ranks have ended: the launcher stopped them) and reap it."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.reader.join(timeout=5)
        self.sock.close()
        if self.timer is not None:
            self.timer.cancel()
        reap(self.pid, self.popen)


def reap(pid: int, popen=None, seconds: float = 5.0) -> None:
    """Wait for the preloaded process to end (``seconds`` at most, then KILL it)."""
    if popen is not None:
        try:
            popen.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
        return
    deadline = time.monotonic() + seconds
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.01)
