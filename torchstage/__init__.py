"""torchstage: a callback-driven runner for PyTorch, from one process to a SLURM cluster.

The edge of the package: the public names, where Catalyst 20.12 and 22 spellings work too (``import torchstage as
dl``, ``from torchstage import dl``): the runners, callbacks and enums exported here are the Catalyst-capable
classes of :mod:`torchstage.catalyst`, which stand for the core classes of the same names (``isinstance`` holds).

``import torchstage`` loads no more than it needs: each public name is imported from its module on first use
(PEP 562), so a script pays for the runner, the loggers or the Catalyst layer only when it names them, and
``torchstage.metrics`` is the only subpackage loaded at once. Static tools (pyright, ``help()``, IDEs) see every name
through the ``TYPE_CHECKING`` imports below, which :data:`_PUBLIC` mirrors.
"""
import importlib
import sys
from typing import TYPE_CHECKING

from torchstage import metrics
from torchstage.launch.script_seed import seed_launched_rank
from torchstage.version import __version__

# A rank that torchrun, srun or mpirun started draws its module-level data alike on every rank (see the module)
seed_launched_rank()

if TYPE_CHECKING:  # what static tools see; at run time each name is imported on first use (__getattr__)
    from torchstage.callbacks.base import CancelBatch, CancelEpoch, CancelLoader, CancelRun, CancelStage
    from torchstage.callbacks.control.debug import BatchOverfitCallback, LimitBatchesCallback
    from torchstage.callbacks.control.validation import ValidEveryCallback
    from torchstage.callbacks.loggers.console import ConsoleLogger
    from torchstage.callbacks.loggers.csv_logger import CSVLogger
    from torchstage.callbacks.loggers.logger_base import LoggerCallback
    from torchstage.callbacks.loggers.mlflow_logger import MLflowLogger
    from torchstage.callbacks.loggers.progress import ProgressBar
    from torchstage.callbacks.loggers.tensorboard import TensorBoardLogger
    from torchstage.callbacks.metrics.averaging import MetricsAveragingCallback
    from torchstage.callbacks.metrics.batch_transform import BatchTransformCallback
    from torchstage.callbacks.metrics.metric import AUCCallback, PrecisionRecallF1Callback
    from torchstage.callbacks.metrics.torchmetrics_callback import TorchMetricsCallback
    from torchstage.callbacks.monitoring.monitor import ThroughputMonitor
    from torchstage.callbacks.monitoring.profiler import ProfilerCallback
    from torchstage.callbacks.monitoring.stragglers import StragglerDetector
    from torchstage.callbacks.monitoring.timer import TimerCallback
    from torchstage.callbacks.safety.even_batches import EvenBatchesCallback, UnevenBatchesError
    from torchstage.callbacks.safety.requeue import RequeueCallback
    from torchstage.callbacks.safety.stop import StopCallback
    from torchstage.callbacks.safety.watchdog import HangWatchdog
    from torchstage.callbacks.training.backward import BackwardCallback
    from torchstage.callbacks.training.causal_lm_loss import CausalLMLoss
    from torchstage.callbacks.training.loop import LoopCallback
    from torchstage.callbacks.training.loss_spike import LossSpike
    from torchstage.callbacks.training.nonfinite import (LossSpikeError, NonFiniteLossCallback, NonFiniteLossError,
                                                         NonFiniteStateError)
    from torchstage.callbacks.training.output_losses import Loss, OutputLossesCallback, Regularizer
    from torchstage.runner.rollback import RollbackCallback
    from torchstage.callbacks.training.scheduler import SchedulerCallback
    from torchstage.callbacks.training.swa import SWACallback
    from torchstage.callbacks.training.weight_averaging import EMACallback, WeightAveragingCallback
    from torchstage.catalyst.callbacks import (Callback, CheckpointCallback, CheckRunCallback, CriterionCallback,
                                               EarlyStoppingCallback, MetricAggregationCallback, OptimizerCallback,
                                               OptunaPruningCallback)
    from torchstage.catalyst.enums import CallbackOrder, CallbackScope
    from torchstage.catalyst.metric_callbacks import (AccuracyCallback, FunctionalMetricCallback, MetricCallback,
                                                      MultiLabelAccuracyCallback)
    from torchstage.catalyst.runners import Runner, SupervisedRunner
    from torchstage.config.instantiate import ConfigError
    from torchstage.config.train_call import train_from_config
    from torchstage.config.tuning import tune
    from torchstage.config.yaml_files import load_config
    from torchstage.files.checkpoint_read import load_checkpoint, load_model_weights
    from torchstage.files.checkpoint_format import CheckpointError
    from torchstage.files.lock import LogdirLocked
    from torchstage.launch.enter import distributed_cmd_run
    from torchstage.launch.preflight.check import PreflightFailed
    from torchstage.periods import Batch, Epoch
    from torchstage.rng import set_seed
    from torchstage.distributed.engine import Engine
    from torchstage.runner.errors import RunnerException
    from torchstage.stop_request import RunStopped, StopRequest, request_stop
    from torchstage.strategies.base import Strategy
    from torchstage.strategies.ddp import DDP
    from torchstage.strategies.deepspeed import DeepSpeed
    from torchstage.strategies.fsdp import FSDP
    from torchstage.strategies.hsdp import HSDP
    from torchstage.strategies.memory_plan import plan_memory
    from torchstage.strategies.model_parallel import ModelParallel, Pipeline
    from torchstage.strategies.single import SingleDevice

