"""Catalyst 22's engine objects (``dl.CPUEngine()``, ``dl.GPUEngine()``) as torchstage Engines, each noted once;
its distributed engines are refused with torchstage's spelling (``train(distributed=True)``)."""
from torchstage.logging_setup import note_alias
from torchstage.distributed.engine import Engine

DISTRIBUTED = ("DataParallelEngine", "DistributedDataParallelEngine", "DistributedXLAEngine", "XLAEngine")


class _EngineKind(type):
    """Catalyst 22's engine classes: calling one gives torchstage's Engine on its device (noted once), and
    ``isinstance(engine, dl.CPUEngine)`` asks whether an Engine trains on that kind of device."""

    def __call__(cls, *args, **kwargs) -> Engine:
        _no_arguments(cls.__name__, args, kwargs)
        note_alias(f"dl.{cls.__name__}()", cls.preferred, version="22")
        return Engine(device=cls.device_type)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Engine) and obj.device.type == cls.device_type


class CPUEngine(metaclass=_EngineKind):
    """Catalyst 22's ``CPUEngine()``: ``Engine(device="cpu")``. Its Accelerate arguments have no meaning here."""

    device_type, preferred = "cpu", "Engine(device='cpu'), or no engine on a machine without GPUs"


class GPUEngine(metaclass=_EngineKind):
    """Catalyst 22's ``GPUEngine()``: ``Engine(device="cuda")``."""

    device_type, preferred = "cuda", "Engine(device='cuda'), or no engine on a machine with a GPU"


def refused_engine(name: str):
    """Catalyst 22's distributed engines: AttributeError naming torchstage's spelling."""
    raise AttributeError(f"dl.{name} is Catalyst 22's; torchstage runs several processes with "
                         f"train(distributed=True) (DDP, one process per device; see docs/distributed.md) and "
                         f"takes no engine object for it")


def _no_arguments(owner: str, args, kwargs) -> None:
    if args or kwargs:
        raise TypeError(f"dl.{owner}() takes no arguments here (Catalyst 22's were Accelerate settings); for mixed "
                        f"precision pass train(amp='bf16'/'fp16'), got {args or ''}{kwargs or ''}")
