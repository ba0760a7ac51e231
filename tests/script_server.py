"""The tests' scripts forked from a preloaded process, not started as fresh interpreters.

A test that runs a script (``helpers.run``, ``helpers.run_script``) would pay for a new interpreter importing torch
and torchstage each time: 2-3 s of CPU, half of a small distributed test, and most of what the suite spends on two
cores. So :func:`run` asks torchstage's own preloaded process (:mod:`torchstage.launch.zygote`, the one the launcher
forks its ranks from) to fork the script instead; the copy starts as a fresh interpreter would
(:mod:`torchstage.launch.forked_rank`: its own session, environment, working directory, ``sys.argv`` and
``sys.orig_argv``, signal handlers, generators seeded from the OS) and runs the script as ``__main__``. Each test
process keeps one preloaded process per start-up environment, made on first use and ended with the test process.

A fresh interpreter still runs a command that is not ``python SCRIPT|-m MODULE|-c CODE``, one asked ``fresh=True``
(tests of start-up itself: what an interpreter imports, how fast it starts), and every script under
``TORCHSTAGE_TEST_FRESH=1``. Scripts run from several threads at once (a fixture's thread pool) are forked side by
side.
"""
import itertools
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time

from tests.stacks import TimedOut, descendants, stacks
from torchstage.launch import rank_start
from torchstage.launch.preloaded import reap
from torchstage.launch.zygote import receive, send

#: What the preloaded process imports: what almost every script imports, and what ranks import before a step.
PRELOAD = ("torch", "numpy", "torchstage", *rank_start.RANK_IMPORTS)
#: Variables an interpreter (or a library it loads) reads as it starts: a script whose values differ from those a
#: preloaded process started with is forked from another one, made with its values.
STARTUP_PREFIXES = ("PYTHON", "LD_", "TORCH_", "KMP_", "MKL_", "OPENBLAS", "GLOG_", "MALLOC_", "CUDA_VISIBLE")
#: Variables of those prefixes a forked copy applies itself (forked_rank), that only change what is written, or
#: that are read later than the fork: CUDA reads CUDA_VISIBLE_DEVICES when the copy first uses it (the preloaded
#: process never does, :mod:`torchstage.launch.fork_safety`), from the copy's environment.
APPLIED = ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "CUDA_VISIBLE_DEVICES")
FRESH_ENV = "TORCHSTAGE_TEST_FRESH"  # =1: every script in a fresh interpreter, as before (to tell the two apart)
MAX_SERVERS = 4  # preloaded processes kept by one test process (each holds ~300 MiB); past it the idlest is ended

_servers = {}
_lock = threading.Lock()
_requests = queue.Queue()  # (env, answer queue): preloaded processes for the maker thread to make
_maker = None


def run(command: list, env: dict, cwd=None, timeout=None, fresh=False, merge=False) -> subprocess.CompletedProcess:
    """``subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)`` (with
    ``merge``: ``stdout=PIPE, stderr=STDOUT``), the script forked from a preloaded process where it can be (see the
    module's text)."""
    command = [str(part) for part in command]
    fresh = fresh or os.environ.get(FRESH_ENV, "") not in ("", "0")
    server = None if fresh or not _forkable(command) else _server(env)
    if server is not None:
        return server.run(command, env, str(cwd or os.getcwd()), timeout, merge)
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT if merge else subprocess.PIPE}
    with subprocess.Popen(command, env=env, cwd=cwd, text=True, **streams) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            tree = descendants(process.pid)
            seen = stacks(process.pid)  # before the kill: where it waited
            for pid in reversed(tree):  # the whole tree, as the test started it (an mpirun's ranks too)
                _kill(pid)
            out, err = process.communicate()
            raise TimedOut(command, timeout, out, err, seen) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


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
    with _lock:
        server = _servers.get(key)
        if server is not None and not server.alive():
            _servers.pop(key).close()
            server = None
        if server is None:
            if len(_servers) >= MAX_SERVERS:  # the least recently used idle one makes room (else: a fresh start)
                idle = next((old for old, made in _servers.items() if made is None or made.idle()), None)
                if idle is None:
                    return None
                ended = _servers.pop(idle)
                if ended is not None:
                    ended.close()
            server = _servers[key] = _made(env)
        else:
            _servers[key] = _servers.pop(key)  # most recently used last
        return server


def _made(env: dict):
    """A :class:`_Server` made by this process's maker thread, whichever thread asks: a preloaded process dies with
    the thread that started it (PDEATHSIG), and a fixture's pool thread ends before the test process does."""
    global _maker
    if _maker is None or not _maker.is_alive():
        _maker = threading.Thread(target=_make_servers, name="script-server-maker", daemon=True)
        _maker.start()
    answer = queue.Queue(maxsize=1)
    _requests.put((env, answer))
    return answer.get()


def _make_servers() -> None:
    """The maker thread: make each preloaded process asked for, for as long as the test process runs."""
    while True:
        env, answer = _requests.get()
        try:
            answer.put(_Server.make(env))
        except Exception:  # noqa: BLE001 (the asking thread's scripts then start fresh)
            answer.put(None)


