"""Whether this process may be copied by ``fork()`` to start ranks: what a copy must never inherit.

A forked process holds only the thread that forked. State that lives in other threads or in a device driver does
not come along: a GNU OpenMP pool (torch's intra-op threads, started by a large tensor operation) deadlocks the
copy's next parallel region, a CUDA context (``torch.cuda`` initialised, or ``cuInit`` through
``torch.cuda.is_available()``) fails in it, Python threads leave their locks held, an initialised MPI library breaks.
Pools that stop themselves around ``fork()`` (OpenBLAS, numpy's) are safe: :func:`threads_after_fork` tells them
apart from the others by counting, in the parent, the threads a fork left running.
"""
import os
import sys
import threading
from types import FunctionType
from typing import Optional

#: Device modules of torch whose initialisation makes a fork unsafe.
DEVICE_MODULES = ("cuda", "xpu", "mtia")


def native_threads() -> int:
    """The threads of this process, Python's and native ones (OpenMP, BLAS, drivers); 1 where unknown."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def cuda_driver_path() -> Optional[str]:
    """The CUDA driver library's file where it is mapped into this process, else None. Importing torch may map it
    (some CUDA builds link it) without initialising it."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "/libcuda.so" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


def cuda_driver_initialised() -> bool:
    """True once ``cuInit`` ran in this process (``torch.cuda.is_available()`` without NVML, any CUDA call): a fork
    cannot use that driver state. Asked of the mapped driver itself, which answers ``cuDeviceGetCount`` with
    CUDA_ERROR_NOT_INITIALIZED (3) until then; a driver merely mapped, never initialised, is safe to fork."""
    path = cuda_driver_path()
    if path is None:
        return False
    import ctypes
    try:  # RTLD_NOLOAD: the handle of the library already mapped, never a second load
        driver = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        count = ctypes.c_int(0)
        return driver.cuDeviceGetCount(ctypes.byref(count)) == 0
    except (OSError, AttributeError):
        return True  # mapped and not asked: assume the unsafe case


def unsafe_to_fork() -> Optional[str]:
    """Why this process must not be copied to start ranks, or None where a fork may be tried (the threads a fork
    leaves running are checked after it, :func:`threads_after_fork`)."""
    if not sys.platform.startswith("linux"):
        return f"preloaded starts are made on Linux only (this is {sys.platform})"
    if threading.current_thread() is not threading.main_thread():
        return f"the launch runs in thread {threading.current_thread().name!r}, not the main thread"
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        return f"{len(others)} Python thread(s) run beside the main one ({', '.join(others[:4])})"
    torch = sys.modules.get("torch")
    for name in DEVICE_MODULES if torch is not None else ():
        initialised = getattr(getattr(torch, name, None), "is_initialized", None)
        if initialised is not None and initialised():
            return f"torch.{name} is initialised here (a device context cannot be copied into another process)"
    if cuda_driver_initialised():
        return "the CUDA driver is initialised here (torch.cuda.is_available() or another CUDA call)"
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return "MPI is initialised here (mpi4py)"
    return None


def threads_after_fork() -> Optional[str]:
    """In the parent, just after a fork: why the copy is unsafe (threads that kept running through the fork, so
    their libraries' state came along without them), or None. Pools that stop around ``fork()`` are gone by now."""
    left = native_threads() - 1
    if left > 0:
        return (f"{left} thread(s) kept running through fork(): an OpenMP pool (a large tensor operation before "
                f"train() starts torch's intra-op threads), or a library's own threads")
    return None


def patched_by_program(program_files) -> Optional[str]:
    """Where the program (``program_files``: its script and its own folder's modules) put a function of its own in
    a module it did not write (wrapping torch's, say): a copy would hold that replacement when the program runs
    again and wraps it twice. None where it did not."""
    files = {*program_files, *(os.path.abspath(path) for path in program_files)}
    for name, module in list(sys.modules.items()):
        if name in ("__main__", "__mp_main__", "sys") or getattr(module, "__file__", None) in files:
            continue
        try:
            values = list(vars(module).items())
        except TypeError:
            continue
        for key, value in values:
            if type(value) is FunctionType and value.__code__.co_filename in files:
                return f"the program replaced {name}.{key} with its {value.__qualname__}"
    return None