#: Module -> the public names it defines, imported on first use; the TYPE_CHECKING imports above say the same.
_PUBLIC = {
    "torchstage.callbacks.base": ("CancelBatch", "CancelEpoch", "CancelLoader", "CancelRun", "CancelStage",),
    "torchstage.callbacks.control.debug": ("BatchOverfitCallback", "LimitBatchesCallback",),
    "torchstage.callbacks.control.validation": ("ValidEveryCallback",),
    "torchstage.callbacks.loggers.console": ("ConsoleLogger",),
    "torchstage.callbacks.loggers.csv_logger": ("CSVLogger",),
    "torchstage.callbacks.loggers.logger_base": ("LoggerCallback",),
    "torchstage.callbacks.loggers.mlflow_logger": ("MLflowLogger",),
    "torchstage.callbacks.loggers.progress": ("ProgressBar",),
    "torchstage.callbacks.loggers.tensorboard": ("TensorBoardLogger",),
    "torchstage.callbacks.metrics.averaging": ("MetricsAveragingCallback",),
    "torchstage.callbacks.metrics.batch_transform": ("BatchTransformCallback",),
    "torchstage.callbacks.metrics.metric": ("AUCCallback", "PrecisionRecallF1Callback",),
    "torchstage.callbacks.metrics.torchmetrics_callback": ("TorchMetricsCallback",),
    "torchstage.callbacks.monitoring.monitor": ("ThroughputMonitor",),
    "torchstage.callbacks.monitoring.profiler": ("ProfilerCallback",),
    "torchstage.callbacks.monitoring.stragglers": ("StragglerDetector",),
    "torchstage.callbacks.monitoring.timer": ("TimerCallback",),
    "torchstage.callbacks.safety.even_batches": ("EvenBatchesCallback", "UnevenBatchesError",),
    "torchstage.callbacks.safety.requeue": ("RequeueCallback",),
    "torchstage.callbacks.safety.stop": ("StopCallback",),
    "torchstage.callbacks.safety.watchdog": ("HangWatchdog",),
    "torchstage.callbacks.training.backward": ("BackwardCallback",),
    "torchstage.callbacks.training.causal_lm_loss": ("CausalLMLoss",),
    "torchstage.callbacks.training.loop": ("LoopCallback",),
    "torchstage.callbacks.training.loss_spike": ("LossSpike",),
    "torchstage.callbacks.training.nonfinite": (
        "LossSpikeError", "NonFiniteLossCallback", "NonFiniteLossError", "NonFiniteStateError",
    ),
    "torchstage.callbacks.training.output_losses": ("Loss", "OutputLossesCallback", "Regularizer",),
    "torchstage.callbacks.training.scheduler": ("SchedulerCallback",),
    "torchstage.callbacks.training.swa": ("SWACallback",),
    "torchstage.callbacks.training.weight_averaging": ("EMACallback", "WeightAveragingCallback",),
    "torchstage.catalyst.callbacks": (
        "Callback", "CheckpointCallback", "CheckRunCallback", "CriterionCallback", "EarlyStoppingCallback",
        "MetricAggregationCallback", "OptimizerCallback", "OptunaPruningCallback",
    ),
    "torchstage.catalyst.enums": ("CallbackOrder", "CallbackScope",),
    "torchstage.catalyst.metric_callbacks": (
        "AccuracyCallback", "FunctionalMetricCallback", "MetricCallback", "MultiLabelAccuracyCallback",
    ),
    "torchstage.catalyst.runners": ("Runner", "SupervisedRunner",),
    "torchstage.config.instantiate": ("ConfigError",),
    "torchstage.config.train_call": ("train_from_config",),
    "torchstage.config.tuning": ("tune",),
    "torchstage.config.yaml_files": ("load_config",),
    "torchstage.distributed.engine": ("Engine",),
    "torchstage.files.checkpoint_format": ("CheckpointError",),
    "torchstage.files.checkpoint_read": ("load_checkpoint", "load_model_weights",),
    "torchstage.files.lock": ("LogdirLocked",),
    "torchstage.launch.enter": ("distributed_cmd_run",),
    "torchstage.launch.preflight.check": ("PreflightFailed",),
    "torchstage.periods": ("Batch", "Epoch",),
    "torchstage.rng": ("set_seed",),
    "torchstage.runner.errors": ("RunnerException",),
    "torchstage.runner.rollback": ("RollbackCallback",),
    "torchstage.stop_request": ("RunStopped", "StopRequest", "request_stop",),
    "torchstage.strategies.base": ("Strategy",),
    "torchstage.strategies.ddp": ("DDP",),
    "torchstage.strategies.deepspeed": ("DeepSpeed",),
    "torchstage.strategies.fsdp": ("FSDP",),
    "torchstage.strategies.hsdp": ("HSDP",),
    "torchstage.strategies.memory_plan": ("plan_memory",),
    "torchstage.strategies.model_parallel": ("ModelParallel", "Pipeline",),
    "torchstage.strategies.single": ("SingleDevice",),
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}


