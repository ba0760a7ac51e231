"""How the launcher starts a rank: forked from the node's preloaded process (the default), or a fresh interpreter.

A fresh interpreter per rank (``python -m torchstage.launch.seeded_entry <program>``) imports torch and torchstage
again in every rank and at every restart: seconds of CPU each, and on a shared file system thousands of file
lookups each. :func:`rank_start` instead makes one preloaded process per launch (:mod:`~torchstage.launch.zygote`)
and forks every rank from it; the rank runs the program from its first line as ``__main__``, as before
(:mod:`~torchstage.launch.forked_rank`). The preloaded process is a fork of the launching process where that is safe
(:mod:`~torchstage.launch.fork_safety`: no other threads, no device context), else a fresh interpreter importing
what the launching process had imported; where neither is safe, or with ``start="fresh"`` (``TORCHSTAGE_START``),
each rank is a fresh interpreter, and the launch line says why.
"""
import os
import signal
import socket
import subprocess
import sys

from torchstage.launch.fork_safety import patched_by_program, threads_after_fork, unsafe_to_fork
from torchstage.launch.forked_rank import program_files
from torchstage.launch.preloaded import PreloadedStart, reap
from torchstage.launch.script_seed import program_of, seeded_command
from torchstage.launch.zygote import receive, send, serve

START_ENV = "TORCHSTAGE_START"
PRELOADED, FRESH = "preloaded", "fresh"
#: What every rank imports before its first step beyond the program's own imports: the preloaded process imports
#: them once (torch's compiler front end alone, which the first optimizer step imports, is a second of CPU).
RANK_IMPORTS = ("torch.distributed.distributed_c10d", "torch.nn.parallel.distributed", "torch._dynamo",
                "torch.distributed.algorithms.join", "torch.utils.data.distributed", "torch.profiler._cupti_monitor",
                "multiprocessing.popen_fork", "multiprocessing.queues", "multiprocessing.synchronize")
READY_SECONDS = 300.0  # a preloaded process importing on a busy node; a slower one is given up for fresh starts


def check_start(value=None, name: str = "start") -> str:
    """``"preloaded"`` or ``"fresh"``; ``None``: ``$TORCHSTAGE_START``, else ``"preloaded"``. ValueError otherwise."""
    if value is None:
        value, name = os.environ.get(START_ENV, "").strip() or PRELOADED, START_ENV
    if value not in (PRELOADED, FRESH):
        raise ValueError(f"{name} must be {PRELOADED!r} (ranks forked from a process that imported torch once) or "
                         f"{FRESH!r} (a fresh interpreter per rank), got {value!r}")
    return value


class FreshStart:
    """Each rank a new interpreter running ``command`` (the program through the seeding entry)."""

    kind = FRESH

    def __init__(self, command: list, why: str = None):
        """``command``: the program through the seeding entry; ``why``: why ranks start fresh (said on the launch
        line, so that a user who expected preloaded starts learns the cause without debug logs)."""
        self.command, self.why = command, why

    def start(self, env: dict):
        """A new interpreter for the rank with ``env``, its output piped, in a session of its own."""
        return subprocess.Popen(self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)

    def close(self) -> None:
        """Nothing to end: each rank is the launcher's own child."""


def rank_start(command: list, start=None, preload=()):
    """How this launch starts its ranks (see the module's text): a :class:`PreloadedStart`, or a :class:`FreshStart`
    of ``command`` (this program's command line, :func:`~torchstage.launch.local_launcher.relaunch_command`).

    Call it before anything else of the launch: a preloaded process forked from here is a copy of this process as
    the program left it. ``preload``: modules to import there besides :data:`RANK_IMPORTS`.
    """
    command_seeded = seeded_command(command)
    if check_start(start) == FRESH:
        return FreshStart(command_seeded, "start='fresh'" if start else f"{START_ENV}=fresh")
    split = program_of(command)
    if split is None:
        return FreshStart(command_seeded, f"the program cannot be told apart from the interpreter's options in "
                                          f"{' '.join(command)}")
    options, program = split
    preload = (*RANK_IMPORTS, *preload)
    reason = unsafe_to_fork() or patched_by_program(program_files(program))
    made = _fork_here(preload) if reason is None else None
    if made is not None and made[0] is None:
        reason, made = made[1], None
    if made is None:
        made = _fresh_process(options, (*_imported_here(), *preload))
        if made[0] is None:
            return FreshStart(command_seeded, f"no preloaded process: this one cannot be forked ({reason}), and a "
                                              f"fresh one could not be used ({made[1]})")
    sock, pid, popen = made[0]
    return PreloadedStart(sock, pid, program, command_seeded, popen, reason)


def _fork_here(preload):
    """``((sock, pid, None), None)`` for a preloaded process forked from this one, or ``(None, why not)``."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # else both processes would write what is buffered
        except Exception:  # noqa: BLE001
            pass
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        serve(theirs, launcher, preload)  # never returns
    theirs.close()
    reason = threads_after_fork()
    if reason is not None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        ours.close()
        return None, reason
    return _ready(ours, pid, None)


def _fresh_process(options: list, preload, env: dict = None):
    """A preloaded process started as a new interpreter (``python -m torchstage.launch.zygote``; with ``env``, else
    this process's environment), importing ``preload``."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        popen = subprocess.Popen([sys.executable, *options, "-m", "torchstage.launch.zygote", str(theirs.fileno()),
                                  str(os.getpid())], pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL, env=env)
    except OSError as exc:
        ours.close()
        return None, f"cannot start it ({exc})"
    finally:
        theirs.close()
    try:
        send(ours, ("preload", list(preload)))
    except OSError:
        pass
    return _ready(ours, popen.pid, popen)


def _ready(sock, pid: int, popen):
    """Wait for the preloaded process's ``ready``; ``((sock, pid, popen), None)``, or ``(None, why not)``."""
    sock.settimeout(READY_SECONDS)
    try:
        message, _ = receive(sock)
    except (OSError, EOFError) as exc:
        message = ("ready", pid, f"it did not answer ({exc})")
    sock.settimeout(None)
    reason = "it ended before it was ready" if message is None else message[2]
    if reason is None:
        return (sock, pid, popen), None
    sock.close()
    if popen is None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reap(pid, popen, seconds=0.0 if popen is None else 5.0)
    return None, f"preloading is unsafe there: {reason}"


def _imported_here() -> list:
    """The installed packages (top-level names) and torchstage modules this process imported: what a fresh preloaded
    process imports so that its ranks find them loaded."""
    prefixes = tuple(os.path.join(os.path.abspath(p), "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    names = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith("torchstage.") or (
                "." not in name and not name.startswith("_") and isinstance(path, str) and path.startswith(prefixes)):
            names.append(name)
    return sorted(names, key=lambda name: name.startswith("torchstage"))
