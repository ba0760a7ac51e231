"""Catalyst 22's engine objects (``dl.CPUEngine()``, ``dl.GPUEngine()``) as torchstage Engines, each noted once;
its distributed engines are refused with torchstage's spelling (``train(distributed=True)``)."""
from collections.abc import Mapping

from torchstage.logging_setup import note_alias
from torchstage.runner.engine import Engine

DISTRIBUTED = ("DataParallelEngine", "DistributedDataParallelEngine", "DistributedXLAEngine", "XLAEngine")


def CPUEngine(*args, **kwargs) -> Engine:
    """Catalyst 22's ``CPUEngine()``: ``Engine(device="cpu")``. Its Accelerate arguments have no meaning here."""
    _no_arguments("CPUEngine", args, kwargs)
    note_alias("dl.CPUEngine()", "Engine(device='cpu'), or no engine on a machine without GPUs", version="22")
    return Engine(device="cpu")


def GPUEngine(*args, **kwargs) -> Engine:
    """Catalyst 22's ``GPUEngine()``: ``Engine(device="cuda")``."""
    _no_arguments("GPUEngine", args, kwargs)
    note_alias("dl.GPUEngine()", "Engine(device='cuda'), or no engine on a machine with a GPU", version="22")
    return Engine(device="cuda")


def refused_engine(name: str):
    """Catalyst 22's distributed engines: AttributeError naming torchstage's spelling."""
    raise AttributeError(f"dl.{name} is Catalyst 22's; torchstage runs several processes with "
                         f"train(distributed=True) (DDP, one process per device; see docs/distributed.md) and "
                         f"takes no engine object for it")


def _no_arguments(owner: str, args, kwargs) -> None:
    if args or kwargs:
        raise TypeError(f"dl.{owner}() takes no arguments here (Catalyst 22's were Accelerate settings); for mixed "
                        f"precision pass train(amp='bf16'/'fp16'), got {args or ''}{kwargs or ''}")


def check_engine_and_loggers(engine, loggers, distributed=None) -> None:
    """``train(engine=...)`` must be an Engine of a one-process run and ``train(loggers=...)`` a dict (checked
    again per logger)."""
    if engine is not None:
        if not isinstance(engine, Engine):
            raise TypeError(f"engine must be a torchstage Engine (such as dl.CPUEngine() or Engine(device='cpu')), "
                            f"got {type(engine).__name__}")
        if distributed:
            raise ValueError("engine=... sets the device of a one-process run; with distributed=True each process "
                             "takes its device from its rank: drop engine=...")
        note_alias("train(engine=...)", "Runner(engine=...) or train(strategy=...)", version="22")
    if loggers is not None:
        if not isinstance(loggers, Mapping):
            raise TypeError(f"loggers must be a dict name -> logger callback, got {type(loggers).__name__}")
        note_alias("train(loggers={...})", "train(callbacks={...}) with logger callbacks", version="22")
