"""A last word before a C++ abort: a Python function that runs when this process ends in ``std::terminate``.

An exception that escapes a C++ thread (gloo's transport thread throws when a peer sends more bytes than a
collective expects: the ranks ran different collectives) ends the process through ``std::terminate``, with no
Python exception and no ``except`` or ``finally``. :func:`on_terminate` puts a handler in front of the one
installed before (libstdc++'s prints the exception, then aborts): it runs the function once, in the dying
thread (holding the GIL while it runs), then hands over. Linux with libstdc++ only; elsewhere nothing is
installed. Should the GIL never come free (a thread blocked in C++ holding it), the process waits instead of
aborting, and the peers' hang watchdog ends the job.
"""
import ctypes
import os

_HANDLER = ctypes.CFUNCTYPE(None)
_SET_TERMINATE = "_ZSt13set_terminatePFvvE"  # std::set_terminate(void (*)()), as libstdc++ exports it
_KEEP = []  # the handlers handed to C++: they must outlive any call to them


def on_terminate(fn):
    """Run ``fn()`` (its errors ignored) when this process ends in ``std::terminate``; returns a function that
    restores the handler before (a no-op where none could be installed)."""
    try:
        set_terminate = getattr(ctypes.CDLL("libstdc++.so.6"), _SET_TERMINATE)
    except (OSError, AttributeError):
        return lambda: None
    set_terminate.restype, set_terminate.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    ran, previous = [], []

    def handler():
        if not ran:
            ran.append(True)
            try:
                fn()
            except BaseException:
                pass
        if previous[0]:
            _HANDLER(previous[0])()  # libstdc++'s: prints the exception, aborts (the GIL is released meanwhile)
        os.abort()

    callback = _HANDLER(handler)
    _KEEP.append(callback)
    previous.append(set_terminate(ctypes.cast(callback, ctypes.c_void_p).value))
    return lambda: set_terminate(previous[0])
