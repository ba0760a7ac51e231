"""The preloaded process of a node: torch and torchstage imported once, each rank forked from it.

The launcher (:mod:`~torchstage.launch.rank_start`) makes it either by forking the launching process, when that is
safe (:mod:`~torchstage.launch.fork_safety`), or as a fresh interpreter (``python -m torchstage.launch.zygote FD
PID``) that imports what the launching process had imported. It then imports what ranks import before their first
step (``preload``), checks that it is still safe to fork, says ``ready`` and serves the launcher over one Unix socket:
``start`` (the rank's program, environment, working directory, and its stdout/stderr pipes as passed descriptors)
is answered ``started`` with the rank's pid, and each rank's end is reported as ``exited`` with its exit code (as
``Popen.returncode``). It runs nothing else: no threads, no device, signals from a terminal or a scheduler ignored
(the launcher decides what reaches the ranks). It ends when the launcher closes the socket, and dies with the
launcher (PDEATHSIG); its ranks die with it.
"""
import gc
import importlib
import os
import pickle
import select
import signal
import socket
import sys
import traceback

from torchstage.launch.fork_safety import native_threads, threads_after_fork, unsafe_to_fork
from torchstage.launch.forked_rank import become_rank
from torchstage.launch.local_launcher import die_with_parent

#: Signals the preloaded process ignores: the launcher receives them and decides what its ranks get.
IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
MAX_MESSAGE = 1 << 20


def send(sock, message, fds=()) -> None:
    """One message (a pickled tuple), with ``fds`` passed along."""
    data = pickle.dumps(message)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def receive(sock):
    """``(message, fds)``; ``(None, [])`` when the other end closed."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
    return (pickle.loads(data) if data else None), fds


def serve(sock, launcher: int, preload=()) -> None:
    """Be the preloaded process: import ``preload``, say ``ready`` (or why forking is unsafe here) and start ranks
    until the launcher (pid ``launcher``) closes ``sock``; never returns."""
    code = 0
    try:
        die_with_parent(launcher)
        handlers = _handlers_to_restore()
        for sig in IGNORED:
            signal.signal(sig, signal.SIG_IGN)
        _import(preload)
        reason = _unsafe_here()
        send(sock, ("ready", os.getpid(), reason))
        if reason is None:
            gc.collect()
            gc.freeze()  # what every rank shares stays shared: no collector writes into its pages
            _loop(sock, handlers)
    except BaseException:  # noqa: BLE001 (the launcher sees the socket close and starts fresh interpreters)
        traceback.print_exc()
        code = 70
    os._exit(code)


def _handlers_to_restore() -> dict:
    """The signal handlers a rank must get back: those this process changes, and any the program set."""
    handlers = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.getsignal(sig)
        if handler is not None and (sig in IGNORED or sig == signal.SIGCHLD or handler != signal.SIG_DFL):
            handlers[sig] = handler
    return handlers


def _import(names) -> None:
    """Import ``names``; one that fails here is left to the rank (which imports it, or fails, itself)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (a module that cannot load here loads, or fails, in the rank)
            pass


def _unsafe_here():
    """Why ranks must not be forked from this process now, or None (a probe fork tells the pools that stop around
    fork, such as OpenBLAS's, from those that do not)."""
    reason = unsafe_to_fork()
    if reason is None and native_threads() > 1:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        reason = threads_after_fork()
    return reason


def _loop(sock, handlers: dict) -> None:
    """Start ranks on request and report their ends until the launcher closes ``sock``."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select() through wake_w

    def close_own():
        """In a rank: close what only this process uses."""
        sock.close()
        os.close(wake_r)
        os.close(wake_w)

    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            _drain(wake_r)
        _reap(sock)
        if sock in ready:
            request, fds = receive(sock)
            if request is None:
                return
            _start(sock, request, fds, handlers, close_own)


def _drain(fd) -> None:
    """Empty the signal wake-up pipe."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap(sock) -> None:
    """Report every rank that ended, with its exit code as ``Popen.returncode`` has it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, ("exited", pid, os.waitstatus_to_exitcode(status)))


def _start(sock, request: dict, fds: list, handlers: dict, close_own) -> None:
    """Fork the rank ``request`` asks for (its pipes: ``fds``) and answer with its pid, or why not."""
    reason = threads_after_fork()  # nothing here starts threads; should something have, refuse
    if reason is not None or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        send(sock, ("failed", request["id"], reason or f"expected 2 pipes, got {len(fds)}"))
        return
    request["parent"] = os.getpid()
    pid = os.fork()
    if pid == 0:
        become_rank(request, fds, handlers, close_own)  # never returns
    for fd in fds:
        os.close(fd)
    send(sock, ("started", request["id"], pid))


def main(argv: list) -> None:
    """``python -m torchstage.launch.zygote FD LAUNCHER_PID``: a fresh preloaded process on socket ``FD``; its
    first message names the modules to import."""
    sock = socket.socket(fileno=int(argv[0]))
    message, _ = receive(sock)
    if message is None or message[0] != "preload":
        os._exit(0)
    serve(sock, int(argv[1]), message[1])


if __name__ == "__main__":
    main(sys.argv[1:])
