"""The processes and strategy part of ``train()``'s arguments: how many processes train, how they are started and
watched (``distributed``, ``nprocs``, ``max_restarts``, ``hang_timeout``), the strategy that trains the model across
them, and the engine of a one-process run."""
from dataclasses import dataclass
from typing import Any, Optional

from torchstage.launch.restarts import check_max_restarts
from torchstage.distributed.engine import Engine
from torchstage.strategies.resolve import resolve_strategy


@dataclass
class ProcessesAndStrategy:
    """Processes, strategy and device, and the pre-flight check. ``nprocs`` is checked where the world forms
    (``resolve_world``),
    ``hang_timeout`` by the default chain's HangWatchdog; that ``engine`` is for one process only where the world is
    known (``runner/setup.py``)."""

    distributed: Optional[bool] = None
    nprocs: Optional[int] = None
    strategy: Any = "ddp"  # a name or a strategy object; a strategy object once checked
    engine: Any = None  # an Engine (Catalyst 22's train(engine=dl.CPUEngine())); None: the runner's or the default
    prefetch: bool = False
    hang_timeout: Optional[float] = 300
    max_restarts: Optional[int] = None  # None: $TORCHSTAGE_MAX_RESTARTS, else 0
    preflight: bool = False  # the pre-flight check of every rank before the first epoch (several processes)

    def validate(self, runner) -> None:
        """``distributed`` one of None/True/False, the strategy made an object, ``max_restarts`` a count, ``engine``
        an Engine."""
        if self.distributed not in (None, True, False):
            raise TypeError(f"distributed must be None (join a torchrun/SLURM world if started in one), True "
                            f"(also launch one process per device) or False (one process), got {self.distributed!r}")
        self.strategy = resolve_strategy(self.strategy)
        self.max_restarts = check_max_restarts(self.max_restarts)
        if not isinstance(self.preflight, bool):
            raise TypeError(f"preflight must be True (check every rank's matmul, memory and link speed before the "
                            f"first epoch, and stop if one is slow) or False, got {self.preflight!r}")
        if self.engine is not None and not isinstance(self.engine, Engine):
            raise TypeError(f"engine must be a torchstage Engine (such as Engine(device='cpu'), or Catalyst 22's "
                            f"dl.CPUEngine()), got {type(self.engine).__name__}")