class _Server:
    """One preloaded process (``python -m torchstage.launch.zygote``) on a Unix socket, forking scripts for any thread
    of this process, several at a time: a thread of its own reads the preloaded process's messages (each script
    ``started``, ``exited`` or ``failed``) and hands each to the run it is about."""

    def __init__(self, sock, popen):
        self.sock, self.popen, self.ids = sock, popen, itertools.count(1)
        self.sending, self.guard = threading.Lock(), threading.Lock()
        self.runs, self.by_pid, self.ended = {}, {}, False
        threading.Thread(target=self._route, name="script-server", daemon=True).start()

    @classmethod
    def make(cls, env: dict):
        """A preloaded process started with ``env``, ready; None where it could not be made (scripts start fresh)."""
        made, _ = rank_start._fresh_process([], PRELOAD, env=env)
        return None if made is None else cls(made[0], made[2])

    def alive(self) -> bool:
        """True while the preloaded process runs."""
        return self.popen.poll() is None and not self.ended

    def idle(self) -> bool:
        """True while no script of it runs."""
        with self.guard:
            return not self.runs

    def close(self) -> None:
        """End the preloaded process (closing its socket ends it) and reap it."""
        self.sock.close()
        reap(self.popen.pid, self.popen)

    def run(self, command: list, env: dict, cwd: str, timeout, merge: bool) -> subprocess.CompletedProcess:
        """Fork ``command`` (``python PROGRAM...``) and wait for its end, reading its output as it comes (stdout and
        stderr on one pipe with ``merge``)."""
        script = _Script(next(self.ids))
        out_r, out_w = os.pipe()
        err_r, err_w = (out_r, out_w) if merge else os.pipe()
        output = {out_r: bytearray(), err_r: bytearray()}
        try:
            with self.guard:
                if self.ended:
                    raise RuntimeError(f"the preloaded process ended before it could run {command}")
                self.runs[script.id] = script
            try:
                with self.sending:
                    send(self.sock, {"id": script.id, "program": command[1:], "env": env, "cwd": cwd,
                                     "orig_argv": command}, (out_w, err_w))
            except OSError:
                with self.guard:
                    self.runs.pop(script.id, None)  # never sent: no message will be about it
                raise
            finally:
                os.close(out_w)
                if not merge:
                    os.close(err_w)
            deadline = None if timeout is None else time.monotonic() + timeout
            reading = list(output)
            while not script.done.is_set() or reading:  # the script's end, and its output to the end
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    seen = stacks(script.pid) if script.pid is not None else "(it had not started)"
                    self._abandon(script)  # killed, as subprocess.run ends a child that ran past its timeout
                    raise TimedOut(command, timeout, *_text(output, out_r, err_r, merge), seen)
                waits = reading + ([script.wake_r] if not script.done.is_set() else [])
                ready, _, _ = select.select(waits, [], [], left)
                for fd in ready:
                    if fd == script.wake_r:
                        os.read(fd, 1)
                        continue
                    data = os.read(fd, 65536)
                    output[fd] += data
                    if not data:
                        reading.remove(fd)
            if script.error is not None:
                raise RuntimeError(f"{script.error} ({command})")
            return subprocess.CompletedProcess(command, script.code, *_text(output, out_r, err_r, merge))
        finally:
            for fd in output:
                os.close(fd)
            with self.guard:
                script.close()

    def _abandon(self, script) -> None:
        """Kill the script now, or as soon as the preloaded process says it started."""
        with self.guard:
            script.abandoned = True
            if script.pid is not None and not script.done.is_set():  # not yet reaped: the pid is still its own
                _kill(script.pid)

    def _route(self) -> None:
        """Hand each message of the preloaded process to its script; when it ends, every script still running fails."""
        try:
            while self._hand_on():
                pass
        finally:
            with self.guard:
                self.ended = True
                for script in self.runs.values():
                    script.finish(error="the preloaded process ended while it ran the script")
                self.runs.clear()

    def _hand_on(self) -> bool:
        """Hand one message to its script; False when the preloaded process closed the socket."""
        try:
            message, fds = receive(self.sock)
        except OSError:
            return False
        for fd in fds:
            os.close(fd)
        if message is None:
            return False
        kind, key, value = message[0], message[1], message[2]
        with self.guard:
            if kind == "started" and key in self.runs:
                script = self.runs[key]
                script.pid, self.by_pid[value] = value, script
                if script.abandoned:
                    _kill(value)
            elif kind == "failed" and key in self.runs:
                self.runs.pop(key).finish(error=f"the preloaded process could not fork it: {value}")
            elif kind == "exited" and key in self.by_pid:
                script = self.by_pid.pop(key)
                self.runs.pop(script.id, None)
                script.finish(code=value)
        return True


class _Script:
    """A script the preloaded process runs for a thread of this process: its pid, exit code or error, and a pipe
    that wakes the thread waiting on its output when it ends."""

    def __init__(self, id_: int):
        self.id, self.pid, self.code, self.error, self.abandoned = id_, None, None, None, False
        self.done = threading.Event()
        self.wake_r, self.wake_w = os.pipe()

    def finish(self, code=None, error=None) -> None:
        """Its end (under the server's guard): wake the waiting thread, unless it gave up on the script."""
        self.code, self.error = code, error
        self.done.set()
        if self.wake_w is not None:
            os.write(self.wake_w, b"x")

    def close(self) -> None:
        """The waiting thread is done with it (under the server's guard)."""
        os.close(self.wake_r)
        os.close(self.wake_w)
        self.wake_w = None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _text(output: dict, out_r: int, err_r: int, merge: bool) -> tuple:
    """stdout and stderr as ``text=True`` gives them: decoded, newlines translated (stderr None with ``merge``)."""
    texts = [bytes(output[fd]).decode().replace("\r\n", "\n").replace("\r", "\n") for fd in (out_r, err_r)]
    return (texts[0], None) if merge else tuple(texts)
