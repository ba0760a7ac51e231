"""The processes and strategy part of ``train()``'s arguments: how many processes train, how they are started and
watched (``distributed``, ``nprocs``, ``max_restarts``, ``hang_timeout``), the strategy that trains the model across
them, and the engine of a one-process run."""
from torchstage.launch.restarts import check_max_restarts
from torchstage.distributed.engine import Engine
from torchstage.strategies.resolve import resolve_strategy


def check_processes(spec, runner) -> None:
    """``distributed`` one of None/True/False, the strategy made an object, ``max_restarts`` a count, ``preflight`` a
    bool, ``engine`` an Engine. ``nprocs`` is checked where the world forms (``resolve_world``), ``hang_timeout`` by
    the default chain's HangWatchdog; that ``engine`` is for one process only where the world is known
    (``runner/setup.py``)."""
    if spec.distributed not in (None, True, False):
        raise TypeError(f"distributed must be None (join a torchrun/SLURM world if started in one), True "
                        f"(also launch one process per device) or False (one process), got {spec.distributed!r}")
    spec.strategy = resolve_strategy(spec.strategy)
    spec.max_restarts = check_max_restarts(spec.max_restarts)
    if not isinstance(spec.preflight, bool):
        raise TypeError(f"preflight must be True (check every rank's matmul, memory and link speed before the "
                        f"first epoch, and stop if one is slow) or False, got {spec.preflight!r}")
    if spec.engine is not None and not isinstance(spec.engine, Engine):
        raise TypeError(f"engine must be a torchstage Engine (such as Engine(device='cpu'), or Catalyst 22's "
                        f"dl.CPUEngine()), got {type(spec.engine).__name__}")
