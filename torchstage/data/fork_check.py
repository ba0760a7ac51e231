"""A warning, before training, for DataLoader workers that a CPython with a known fork deadlock would start.

CPython before 3.9.20, 3.10.15 and 3.11.10 can deadlock a child forked while another thread creates or
deletes a Python thread state (CPython gh-112275: the child waits forever in ``PyOS_AfterFork_Child`` on a
lock the parent held). Under torch.distributed, C++ threads (most likely gloo's, as they release tensors)
take the GIL and so create thread states, and a DataLoader that forks its workers at each epoch hangs now
and then: about 1 run in 7-20 of a 2-process, 40-epoch loop on a 2-core machine, a hand-written DDP loop as
often as torchstage. The rank then waits for a batch that never comes, until the hang watchdog ends the job.
"""
import logging
import multiprocessing
import os
import sys

from torch.utils.data import DataLoader

from torchstage.distributed.engine import Engine

logger = logging.getLogger("torchstage")

#: The first release of each affected CPython line that has the fix; lines not listed (3.12+) never had it.
FIXED_IN = {(3, 8): 20, (3, 9): 20, (3, 10): 15, (3, 11): 10}


def fork_deadlock_risk(version=None) -> bool:
    """Whether this CPython (or ``version``, a ``sys.version_info``-like tuple) has the fork deadlock."""
    version = tuple(version or sys.version_info)
    fixed = FIXED_IN.get(version[:2])
    return fixed is not None and version[2] < fixed


def forks_workers(loader) -> bool:
    """A DataLoader whose ``num_workers > 0`` workers are started by ``fork``."""
    if not isinstance(loader, DataLoader) or loader.num_workers == 0:
        return False
    context = loader.multiprocessing_context
    if context is None:  # the default, read without fixing it (the user may still set another one)
        method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    else:
        method = context if isinstance(context, str) else context.get_start_method()
    return method == "fork"


def forks_workers_each_epoch(loader) -> bool:
    """A DataLoader whose workers are started by ``fork`` at every pass (not kept between passes)."""
    return forks_workers(loader) and not loader.persistent_workers


#: ``0`` keeps a rebuilt loader forking its workers at each epoch on an affected CPython (see :func:`keeps_workers`).
KEEP_WORKERS_ENV = "TORCHSTAGE_PERSISTENT_WORKERS"


def keeps_workers(loader, version=None, environ=None) -> bool:
    """Whether torchstage keeps the workers of ``loader``, which it rebuilds to shard it, for the whole run
    (``persistent_workers=True``): on an affected CPython, for a loader that would fork them at every epoch, unless
    :data:`KEEP_WORKERS_ENV` is ``0``. Workers forked once per run meet the deadlock once instead of every epoch;
    they keep their copy of the dataset between epochs, as any persistent worker does."""
    environ = os.environ if environ is None else environ
    return environ.get(KEEP_WORKERS_ENV, "1") != "0" and fork_deadlock_risk(version) and \
        forks_workers_each_epoch(loader)


def warn_forked_workers(loaders: dict, engine: Engine, version=None) -> bool:
    """Warn (main rank) when a distributed run on an affected CPython forks loader workers at each epoch;
    returns whether it warned."""
    if not engine.is_distributed or not fork_deadlock_risk(version):
        return False
    names = [name for name, loader in loaders.items() if forks_workers_each_epoch(loader)]
    if not names:
        return False
    if engine.is_main:
        found = ".".join(map(str, tuple(version or sys.version_info)[:3]))
        logger.warning(
            "Python %s can hang a DataLoader worker forked beside torch.distributed's threads (CPython "
            "gh-112275, fixed in 3.9.20, 3.10.15, 3.11.10 and 3.12), and loader(s) %s fork num_workers>0 workers "
            "at every epoch. Upgrade Python, or pass persistent_workers=True (one fork per run) or "
            "multiprocessing_context='forkserver' to the DataLoader; the hang watchdog (hang_timeout) ends a "
            "run that hangs", found, names)
    return True
