"""The default callback chain of a run, by name, so a user callback of the same name replaces one."""
from torchstage.callbacks.averaging import MetricsAveragingCallback
from torchstage.callbacks.checkpoint import CheckpointCallback
from torchstage.callbacks.console import ConsoleLogger
from torchstage.callbacks.csv_logger import CSVLogger
from torchstage.callbacks.loop import LoopCallback
from torchstage.callbacks.progress import ProgressBar
from torchstage.callbacks.scheduler import SchedulerCallback
from torchstage.callbacks.tensorboard import TensorBoardLogger


def default_callbacks(runner, spec) -> dict:
    """Bookkeeping, metric averaging, scheduler (if any), checkpoints and logs (with a logdir), progress."""
    chain = {"loop": LoopCallback(), "averaging": MetricsAveragingCallback()}
    if any(stage.scheduler is not None for stage in spec.stage_specs):
        chain["scheduler"] = SchedulerCallback(mode=spec.scheduler_step)
    if spec.logdir is not None:
        chain.update(checkpoint=CheckpointCallback(), csv=CSVLogger(), tensorboard=TensorBoardLogger())
    from torchstage.runner.features import feature_callbacks
    chain.update(feature_callbacks(spec))  # valid_every, check, overfit, timeit
    chain["console"] = ConsoleLogger()
    if spec.verbose:
        chain["progress"] = ProgressBar()
    return chain
