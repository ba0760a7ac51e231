"""The default callback chain of a run, by name, so a user callback of the same name replaces one."""
from torchstage.callbacks.averaging import MetricsAveragingCallback
from torchstage.callbacks.checkpoint_saver import CheckpointCallback
from torchstage.callbacks.console import ConsoleLogger
from torchstage.callbacks.csv_logger import CSVLogger
from torchstage.callbacks.loop import LoopCallback
from torchstage.callbacks.nonfinite import NonFiniteLossCallback
from torchstage.callbacks.progress import ProgressBar
from torchstage.callbacks.requeue import RequeueCallback
from torchstage.callbacks.scheduler import SchedulerCallback
from torchstage.callbacks.stop import StopCallback
from torchstage.callbacks.tensorboard import TensorBoardLogger
from torchstage.callbacks.watchdog import HangWatchdogCallback
from torchstage.distributed.slurm_requeue import slurm_job_id


def default_callbacks(runner, spec) -> dict:
    """Bookkeeping, metric averaging, scheduler (if any), checkpoints and logs (with a logdir), graceful stop,
    SLURM requeue (inside a SLURM job), progress."""
    chain = {"loop": LoopCallback(), "nonfinite": NonFiniteLossCallback(), "averaging": MetricsAveragingCallback()}
    if any(stage.scheduler is not None for stage in spec.stage_specs):
        chain["scheduler"] = SchedulerCallback(mode=spec.scheduler_step)
    if spec.logdir is not None:
        chain.update(checkpoint=CheckpointCallback(period=spec.checkpoint_period, topk=spec.topk,
                                                   load_best_on_end=spec.load_best_on_end),
                     csv=CSVLogger(), tensorboard=TensorBoardLogger(
                         batch_period=spec.log_period, periodic_validation=spec.valid_period is not None))
    from torchstage.runner.features import feature_callbacks
    chain.update(feature_callbacks(spec))  # valid_every, check, overfit, timeit
    chain["console"] = ConsoleLogger()
    chain["stop"] = StopCallback()
    if spec.requeue is not False and slurm_job_id() is not None:
        chain["requeue"] = RequeueCallback(required=spec.requeue is True)
    if spec.hang_timeout is not None:
        chain["watchdog"] = HangWatchdogCallback(spec.hang_timeout)
    if spec.verbose:
        chain["progress"] = ProgressBar()
    return chain
