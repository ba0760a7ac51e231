"""torchstage: a callback-driven runner for PyTorch, from one process to a SLURM cluster."""
__version__ = "0.1.0"

from torchstage import aliases
from torchstage.callbacks.aggregation import MetricAggregationCallback
from torchstage.callbacks.averaging import MetricsAveragingCallback
from torchstage.callbacks.base import (Callback, CallbackOrder, CallbackScope, CancelBatch, CancelEpoch,
                                       CancelLoader, CancelRun, CancelStage)
from torchstage.callbacks.checkpoint_saver import CheckpointCallback
from torchstage.callbacks.console import ConsoleLogger
from torchstage.callbacks.criterion import CriterionCallback
from torchstage.callbacks.csv_logger import CSVLogger
from torchstage.callbacks.debug import BatchOverfitCallback, CheckRunCallback, LimitBatchesCallback
from torchstage.callbacks.early_stopping import EarlyStoppingCallback
from torchstage.callbacks.logger_base import LoggerCallback
from torchstage.callbacks.even_batches import EvenBatchesCallback, UnevenBatchesError
from torchstage.callbacks.loop import LoopCallback
from torchstage.callbacks.mlflow_logger import MLflowLogger
from torchstage.callbacks.monitor import ThroughputMonitor
from torchstage.callbacks.nonfinite import NonFiniteLossCallback, NonFiniteLossError
from torchstage.callbacks.metric import (AccuracyCallback, AUCCallback, FunctionalMetricCallback, MetricCallback,
                                         MultiLabelAccuracyCallback, PrecisionRecallF1Callback)
from torchstage.callbacks.optimizer import OptimizerCallback
from torchstage.callbacks.optuna_pruning import OptunaPruningCallback
from torchstage.callbacks.output_losses import Loss, OutputLossesCallback, Regularizer
from torchstage.callbacks.profiler import ProfilerCallback
from torchstage.callbacks.progress import ProgressBar
from torchstage.callbacks.requeue import RequeueCallback
from torchstage.callbacks.scheduler import SchedulerCallback
from torchstage.callbacks.stop import StopCallback
from torchstage.callbacks.swa import SWACallback
from torchstage.callbacks.tensorboard import TensorBoardLogger
from torchstage.callbacks.timer import TimerCallback
from torchstage.callbacks.torchmetrics_callback import TorchMetricsCallback
from torchstage.callbacks.validation import ValidEveryCallback
from torchstage.callbacks.weight_averaging import EMACallback, WeightAveragingCallback
from torchstage.callbacks.watchdog import HangWatchdog
from torchstage.checkpoint import CheckpointError, load_checkpoint, load_model_weights
from torchstage.instantiate import ConfigError
from torchstage.config.train_call import train_from_config
from torchstage.config.yaml_files import load_config
from torchstage.distributed.engine import Engine
from torchstage.distributed.strategies.ddp import DDP
from torchstage.distributed.strategies.fsdp import FSDP
from torchstage.distributed.strategies.single import SingleDevice
from torchstage.periods import Batch, Epoch
from torchstage.distributed.world import distributed_cmd_run
from torchstage.logdir_lock import LogdirLocked
from torchstage.rng import set_seed
from torchstage.runner.errors import RunnerException
from torchstage.runner.runner import Runner
from torchstage.runner.spec import train_signature
from torchstage.runner.supervised import SupervisedRunner
from torchstage.stop_request import RunStopped, StopRequest, request_stop
from torchstage.tuning import tune

Runner.train.__signature__ = train_signature()
del train_signature


def __getattr__(name):
    """Catalyst 20.12 names (``dl.CallbackNode``, ``utils.set_global_seed``...): torchstage's object, noted once."""
    if name in aliases.MODULE_ALIASES:
        aliases.note_alias(f"torchstage.{name}", f"torchstage.{aliases.MODULE_ALIASES[name]}")
        return globals()[aliases.MODULE_ALIASES[name]]
    raise AttributeError(f"module 'torchstage' has no attribute {name!r}")

__all__ = [
    "AccuracyCallback", "AUCCallback", "FunctionalMetricCallback", "MetricCallback", "PrecisionRecallF1Callback",
    "Callback", "CallbackOrder", "CallbackScope", "CancelBatch", "CancelEpoch", "CancelLoader", "CancelRun",
    "CancelStage", "CheckpointCallback", "CheckpointError", "ConsoleLogger", "CriterionCallback", "CSVLogger",
    "CheckRunCallback", "EarlyStoppingCallback", "LimitBatchesCallback", "Loss", "OutputLossesCallback",
    "Regularizer", "TimerCallback", "ValidEveryCallback",
    "DDP", "Engine", "FSDP", "LoopCallback", "MetricsAveragingCallback", "OptimizerCallback", "ProgressBar", "Runner",
    "SchedulerCallback", "SupervisedRunner", "TensorBoardLogger", "distributed_cmd_run", "load_checkpoint",
    "load_model_weights", "set_seed", "Batch", "Epoch", "RunStopped", "StopCallback", "StopRequest", "request_stop",
    "SingleDevice", "ConfigError", "load_config", "train_from_config", "RequeueCallback",
    "BatchOverfitCallback", "MetricAggregationCallback", "MultiLabelAccuracyCallback", "RunnerException",
    "LoggerCallback", "MLflowLogger", "ProfilerCallback", "ThroughputMonitor",
    "TorchMetricsCallback", "EMACallback", "SWACallback", "WeightAveragingCallback", "OptunaPruningCallback", "tune",
    "LogdirLocked", "NonFiniteLossCallback", "NonFiniteLossError",
    "HangWatchdog", "EvenBatchesCallback", "UnevenBatchesError",
]
