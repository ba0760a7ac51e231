"""torchstage: a callback-driven runner for PyTorch, from one process to a SLURM cluster.

The edge of the package: the public names, where Catalyst 20.12 and 22 spellings work too (``import torchstage as
dl``, ``from torchstage import dl``): the runners, callbacks and enums exported here are the Catalyst-capable
classes of :mod:`torchstage.catalyst`, which stand for the core classes of the same names (``isinstance`` holds).
"""
import importlib
import sys

from torchstage.launch.script_seed import seed_launched_rank

# A rank that torchrun, srun or mpirun started draws its module-level data alike on every rank (see the module)
seed_launched_rank()

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
from torchstage.callbacks.training.loop import LoopCallback
from torchstage.callbacks.training.loss_spike import LossSpike
from torchstage.callbacks.training.nonfinite import (LossSpikeError, NonFiniteLossCallback, NonFiniteLossError,
                                                     NonFiniteStateError)
from torchstage.callbacks.training.output_losses import Loss, OutputLossesCallback, Regularizer
from torchstage.runner.rollback import RollbackCallback
from torchstage.callbacks.training.scheduler import SchedulerCallback
from torchstage.callbacks.training.swa import SWACallback
from torchstage.callbacks.training.weight_averaging import EMACallback, WeightAveragingCallback
from torchstage.catalyst import names as _catalyst_names
from torchstage.catalyst import engines as _catalyst_engines
from torchstage.catalyst.callbacks import (Callback, CheckpointCallback, CheckRunCallback, CriterionCallback,
                                           EarlyStoppingCallback, MetricAggregationCallback, OptimizerCallback,
                                           OptunaPruningCallback)
from torchstage.catalyst.enums import CallbackOrder, CallbackScope
from torchstage.catalyst.meters import AdditiveMetric as _AdditiveMetric
from torchstage.catalyst.metric_callbacks import (AccuracyCallback, FunctionalMetricCallback, MetricCallback,
                                                  MultiLabelAccuracyCallback)
from torchstage.catalyst.renamed import RenamedMetric as _RenamedMetric
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
from torchstage.strategies.model_parallel import ModelParallel, Pipeline
from torchstage.strategies.single import SingleDevice
from torchstage.version import __version__
from torchstage import metrics

# Catalyst's names under ``from torchstage import metrics`` (``metrics.AdditiveMetric``), set here at the edge so
# that the core metrics package knows nothing of them
metrics.AdditiveMetric = metrics.AdditiveValueMetric = _AdditiveMetric
metrics.RenamedMetric = _RenamedMetric


def _catalyst22_attribute(name: str):
    """The object Catalyst 22's ``dl.<name>`` means; AttributeError (with the reason) for a refused one, KeyError
    for a name that is not Catalyst 22's."""
    if name in ("CPUEngine", "GPUEngine"):
        return getattr(_catalyst_engines, name)
    if name in _catalyst_engines.DISTRIBUTED:
        _catalyst_engines.refused_engine(name)
    if name == "IRunner":
        from torchstage.catalyst.irunner import IRunner  # Catalyst 22's runner API: loaded when asked for
        return IRunner
    if name == "IRunnerError":
        _catalyst_names.note_alias("dl.IRunnerError", "torchstage.RunnerException (a ValueError raised before "
                                   "training)", version="22")
        return RunnerException
    raise KeyError(name)


def __getattr__(name):
    """Catalyst 20.12 names (``dl.CallbackNode``, ``utils.set_global_seed``...): torchstage's object, noted once;
    Catalyst 22 names (``dl.PrecisionRecallF1SupportCallback``, ``utils.trace_model``...) from the compat layer;
    ``dl`` and ``utils`` are this module (``from torchstage import dl, utils, metrics``, as from catalyst)."""
    if name in ("dl", "utils"):
        return sys.modules[__name__]
    if name in _catalyst_names.CATALYST22_NAMES:
        return getattr(importlib.import_module(_catalyst_names.CATALYST22_NAMES[name]), name)
    if name in _catalyst_names.MODULE_ALIASES:
        _catalyst_names.note_alias(f"torchstage.{name}", f"torchstage.{_catalyst_names.MODULE_ALIASES[name]}")
        return globals()[_catalyst_names.MODULE_ALIASES[name]]
    try:
        return _catalyst22_attribute(name)  # dl.CPUEngine, dl.IRunner... (Catalyst 22)
    except KeyError:
        pass
    raise AttributeError(f"module 'torchstage' has no attribute {name!r}")

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
    "HSDP", "ModelParallel", "Pipeline",
    "StragglerDetector", "PreflightFailed",
]
