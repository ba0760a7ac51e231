"""The runner's own bookkeeping as the lowest-order callback: modes, grad, counters, samplers, and the ticks of the
run's agreement channel."""
import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.one_or_many import each


_SEQUENCES = (tuple, list)


def batch_size_of(batch) -> int:
    """Number of samples in a batch: the first dimension of the first tensor found in it."""
    if type(batch) in _SEQUENCES and batch and type(batch[0]) is torch.Tensor and batch[0].dim():
        return batch[0].shape[0]  # the common (x, y) batch
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, dict):
        batch = batch.values()
    for item in batch:
        if isinstance(item, (torch.Tensor, dict, list, tuple)):
            return batch_size_of(item)
    return 1


class LoopCallback(Callback):
    """Sets train/eval mode and grad, resets per-level state, advances counters, calls ``set_epoch``, and ticks the
    run's agreement channel (``runner.channel``) once per train batch: the next agreement starts as a train batch
    starts, the one in flight is read as it ends, before the other callbacks (see
    :mod:`torchstage.distributed.agreement`)."""

    order = CallbackOrder.Internal
    _grad_was = None  # the grad mode a loader found, restored when it ends or the run fails inside it
    _channel = None  # the run's agreement channel while the run goes on (an idle one otherwise)

    def on_experiment_start(self, runner):
        self._channel = runner.channel if runner.channel.active else None

    def on_experiment_end(self, runner):
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.settle()  # no collective left running when the world ends

    def on_epoch_start(self, runner):
        runner.loop.global_epoch_step += 1
        runner.loop.epoch_metrics = runner.epoch_metrics_type()
        runner.loop.epoch_done, runner.loop.train_batches_done = False, 0

    def on_loader_start(self, runner):
        training = runner.loop.is_train_loader
        for model in each(runner.model):
            model.train(training)
        self._grad_was = torch.is_grad_enabled()
        torch.set_grad_enabled(training)
        sampler = getattr(runner.loop.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(runner.loop.global_epoch_step)
        batch_sampler = getattr(runner.loop.loader, "batch_sampler", None)
        if hasattr(getattr(batch_sampler, "sampler", None), "set_epoch") and batch_sampler.sampler is not sampler:
            batch_sampler.sampler.set_epoch(runner.loop.global_epoch_step)
        runner.loop.loader_metrics = runner.loop.epoch_metrics[runner.loop.loader_key] = {}
        runner.loop.loader_sample_step = 0
        if training and self._channel is not None:
            self._channel.loader_start(runner.loop.global_batch_step)

    def on_batch_start(self, runner):
        loop = runner.loop  # per batch: the loop state directly, not through the runner's properties
        batch = loop.batch
        first = batch[0] if type(batch) in _SEQUENCES and batch else None
        size = first.shape[0] if type(first) is torch.Tensor and first.dim() else batch_size_of(batch)
        loop.batch_size = size
        loop.loader_sample_step += size
        loop.run_batch_step += 1
        loop.run_sample_step += size
        if loop.is_train_loader:
            if self._channel is not None:
                self._channel.batch_start(loop.global_batch_step)
            loop.train_batches_done += 1
            loop.global_batch_step += 1
            loop.global_sample_step += size
        loop.batch_metrics, loop.batch_skipped = {}, False

    def on_batch_end(self, runner):
        if self._channel is not None and runner.loop.is_train_loader:
            self._channel.batch_end(runner.loop.global_batch_step)

    def on_loader_end(self, runner):
        torch.set_grad_enabled(self._grad_was)
        self._grad_was = None

    def on_exception(self, runner):
        if self._grad_was is not None:  # a run that fails in an evaluation loader must not leave grad off
            self.on_loader_end(runner)
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.abandon()  # not waited for: a peer may be gone

    def on_epoch_end(self, runner):
        runner.loop.epoch_done = True
