"""A rank forked from the preloaded process: made to start as a fresh interpreter would, then the program runs.

:mod:`~torchstage.launch.zygote` forks each rank from a process that imported torch and torchstage once. Before the
program's first line the copy gets what a fresh ``python -m torchstage.launch.seeded_entry <program>`` would have:
its own session, a parent-death signal, the rank's output pipes as fd 1 and 2 (unbuffered under
``PYTHONUNBUFFERED``), the rank's environment, working directory and ``sys.orig_argv``, the signal handlers of a new
interpreter, torch's intra-op thread count from ``OMP_NUM_THREADS``, torch and numpy generators seeded from the OS,
fresh warning registries, and the modules of the program's own folder forgotten so that they run again, like the
program (installed packages, torch and torchstage stay imported: that is the saving). The program then runs as
``__main__``, seeded with the launch seed (:mod:`seeded_entry`), and the rank ends as an interpreter does: an
escaping error printed (without this module's frames), non-daemon threads joined, ``atexit`` run, its garbage
collected, output flushed; then ``os._exit`` with Python's exit code.
"""
import atexit
import gc
import io
import os
import signal
import sys
import threading
import traceback
import warnings
import weakref

from torchstage.launch import seeded_entry
from torchstage.launch.local_launcher import PARENT_ENV, die_with_parent

#: The signals a new interpreter handles itself; every other Python handler becomes SIG_DFL in a rank.
_PYTHON_DEFAULTS = {signal.SIGINT: signal.default_int_handler}
#: Prefixes whose modules a rank keeps although they lie in the program's folder (a checkout run from its root).
_KEPT = ("torchstage", "torch")


def become_rank(request: dict, fds: list, handlers: dict, close) -> None:
    """In the child of a fork: turn into the rank ``request`` describes and run its program; never returns.

    ``fds`` are the rank's stdout and stderr pipes, ``handlers`` the signal handlers the preloaded process had before
    it changed its own, ``close()`` closes what the preloaded process keeps for itself (its socket).
    """
    code, streams, modules = 70, [], []  # 70 (EX_SOFTWARE): the rank could not be set up
    try:
        close()
        _restore_signals(handlers)
        os.setsid()
        die_with_parent(request["parent"])
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        if PARENT_ENV in os.environ:  # the launcher's worker: its parent is this process now
            os.environ[PARENT_ENV] = str(request["parent"])
        os.chdir(request["cwd"])
        sys.orig_argv = list(request.get("orig_argv") or sys.orig_argv)  # the fresh start's command line
        streams = _fresh_stdio(request["env"])
        launching = sys.modules.get("__main__")  # the launching program's module, not this rank's to clear
        _forget_parent_state(request["program"])
        code = _run(request["program"], modules)
        modules = [m for m in (*modules, sys.modules.get("__main__")) if m is not None and m is not launching]
    except BaseException:  # noqa: BLE001 (a failure to set the rank up: shown in its output, exit 70)
        traceback.print_exc()
    _finish(code, modules, streams)


def _restore_signals(handlers: dict) -> None:
    """The handlers a new interpreter starts with: Python's SIGINT handler, SIG_DFL for the program's own (it sets
    them again), SIG_IGN where the launcher inherited it (an exec keeps an ignored signal ignored)."""
    signal.set_wakeup_fd(-1)
    for sig, handler in handlers.items():
        if handler not in (signal.SIG_DFL, signal.SIG_IGN):
            handler = _PYTHON_DEFAULTS.get(sig, signal.SIG_DFL)
        signal.signal(sig, handler)


def _fresh_stdio(env: dict) -> list:
    """New ``sys.stdout``/``sys.stderr`` on fd 1 and 2, buffered as a new interpreter's (``PYTHONUNBUFFERED``);
    the old ones, which handlers made before the fork still write to (now on fd 1 and 2 too)."""
    unbuffered, old_streams = bool(env.get("PYTHONUNBUFFERED")), []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw),
                                  encoding=getattr(old, "encoding", None) or "utf-8",
                                  errors=getattr(old, "errors", None) or "strict", newline="\n",
                                  line_buffering=not unbuffered and (name == "stderr" or raw.isatty()),
                                  write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
        old_streams.append(old)
    return old_streams


