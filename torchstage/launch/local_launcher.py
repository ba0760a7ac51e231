"""Process management for local workers: start N ranks of this program, relay their output, fail fast.

The launcher runs this program again once per rank, with the torchrun variables set (forked from a preloaded process
or in a fresh interpreter, see :mod:`~torchstage.launch.rank_start`), watches the ranks and, when one fails,
terminates the others (TERM, a short grace, KILL) and returns the failing rank's exit code. Ranks die with the
launcher (``die_with_parent``, ``watch_parent``).
"""
import collections
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from torchstage.launch.failure_wait import ask_the_silent, await_records
from torchstage.launch.failures import FAILURE_DIR_ENV, LEFT_THE_RUN, explain, first_failure, read_failures, where
from torchstage.launch.rank_output import TRACEBACK, OutputGate, alike, consequences, last_error
from torchstage.launch.resolve import JOB_ID_ENV, LAUNCHED_ENV, RESTART_ENV
from torchstage.launch.startup_waits import ranges
from torchstage.launch.world import World

logger = logging.getLogger("torchstage")
PARENT_ENV = "TORCHSTAGE_PARENT_PID"
GRACE_SECONDS = 3.0
#: Signals the launcher passes on to its workers and keeps running (SLURM's --signal warnings, scancel -s).
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
TAIL_LINES = 100  # enough for a fault handler's stack dump of the training thread


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it), so two local jobs do not collide."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def relaunch_command() -> list:
    """The command line that started this interpreter, to run again in each worker.

    Raises RuntimeError from an interactive session, where there is no command to repeat.
    """
    argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    if sys.flags.interactive or sys.argv[0] in ("", "-") or "ipykernel" in sys.modules:
        raise RuntimeError("distributed training starts its processes by running this program's command again, "
                           "and an interactive session has none; put the training in a script and run it with "
                           "`python script.py` or `torchrun --nproc-per-node=N script.py`")
    return [sys.executable, *argv[1:]]