def _catalyst_metric(name: str):
    """Catalyst's names under ``from torchstage import metrics`` (``metrics.AdditiveMetric``), added here at the edge
    so that the core metrics package knows nothing of them."""
    if name in ("AdditiveMetric", "AdditiveValueMetric"):
        from torchstage.catalyst.meters import AdditiveMetric
        return AdditiveMetric
    if name == "RenamedMetric":
        from torchstage.catalyst.renamed import RenamedMetric
        return RenamedMetric
    raise AttributeError(f"module 'torchstage.metrics' has no attribute {name!r}")


metrics.__getattr__ = _catalyst_metric


def _catalyst22_attribute(name: str):
    """The object Catalyst 22's ``dl.<name>`` means; AttributeError (with the reason) for a refused one, KeyError
    for a name that is not Catalyst 22's."""
    from torchstage.catalyst import engines as _catalyst_engines
    if name in ("CPUEngine", "GPUEngine"):
        return getattr(_catalyst_engines, name)
    if name in _catalyst_engines.DISTRIBUTED:
        _catalyst_engines.refused_engine(name)
    if name == "IRunner":
        from torchstage.catalyst.irunner import IRunner  # Catalyst 22's runner API: loaded when asked for
        return IRunner
    if name == "IRunnerError":
        from torchstage.catalyst import names as _catalyst_names
        _catalyst_names.note_alias("dl.IRunnerError", "torchstage.RunnerException (a ValueError raised before "
                                   "training)", version="22")
        return __getattr__("RunnerException")
    raise KeyError(name)


