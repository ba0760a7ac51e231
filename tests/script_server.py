"""The tests' scripts forked from a preloaded process, not started as fresh interpreters.

A test that runs a script (``helpers.run``, ``helpers.run_script``) would pay for a new interpreter importing torch
and torchstage each time: 2-3 s of CPU, half of a small distributed test, and most of what the suite spends on two
cores. So :func:`run` asks torchstage's own preloaded process (:mod:`torchstage.launch.zygote`, the one the launcher
forks its ranks from) to fork the script instead; the copy starts as a fresh interpreter would
(:mod:`torchstage.launch.forked_rank`: its own session, environment, working directory, ``sys.argv`` and
``sys.orig_argv``, signal handlers, generators seeded from the OS) and runs the script as ``__main__``. Each test
process keeps one preloaded process per start-up environment, made on first use and ended with the test process.

A fresh interpreter still runs a command that is not ``python SCRIPT|-m MODULE|-c CODE``, one asked ``fresh=True``
(tests of start-up itself: what an interpreter imports, how fast it starts), and one run from a thread other than
the main one or while another is under way in this process, and every script under ``TORCHSTAGE_TEST_FRESH=1``.
"""
import os
import select
import signal
import subprocess
import sys
import threading
import time

from torchstage.launch import rank_start
from torchstage.launch.preloaded import reap
from torchstage.launch.zygote import receive, send

#: What the preloaded process imports: what almost every script imports, and what ranks import before a step.
PRELOAD = ("torch", "numpy", "torchstage", *rank_start.RANK_IMPORTS)
#: Variables an interpreter (or a library it loads) reads as it starts: a script whose values differ from those a
#: preloaded process started with is forked from another one, made with its values.
STARTUP_PREFIXES = ("PYTHON", "LD_", "TORCH_", "KMP_", "MKL_", "OPENBLAS", "GLOG_", "MALLOC_", "CUDA_VISIBLE")
#: Variables of those prefixes a forked copy applies itself (forked_rank), or that only change what is written.
APPLIED = ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")
FRESH_ENV = "TORCHSTAGE_TEST_FRESH"  # =1: every script in a fresh interpreter, as before (to tell the two apart)
MAX_SERVERS = 4  # start-up environments seen in one test process (each preloaded process holds ~300 MiB)

_servers = {}
_lock = threading.Lock()


def run(command: list, env: dict, cwd=None, timeout=None, fresh=False, merge=False) -> subprocess.CompletedProcess:
    """``subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)`` (with
    ``merge``: ``stdout=PIPE, stderr=STDOUT``), the script forked from a preloaded process where it can be (see the
    module's text)."""
    command = [str(part) for part in command]
    main = threading.current_thread() is threading.main_thread()  # a preloaded process dies with its maker thread
    fresh = fresh or os.environ.get(FRESH_ENV, "") not in ("", "0")
    if not fresh and main and _forkable(command) and _lock.acquire(blocking=False):
        try:
            server = _server(env)
            if server is not None:
                return server.run(command, env, str(cwd or os.getcwd()), timeout, merge)
        finally:
            _lock.release()
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if merge else {"capture_output": True}
    return subprocess.run(command, env=env, cwd=cwd, text=True, timeout=timeout, **streams)


def _forkable(command: list) -> bool:
    """True for ``python SCRIPT ...``, ``python -m MODULE ...`` and ``python -c CODE ...`` with this interpreter."""
    return (len(command) >= 2 and command[0] == sys.executable
            and (not command[1].startswith("-") or (command[1] in ("-m", "-c") and len(command) >= 3)))


def _startup(env: dict) -> tuple:
    """The values in ``env`` an interpreter reads as it starts (see :data:`STARTUP_PREFIXES`)."""
    return tuple(sorted((name, value) for name, value in env.items()
                        if name.startswith(STARTUP_PREFIXES) and name not in APPLIED))


def _server(env: dict):
    """This process's preloaded process for ``env``'s start-up values (made now if new), or None."""
    key = (os.getpid(), _startup(env))
    server = _servers.get(key)
    if server is not None and not server.alive():
        _servers.pop(key).close()
        server = None
    if server is None and len(_servers) < MAX_SERVERS:
        server = _servers[key] = _Server.make(env)
    return server


class _Server:
    """One preloaded process (``python -m torchstage.launch.zygote``) on a Unix socket, one script at a time."""

    def __init__(self, sock, popen):
        self.sock, self.popen, self.ids, self.exited = sock, popen, 0, {}

    @classmethod
    def make(cls, env: dict):
        """A preloaded process started with ``env``, ready; None where it could not be made (scripts start fresh)."""
        made, _ = rank_start._fresh_process([], PRELOAD, env=env)
        return None if made is None else cls(made[0], made[2])

    def alive(self) -> bool:
        """True while the preloaded process runs."""
        return self.popen.poll() is None

    def close(self) -> None:
        """End the preloaded process (closing its socket ends it) and reap it."""
        self.sock.close()
        reap(self.popen.pid, self.popen)

    def run(self, command: list, env: dict, cwd: str, timeout, merge: bool) -> subprocess.CompletedProcess:
        """Fork ``command`` (``python PROGRAM...``) and wait for its end, reading its output as it comes (stdout and
        stderr on one pipe with ``merge``)."""
        self.ids += 1
        out_r, out_w = os.pipe()
        err_r, err_w = (out_r, out_w) if merge else os.pipe()
        try:
            send(self.sock, {"id": self.ids, "program": command[1:], "env": env, "cwd": cwd, "orig_argv": command},
                 (out_w, err_w))
        finally:
            os.close(out_w)
            if not merge:
                os.close(err_w)
        deadline = None if timeout is None else time.monotonic() + timeout
        output, pid, code = {out_r: bytearray(), err_r: bytearray()}, None, None
        reading = list(output)
        try:
            while code is None or reading:  # the script's end, and its output to the end
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)  # as subprocess.run ends a child that ran past its timeout
                    raise subprocess.TimeoutExpired(command, timeout, *_text(output, out_r, err_r, merge))
                ready, _, _ = select.select(reading + ([self.sock] if code is None else []), [], [], left)
                for fd in ready:
                    if fd is self.sock:
                        pid, code = self._answer(pid, command)
                        continue
                    data = os.read(fd, 65536)
                    output[fd] += data
                    if not data:
                        reading.remove(fd)
            return subprocess.CompletedProcess(command, code, *_text(output, out_r, err_r, merge))
        finally:
            for fd in output:
                os.close(fd)

    def _answer(self, pid, command):
        """Read one message of the preloaded process: ``(pid, exit code or None)`` of the script so far."""
        message, fds = receive(self.sock)
        for fd in fds:
            os.close(fd)
        if message is None:
            raise RuntimeError(f"the preloaded process ended while it ran {command}")
        if message[0] == "failed" and message[1] == self.ids:
            raise RuntimeError(f"the preloaded process could not fork {command}: {message[2]}")
        if message[0] == "started" and message[1] == self.ids:
            return message[2], self.exited.pop(message[2], None)
        if message[0] == "exited":
            if message[1] == pid:
                return pid, message[2]
            self.exited[message[1]] = message[2]  # an earlier script, killed at its timeout
        return pid, None


def _text(output: dict, out_r: int, err_r: int, merge: bool) -> tuple:
    """stdout and stderr as ``text=True`` gives them: decoded, newlines translated (stderr None with ``merge``)."""
    texts = [bytes(output[fd]).decode().replace("\r\n", "\n").replace("\r", "\n") for fd in (out_r, err_r)]
    return (texts[0], None) if merge else tuple(texts)
