"""TensorBoard through tensorboardX: scalars in ``logdir/tensorboard/<loader>/``, hparams in ``logdir/tensorboard/``."""
import os
import time

from torchstage.callbacks.logger_base import BATCH, EPOCH, LoggerCallback


class TensorBoardLogger(LoggerCallback):
    """Every loader metric as a scalar at the global epoch step (tensorboardX is imported lazily).

    Train batch metrics (``log_period=Batch(n)``) are ``batch/<metric>`` at the global batch step,
    mid-epoch validation results (``valid_period``) ``periodic/<metric>``. The run's hyperparameters
    appear in TensorBoard's HParams tab, next to the stage's valid metric.
    """

    name = "tensorboard"

    def __init__(self, logdir: str = None, log_period=None):
        super().__init__(log_period)
        self.logdir, self.writers = logdir, {}

    def _writer(self, runner, loader: str):
        writer = self.writers.get(loader)
        if writer is None:
            from tensorboardX import SummaryWriter  # imported when a run first logs
            folder = os.path.join(self.logdir or runner.spec.logdir, "tensorboard", loader)
            # tensorboardX names files by the second: a run resumed within it would overwrite the old file
            writer = self.writers[loader] = SummaryWriter(os.path.normpath(folder),
                                                          filename_suffix=f".{os.getpid()}.{time.time_ns()}")
        return writer

    def log_hparams(self, hparams, runner):
        # tensorboardX is imported when a run first logs, not with torchstage
        from tensorboardX.proto.api_pb2 import MetricInfo, MetricName
        from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
        from tensorboardX.summary import hparams as hparams_summary
        experiment, start, self._session_end = hparams_summary(hparams, {})
        metadata = experiment.value[0].metadata.plugin_data  # declare the valid metric, read from its loader's run
        content = HParamsPluginData.FromString(metadata.content)
        content.experiment.metric_infos.append(MetricInfo(name=MetricName(group=runner.valid_loader,
                                                                          tag=runner.valid_metric)))
        metadata.content = content.SerializeToString()
        writer = self._writer(runner, ".").file_writer
        for summary in (experiment, start):
            writer.add_summary(summary)
        writer.flush()

    def log_metrics(self, metrics, step, loader, scope, runner):
        writer = self._writer(runner, loader)
        prefix = "" if scope == EPOCH else f"{scope}/"
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                writer.add_scalar(f"{prefix}{key}", value, step)
        if scope != BATCH:
            writer.flush()

    def close(self, runner, status):
        session_end = getattr(self, "_session_end", None)
        if session_end is not None and status == "FINISHED":
            self._writer(runner, ".").file_writer.add_summary(session_end)
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