def __getattr__(name):
    """A public name, imported from its module on first use and kept here; Catalyst 20.12 names
    (``dl.CallbackNode``, ``utils.set_global_seed``...): torchstage's object, noted once; Catalyst 22 names
    (``dl.PrecisionRecallF1SupportCallback``, ``utils.trace_model``...) from the compat layer; ``dl`` and ``utils``
    are this module (``from torchstage import dl, utils, metrics``, as from catalyst)."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
        globals()[name] = value
        return value
    if name in ("dl", "utils"):
        return sys.modules[__name__]
    if name.startswith("__"):
        raise AttributeError(f"module 'torchstage' has no attribute {name!r}")
    from torchstage.catalyst import names as _catalyst_names
    if name in _catalyst_names.CATALYST22_NAMES:
        return getattr(importlib.import_module(_catalyst_names.CATALYST22_NAMES[name]), name)
    if name in _catalyst_names.MODULE_ALIASES:
        _catalyst_names.note_alias(f"torchstage.{name}", f"torchstage.{_catalyst_names.MODULE_ALIASES[name]}")
        return __getattr__(_catalyst_names.MODULE_ALIASES[name])
    try:
        return _catalyst22_attribute(name)  # dl.CPUEngine, dl.IRunner... (Catalyst 22)
    except KeyError:
        pass
    raise AttributeError(f"module 'torchstage' has no attribute {name!r}")


def __dir__():
    """Every public name, loaded or not (for ``help()``, ``dir()`` and completion)."""
    return sorted({*globals(), *_MODULE_OF})


__all__ = [
    "AccuracyCallback", "AUCCallback", "FunctionalMetricCallback", "MetricCallback", "PrecisionRecallF1Callback",
    "Callback", "CallbackOrder", "CallbackScope", "CancelBatch", "CancelEpoch", "CancelLoader", "CancelRun",
    "CancelStage", "CheckpointCallback", "CheckpointError", "ConsoleLogger", "CriterionCallback", "CSVLogger",
    "CheckRunCallback", "EarlyStoppingCallback", "LimitBatchesCallback", "Loss", "OutputLossesCallback",
    "Regularizer", "TimerCallback", "ValidEveryCallback",
    "DDP", "DeepSpeed", "Engine", "FSDP", "LoopCallback", "MetricsAveragingCallback", "OptimizerCallback", "ProgressBar", "Runner",
    "SchedulerCallback", "SupervisedRunner", "TensorBoardLogger", "distributed_cmd_run", "load_checkpoint",
    "load_model_weights", "set_seed", "Batch", "Epoch", "RunStopped", "StopCallback", "StopRequest", "request_stop",
    "SingleDevice", "Strategy", "ConfigError", "load_config", "train_from_config", "RequeueCallback",
    "BatchOverfitCallback", "MetricAggregationCallback", "MultiLabelAccuracyCallback", "RunnerException",
    "LoggerCallback", "MLflowLogger", "ProfilerCallback", "ThroughputMonitor",
    "TorchMetricsCallback", "EMACallback", "SWACallback", "WeightAveragingCallback", "OptunaPruningCallback", "tune",
    "LogdirLocked", "NonFiniteLossCallback", "NonFiniteLossError", "NonFiniteStateError", "LossSpike", "LossSpikeError",
    "RollbackCallback",
    "HangWatchdog", "EvenBatchesCallback", "UnevenBatchesError", "BatchTransformCallback", "BackwardCallback",
    "HSDP", "ModelParallel", "Pipeline", "plan_memory", "CausalLMLoss",
    "StragglerDetector", "PreflightFailed",
]