def _forget_parent_state(program: list) -> None:
    """Undo what the preloaded process did that a new interpreter would not have done yet."""
    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))  # libgomp read the variable at load, in the parent
    _fresh_generators()
    warnings.onceregistry.clear()
    warnings._filters_mutated()  # every module's __warningregistry__ is stale: warnings show again, as in a new one
    for info in getattr(weakref.finalize, "_registry", {}).values():
        info.atexit = False  # the parent's objects' finalizers (its temporary directories) are not this rank's
    _forget_multiprocessing()
    notes = sys.modules.get("torchstage.logging_setup")
    if notes is not None:
        notes._noted.clear()  # torchstage's once-per-process notes: this rank's main rank says them again
    sys.setrecursionlimit(sys.getrecursionlimit() + _depth())  # the inherited frames below the program
    files = program_files(program)
    for hook in ("excepthook", "displayhook", "breakpointhook", "unraisablehook"):
        if getattr(getattr(getattr(sys, hook), "__code__", None), "co_filename", None) in files:
            setattr(sys, hook, getattr(sys, f"__{hook}__"))  # the program sets its own again
    forgotten = local_modules(program_folder(program))
    below = tuple(f"{name}." for name in forgotten)  # with the namespace packages below them, which have no file
    for name in [name for name in sys.modules if name in forgotten or name.startswith(below)]:
        del sys.modules[name]


def _fresh_generators() -> None:
    """torch's and numpy's global generators seeded from the OS, as a new interpreter's are (every copy of the
    preloaded process would otherwise draw the same numbers; python's ``random`` reseeds itself after a fork). A
    launched rank's program is then seeded with the launch seed (:mod:`seeded_entry`) before its first line."""
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def _forget_multiprocessing() -> None:
    """multiprocessing's record of the parent's children and finalizers, reset as its own forked children do."""
    process, util = sys.modules.get("multiprocessing.process"), sys.modules.get("multiprocessing.util")
    if process is not None:
        process._children = set()
    if util is not None:
        util._finalizer_registry.clear()
        util._run_after_forkers()


def _depth() -> int:
    """How many frames lie below this one (the launching program's, inherited by the copy)."""
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def program_folder(program: list) -> str:
    """The folder of the program's own modules: its script's, or the working directory for ``-m`` and ``-c``."""
    return os.path.dirname(os.path.abspath(program[0])) if program[0] not in ("-m", "-c") else os.getcwd()


def program_files(program: list) -> set:
    """The files of the program: its script (as given and absolute) and its own folder's modules."""
    main = program[0] if program[0] not in ("-m", "-c") else "<string>" if program[0] == "-c" else getattr(
        sys.modules.get("__main__"), "__file__", None)
    files = {main, os.path.abspath(main)} if isinstance(main, str) and main != "<string>" else {main}
    return files | {sys.modules[name].__file__ for name in local_modules(program_folder(program))}


def local_modules(folder: str) -> list:
    """The modules loaded from Python files in ``folder`` (the program's own), not from an installation (the
    interpreter's prefixes, site-packages) and not torch's or torchstage's: a rank imports them again. Paths are
    compared as written (a realpath per module would cost a thousand file lookups per rank)."""
    folders = tuple({os.path.join(path, "") for path in (os.path.abspath(folder), os.path.realpath(folder))})
    installed = tuple({os.path.join(os.path.abspath(path), "") for path in (sys.prefix, sys.base_prefix,
                                                                            sys.exec_prefix)})
    names = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name in ("__main__", "__mp_main__") or name.split(".")[0] in _KEPT or not isinstance(path, str):
            continue
        if path.endswith(".py") and path.startswith(folders) and not path.startswith(installed):
            names.append(name)
    return names


def _run(program: list, modules: list) -> int:
    """Run ``program`` as ``__main__`` (seeded, see :mod:`seeded_entry`; the module it ran in goes to ``modules``);
    its exit status as python's."""
    try:
        modules.append(seeded_entry.main(program))
    except SystemExit as exit:
        return _exit_status(exit.code)
    except KeyboardInterrupt as error:
        _print_error(error)
        return -signal.SIGINT  # python ends itself by SIGINT after an uncaught Ctrl-C
    except BaseException as error:  # noqa: BLE001 (shown as python would, exit code 1)
        _print_error(error)
        return 1
    return 0


def _print_error(error: BaseException) -> None:
    """Show ``error`` as python shows an uncaught one, from the program's first frame on."""
    error.with_traceback(seeded_entry.without_entry_frames(error.__traceback__, (__file__,)))
    sys.excepthook(type(error), error, error.__traceback__)


def _exit_status(code) -> int:
    """The status python exits with for ``sys.exit(code)``: 0 for None, the int, else 1 after printing it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _finish(code: int, modules: list, streams: list) -> None:
    """End as an interpreter does: join non-daemon threads, run ``atexit``, clear the program's globals (``modules``:
    its open files are flushed as they go), collect, flush; then exit."""
    for step in (threading._shutdown, atexit._run_exitfuncs, lambda: _clear(modules), gc.collect):
        try:
            step()
        except BaseException:  # noqa: BLE001 (as at an interpreter's exit: the exit code stands)
            pass
    for stream in (sys.stdout, sys.stderr, *streams):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _clear(modules: list) -> None:
    """Set the globals of ``modules`` to None, as an interpreter's end does: what they held is finalized."""
    for module in {id(module): module for module in modules}.values():
        for name in [name for name in vars(module) if name != "__builtins__"]:
            vars(module)[name] = None