def worker_env(world: World, local_rank: int, port: int, environ=None, extra: dict = None) -> dict:
    """The environment of local worker ``local_rank`` (the launcher world's child): torchrun variables plus the
    launcher markers."""
    env = dict(os.environ if environ is None else environ)
    child = world.child(local_rank)
    env.update(RANK=str(child.rank), WORLD_SIZE=str(child.world_size), LOCAL_RANK=str(child.local_rank),
               LOCAL_WORLD_SIZE=str(child.local_size), GROUP_RANK=str(child.node_rank),
               MASTER_ADDR=child.master_addr, MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    if child.nnodes is not None:
        env["GROUP_WORLD_SIZE"] = str(child.nnodes)
    # Like torchrun: without a user setting, the workers share the cores instead of each spinning up
    # one OpenMP thread per core (oversubscription makes small ops 10-100x slower).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, world.spawn))))
    env[LAUNCHED_ENV] = "1"
    env[PARENT_ENV] = str(os.getpid())
    env.update(extra or {})
    return env


#: Seconds the other ranks get to exit by themselves after one failed before training: where every rank makes the
#: same mistake (a script error), each then says it, and the launcher prints it once with the ranks that met it.
EARLY_ERROR_GRACE = 1.0
#: Seconds a failed rank's peers get to show whether one of them was killed a moment before: the preloaded process
#: reports exits in the order it reaps them, not the order they happened.
KILLED_PEER_WAIT = 1.0


class Launcher:
    """Runs ``world.spawn`` workers of ``command`` once and returns the exit code of the run (see :meth:`run`).

    ``starter`` starts each worker from its environment (``start(env)`` gives a ``Popen``-like process with pipes
    for its output, see :mod:`~torchstage.launch.rank_start`); without one, each runs ``command`` in a new
    interpreter. ``attempt`` (0 first) and ``job_id`` reach the workers as ``TORCHSTAGE_RESTART_COUNT`` and
    ``TORCHSTAGE_JOB_ID``; with a ``failure_dir`` the failing ranks write their errors there, and
    :attr:`failure` holds the first one after a failed run.
    """

    def __init__(self, command: list, world: World, grace: float = GRACE_SECONDS, attempt: int = 0,
                 job_id: str = None, failure_dir: str = None, starter=None):
        self.command, self.world, self.grace, self.starter = command, world, grace, starter
        self.procs, self.threads = [], []
        self.tails = {}
        self.failure_dir, self.failure, self.failed_rank = failure_dir, None, None
        self.finished = {}  # rank -> monotonic time of its exit with code 0
        self.gate = OutputGate()  # the first failing rank's traceback, not its peers' echoes
        self.origin = None  # after a failure: the rank that caused it (see _fail)
        self.extra = {RESTART_ENV: str(attempt)}
        if job_id:
            self.extra[JOB_ID_ENV] = job_id
        if failure_dir:
            self.extra[FAILURE_DIR_ENV] = failure_dir

    def run(self) -> int:
        """0 when every worker succeeds; else the first failing worker's code (128 + signal if killed)."""
        port = self.world.master_port or free_port()
        # a signal ignored when the launcher started (nohup's SIGHUP, SIGINT of a `cmd &` in a script) stays ignored,
        # here and in every rank (an exec keeps it ignored, as a preloaded rank does)
        handlers = {sig: self._on_signal for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        handlers.update({sig: self._forward for sig in FORWARDED_SIGNALS})
        old = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()
               if signal.getsignal(sig) != signal.SIG_IGN}
        try:
            for local_rank in range(self.world.spawn):
                self._start(local_rank, port)
            return self._watch()
        finally:
            self._stop_all()
            for thread in self.threads:
                thread.join(timeout=2)
            self.gate.release()
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _start(self, local_rank: int, port: int) -> None:
        rank = self.world.child(local_rank).rank
        env = worker_env(self.world, local_rank, port, extra=self.extra)
        if self.starter is not None:
            proc = self.starter.start(env)
        else:
            proc = subprocess.Popen(self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        proc.rank = rank
        self.procs.append(proc)
        self.tails[rank] = collections.deque(maxlen=TAIL_LINES)
        for pipe, out, tail in ((proc.stdout, sys.stdout, None), (proc.stderr, sys.stderr, self.tails[rank])):
            thread = threading.Thread(target=_relay, args=(pipe, out, f"[rank{rank}]: ", tail),
                                      kwargs={"gate": lambda text, emit, rank=rank: self.gate.admit(rank, text, emit)},
                                      daemon=True)
            thread.start()
            self.threads.append(thread)

    def _watch(self) -> int:
        """Wait for exits in the order they happen, so the first failure (not a peer's echo) is reported."""
        exits = queue.Queue()
        for proc in self.procs:
            threading.Thread(target=self._wait, args=(proc, exits), daemon=True).start()
        for _ in self.procs:
            while True:
                try:  # a timeout keeps the main thread responsive to signals
                    proc, code = exits.get(timeout=0.5)
                    break
                except queue.Empty:
                    self.gate.release_stale()
            if code != 0:
                return self._fail(proc, code)
            self.finished[proc.rank] = time.monotonic()
        return 0

    def _wait(self, proc, exits) -> None:
        code = proc.wait()
        if code != 0:
            self.gate.fails(proc.rank)  # its peers' output from now on is held: they fail because it did
        exits.put((proc, code))

    def _fail(self, proc, code: int) -> int:
        if code > 0:
            proc, code = self._killed_peer(proc, code)
        records = read_failures(self.failure_dir) if self.failure_dir else {}
        if code < 0 and self.failure_dir:  # killed: its peers notice in a moment and say where they were
            records = ask_the_silent(self.procs, proc.rank, await_records(self.procs, proc.rank, self.failure_dir),
                                     self.failure_dir)
        if code > 0 and records.get(proc.rank, {}).get("stopped"):
            self._let_exit()  # a graceful stop: every rank is on its way out, its checkpoint written
            records = read_failures(self.failure_dir)
        elif code > 0 and not records:  # an error before training: the others, a moment behind, may meet it too
            self._let_exit(EARLY_ERROR_GRACE)
        self._await_leavers(proc, records)
        self._stop_all()
        for thread in self.threads:
            thread.join(timeout=2)
        exit_code = 128 - code if code < 0 else code
        reason = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = "".join(self.tails.get(proc.rank, ()))
        # a rank killed without a word is the cause: the others' records are their peers' echo of its death
        self.failure = None if code < 0 and proc.rank not in records else first_failure(records)
        self.failed_rank = proc.rank
        if self.failure is not None and self.failure.get("outcome"):  # a command's result: said as it is
            logger.warning("%s; exit code %d", self.failure["error"], exit_code)
            return exit_code
        if self.failure is not None and self.failure.get("stopped"):
            place = where(self.failure)
            logger.warning("the run %s %s; exit code %d", self.failure["error"],
                           place if place.startswith("before") else f"at {place}", exit_code)
            return exit_code
        # the cause: the first recorded error, else the killed rank, else the rank whose traceback came first
        self.origin = (self.failure["rank"] if self.failure is not None else proc.rank
                       if code < 0 or self.gate.origin is None else self.gate.origin)
        cause = next((p for p in self.procs if p.rank == self.origin and p is not proc), None)
        if self.failure is not None and cause is not None and (cause.returncode or 0) > 0:  # its echo exited a moment before it: said of the cause,
            proc, code = cause, cause.returncode  # and the job ends as the cause did (a hang's 124)
            exit_code, reason, tail = code, f"exited with code {code}", "".join(self.tails.get(proc.rank, ()))
            self.failed_rank = proc.rank
        first_error = self.failure["error"].splitlines()[0] if self.failure is not None else self.error_line()
        same, held = alike(self.gate.take(self.origin), first_error)  # one mistake every rank met: said once
        echoes = consequences(held)
        first = ""
        if self.failure is None and code > 0 and self.error_line() is not None:  # no record: what its output says
            first = f" The first error, on rank {self.origin} (before its run recorded anything): {self.error_line()}."
        if self.failure is not None:
            origin, rank = self.failure.get("origin_rank"), self.failure["rank"]  # origin: the rank it was seen on
            by = f" (reported by rank {rank})" if origin is not None and origin != rank else ""
            first = (f" The first error, on rank {rank if not by else origin} at {where(self.failure)}: "
                     f"{self.failure['error'].splitlines()[0]}{by}.")
        if same and first:
            first += f" Rank{'s' * (len(same) > 1)} {ranges(same)} raised the same error."
        now = time.monotonic()
        left = [f"Rank {rank} had exited with code 0 {now - at:.1f} s before, while the others still ran."
                for rank, at in sorted(self.finished.items(), key=lambda item: item[1])]
        silent = [proc.rank] if code < 0 else []  # killed: it recorded nothing
        notes = "".join(f"\n{line}" for line in [*left, *explain(records, silent, tail)])
        if any(line.startswith(TRACEBACK) for line in self.tails.get(self.origin, ())):
            output = f"\nThe traceback of rank {self.origin} is above."  # shown once, as it came
        else:  # a hang report, a fault handler's stack: repeated last, where it is seen
            output = f"\nLast error output of rank {proc.rank}:\n{tail.rstrip() or '(none)'}"
        logger.error("rank %d %s; stopped the other ranks.%s%s%s%s", proc.rank, reason, first, notes, output,
                     f"\n{echoes}" if echoes else "")
        return exit_code

    def _await_leavers(self, failed, records: dict) -> None:
        """Let the ranks that left the run on their own (``sys.exit``: their record says so) finish exiting, up to
        ``grace`` seconds, and note those that exited with code 0: their peers fail the moment their connections
        close, often before the leaver's interpreter has ended (or its exit is queued behind theirs), and stopping
        it then would hide how it ended."""
        deadline = time.monotonic() + self.grace
        for proc in self.procs:
            record = records.get(proc.rank, {})
            if proc is failed or proc.rank in self.finished or not record.get("error", "").startswith(LEFT_THE_RUN):
                continue
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
            if code == 0:
                self.finished[proc.rank] = getattr(proc, "ended_at", None) or time.monotonic()

    def _killed_peer(self, proc, code: int, seconds: float = KILLED_PEER_WAIT):
        """A rank killed by a signal about when ``proc`` failed, with its code, else ``proc`` and ``code``: the
        killed rank is the cause, and its peers' errors (a closed connection, a pipeline stage that lost its
        neighbour) are the echo of its death, whichever exit was reported first."""
        deadline = time.monotonic() + seconds
        while True:
            others = [p for p in self.procs if p is not proc]
            killed = next((p for p in others if (p.poll() or 0) < 0), None)
            if killed is not None:
                return killed, killed.returncode
            if time.monotonic() > deadline or all(p.poll() is not None for p in others):
                return proc, code
            time.sleep(0.02)

    def error_line(self):
        """After a failed :meth:`run`: the error line (``ValueError: ...``) of the last traceback of the rank that
        caused the failure, None without one."""
        return last_error(self.tails.get(self.origin, ()))

    def _let_exit(self, seconds: float = None) -> None:
        """Give the live workers ``seconds`` (the launcher's ``grace``) to exit by themselves."""
        deadline = time.monotonic() + (self.grace if seconds is None else seconds)
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def _stop_all(self, sig=signal.SIGTERM) -> None:
        """``sig`` (TERM) to every live worker's process group, wait ``grace`` seconds, then KILL what is left."""
        live = [p for p in self.procs if p.poll() is None]
        for proc in live:
            _signal_group(proc, sig)
        deadline = time.monotonic() + self.grace
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:  # KILL stragglers and the groups' leftovers (data-loader workers)
            _signal_group(proc, signal.SIGKILL)
            if proc.poll() is None:
                proc.wait()

    def _forward(self, signum, frame):
        """Pass a signal on to each live worker (not its data-loader processes) and keep watching."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def _on_signal(self, signum, frame):
        # Ctrl-C reaches the workers as SIGINT, so they log the launcher's exit code (130) and a second
        # Ctrl-C (this handler again, during the grace period) interrupts them at once.
        self._stop_all(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        raise SystemExit(128 + signum)


def _signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _relay(pipe, out, prefix: str, tail, gate=None) -> None:
    """Copy lines from a worker's pipe to ``out`` with a rank prefix; keep the last ones in ``tail``.

    The prefix has torch's own format (``[rank3]: ``), and lines torch already prefixed keep theirs. ``gate(text,
    write)`` decides when each line is written (:class:`~torchstage.launch.rank_output.OutputGate`): now, later or
    never.
    """
    data = prefix.encode()
    target = getattr(out, "buffer", None)
    for line in iter(pipe.readline, b""):
        if line.startswith(data):
            line = line[len(data):]
        if not line.strip():
            continue  # a blank line (a closed progress bar, a print()) would show as a bare "[rankN]: "
        text = line.decode(errors="replace")
        if tail is not None:
            tail.append(text)
        if gate is None:
            _write(out, target, data + line, prefix + text)
        else:
            gate(text, lambda raw=data + line, shown=prefix + text: _write(out, target, raw, shown))
    pipe.close()


def _write(out, target, raw: bytes, text: str) -> None:
    if target is not None:
        target.write(raw)
        target.flush()
    else:
        out.write(text)
        out.flush()


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent thread ends (Linux PDEATHSIG); end it now if ``parent`` is gone already."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # inside the try: without ctypes the child just gets no death signal
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before we got here
        os._exit(128 + signal.SIGKILL)


def watch_parent() -> None:
    """In a launched worker: die with the launcher (Linux PDEATHSIG, plus a parent-pid watchdog)."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if not parent:
        return
    die_with_parent(parent)

    def watchdog():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(128 + signal.SIGKILL)

    threading.Thread(target=watchdog, name="torchstage-parent-watchdog", daemon=True).start()
