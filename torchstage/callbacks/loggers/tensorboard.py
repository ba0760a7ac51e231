"""TensorBoard event files: scalars in ``logdir/tensorboard/<loader>/``, hparams in ``logdir/tensorboard/``."""
import os
import socket
import struct
import time

from torchstage.callbacks.loggers.logger_base import BATCH, EPOCH, LoggerCallback
from torchstage.files.log_files import LogFiles

#: Bytes of batch events kept before they are handed to the file writer without waiting for the loader's end.
PENDING_BYTES = 1 << 16


class TensorBoardLogger(LoggerCallback):
    """Every loader metric as a scalar at the global epoch step, handed to the file writer thread at each
    loader's end (the events are framed here; the files are written off the training thread, in order).

    Train batch metrics (``log_period=Batch(n)``) are ``batch/<metric>`` at the global batch step,
    mid-epoch validation results (``valid_period``) ``periodic/<metric>``. The run's hyperparameters
    appear in TensorBoard's HParams tab, next to the stage's valid metric.
    """

    name = "tensorboard"

    def __init__(self, logdir: str = None, log_period=None):
        super().__init__(log_period)
        self.logdir, self.writers = logdir, {}
        self._files = LogFiles()

    def _writer(self, runner, loader: str) -> "EventFile":
        writer = self.writers.get(loader)
        if writer is None:
            folder = os.path.join(self.logdir or runner.spec.logdir, "tensorboard", loader)
            writer = self.writers[loader] = EventFile(os.path.normpath(folder))
        return writer

    def _flush(self, runner, writer: "EventFile") -> None:
        data = writer.take()
        if data:
            self._files.append(runner, writer.path, data)

    def log_hparams(self, hparams, runner):
        # tensorboardX (TensorBoard's protobufs) is imported when a run first logs, not with torchstage
        from tensorboardX.proto.api_pb2 import MetricInfo, MetricName
        from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
        from tensorboardX.summary import hparams as hparams_summary
        experiment, start, self._session_end = hparams_summary(hparams, {})
        metadata = experiment.value[0].metadata.plugin_data  # declare the valid metric, read from its loader's run
        content = HParamsPluginData.FromString(metadata.content)
        content.experiment.metric_infos.append(MetricInfo(name=MetricName(group=runner.valid_loader,
                                                                          tag=runner.valid_metric)))
        metadata.content = content.SerializeToString()
        writer = self._writer(runner, ".")
        for summary in (experiment, start):
            writer.add_summary(summary)
        self._flush(runner, writer)

    def log_metrics(self, metrics, step, loader, scope, runner):
        writer = self._writer(runner, loader)
        prefix = "" if scope == EPOCH else f"{scope}/"
        writer.add_scalars({f"{prefix}{key}": value for key, value in metrics.items()
                            if isinstance(value, (int, float))}, step)
        if scope != BATCH or writer.pending_bytes > PENDING_BYTES:
            self._flush(runner, writer)

    def close(self, runner, status):
        session_end = getattr(self, "_session_end", None)
        if session_end is not None and status == "FINISHED":
            self._writer(runner, ".").add_summary(session_end)
        for writer in self.writers.values():
            self._flush(runner, writer)
        self._files.close(runner)
        self.writers = {}


class EventFile:
    """The events of one TensorBoard event file, framed as TensorBoard reads them (TFRecord with masked
    CRC-32C) and kept until :meth:`take`, whose bytes the caller appends to :attr:`path`. No thread, queue or
    per-scalar pickling of its own (what tensorboardX's SummaryWriter costs: about 0.1 ms of CPU per scalar)."""

    def __init__(self, folder: str):
        from tensorboardX.proto.event_pb2 import Event  # TensorBoard's protobufs, imported when a run first logs
        # the pid and nanoseconds keep a run resumed within the same second from appending to the old file
        self.path = os.path.join(folder, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
                                         f"{os.getpid()}.{time.time_ns()}")
        self._pending, self.pending_bytes = [], 0
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_summary(self, summary, step: int = None) -> None:
        """Append a ``Summary`` protobuf (at ``step``, if given)."""
        from tensorboardX.proto.event_pb2 import Event
        event = Event(wall_time=time.time(), summary=summary)
        if step is not None:
            event.step = step
        self._write(event)

    def add_scalars(self, scalars: dict, step: int) -> None:
        """Append tag -> number scalars at ``step``, one event for all."""
        if not scalars:
            return
        from tensorboardX.proto.summary_pb2 import Summary
        self.add_summary(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))
                                        for tag, value in scalars.items()]), step)

    def _write(self, event) -> None:
        from tensorboardX.record_writer import masked_crc32c
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._pending.append(b"".join((header, struct.pack("<I", masked_crc32c(header)), data,
                                       struct.pack("<I", masked_crc32c(data)))))
        self.pending_bytes += len(data) + 16

    def take(self) -> bytes:
        """The framed events added since the last call, to append to :attr:`path`."""
        data, self._pending, self.pending_bytes = b"".join(self._pending), [], 0
        return data
