"""Loader-level averages of every per-batch metric, weighted by batch size, exact across processes."""
import torch

from torchstage.callbacks.base import Callback, CallbackOrder


class MetricsAveragingCallback(Callback):
    """Sums ``batch_metrics`` on the device; at loader end one all-reduce and one host copy give floats.

    The results land in ``runner.loader_metrics`` (hence ``runner.epoch_metrics[loader]``).
    """

    order = CallbackOrder.MetricAggregation
    name = "averaging"
    state_per_rank = True  # partial sums of a mid-loader checkpoint differ between ranks

    def __init__(self):
        self._sums, self._counts, self._resumed = {}, {}, None

    def on_loader_start(self, runner):
        self._sums, self._counts = {}, {}
        if self._resumed is not None:  # a run resumed mid-loader continues its partial sums
            device = runner.engine.device
            self._sums = {k: v.to(device) for k, v in self._resumed["sums"].items()}
            self._counts, self._resumed = dict(self._resumed["counts"]), None

    def on_batch_end(self, runner):
        if runner.batch_skipped:
            return
        size, sums, counts = runner.batch_size, self._sums, self._counts
        for key, value in runner.batch_metrics.items():
            if key in sums:
                sums[key].add_(value.detach() if isinstance(value, torch.Tensor) else value, alpha=size)
                counts[key] += size
            else:
                value = torch.as_tensor(value.detach() if isinstance(value, torch.Tensor) else value)
                sums[key] = value.to(torch.float64 if value.device.type in ("cpu", "cuda") else torch.float32) * size
                counts[key] = size

    def state_dict(self):
        """The partial sums of the current loader (non-empty only for a checkpoint written mid-loader)."""
        return {"sums": dict(self._sums), "counts": dict(self._counts)} if self._sums else {}

    def load_state_dict(self, state):
        self._resumed = state

    def on_loader_end(self, runner):
        partial, counts = self._sums, self._counts
        self._sums, self._counts = {}, {}  # a checkpoint written after this loader holds no partial sums
        if not partial:
            return
        keys = list(partial)
        sums = torch.stack([partial[k].reshape(()) for k in keys])
        totals = torch.cat([sums, torch.tensor([counts[k] for k in keys], dtype=sums.dtype, device=sums.device)])
        values = runner.engine.all_reduce_(totals).tolist()
        n = len(keys)
        for i, key in enumerate(keys):
            runner.loader_metrics[key] = values[i] / values[n + i]
