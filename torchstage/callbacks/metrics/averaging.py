"""Loader-level averages of every per-batch metric, weighted by batch size, exact across processes."""
import torch

from torchstage.callbacks.base import Callback, CallbackOrder

#: Batches whose values are kept before they are folded into the sums: a few device ops per this many
#: batches instead of one per batch (folded at fixed loader steps, so a resumed loader sums alike).
FOLD = 64


class MetricsAveragingCallback(Callback):
    """Keeps each batch's detached metric values and batch size; every :data:`FOLD` batches of a loader they are
    folded into float64 sums on the device; at loader end one all-reduce and one host copy give floats.

    The results land in ``runner.loader_metrics`` (hence ``runner.epoch_metrics[loader]``).
    """

    order = CallbackOrder.MetricAggregation
    name = "averaging"
    state_per_rank = True  # partial sums of a mid-loader checkpoint differ between ranks

    def __init__(self):
        self._sums, self._counts, self._kept, self._resumed = {}, {}, {}, None

    def on_loader_start(self, runner):
        self._sums, self._counts, self._kept = {}, {}, {}
        if self._resumed is not None:  # a run resumed mid-loader continues its partial sums
            device = runner.engine.device
            # (a sharded checkpoint leaves out empty dicts: no fold yet, no sums)
            self._sums = {k: v.to(device) for k, v in self._resumed.get("sums", {}).items()}
            self._counts = dict(self._resumed.get("counts", {}))
            self._kept = {k: ([v.to(device) if isinstance(v, torch.Tensor) else v for v in values], list(sizes))
                          for k, (values, sizes) in self._resumed.get("kept", {}).items()}
            self._resumed = None

    def on_batch_end(self, runner):
        loop = runner.loop
        if loop.batch_skipped:
            return
        size, kept = loop.batch_size, self._kept
        for key, value in loop.batch_metrics.items():
            values = kept.get(key)
            if values is None:
                values = kept[key] = ([], [])
            values[0].append(value.detach() if isinstance(value, torch.Tensor) else value)
            values[1].append(size)
        if loop.batch_step % FOLD == 0:
            self._fold()

    def _fold(self) -> None:
        """Add the kept values, times their batch sizes, to the float64 sums (a few ops per distinct size)."""
        kept, self._kept = self._kept, {}
        for key, (values, sizes) in kept.items():
            by_size = {}
            for value, size in zip(values, sizes):
                by_size.setdefault(size, []).append(value)
            total = self._sums.get(key)
            for size, same in by_size.items():
                if isinstance(same[0], torch.Tensor):
                    part = torch.stack(same)
                    part = part.to(torch.float64 if part.device.type in ("cpu", "cuda") else torch.float32)
                else:
                    part = torch.tensor(same, dtype=torch.float64)
                part = part.sum(0) * size
                total = part if total is None else total.add_(part.to(total.device))
            self._sums[key] = total
            self._counts[key] = self._counts.get(key, 0) + sum(sizes)

    def state_dict(self):
        """The partial sums and kept values of the current loader (non-empty only for a checkpoint written
        mid-loader)."""
        if not self._sums and not self._kept:
            return {}
        return {"sums": dict(self._sums), "counts": dict(self._counts),
                "kept": {k: (list(values), list(sizes)) for k, (values, sizes) in self._kept.items()}}

    def load_state_dict(self, state):
        self._resumed = state

    def merge_rank_states(self, states: list) -> dict:
        """The ranks' partial sums and counts added, their kept values side by side."""
        merged = {"sums": {}, "counts": {}, "kept": {}}
        for state in states:
            for key, value in state.get("sums", {}).items():
                merged["sums"][key] = value if key not in merged["sums"] else merged["sums"][key] + value
            for key, value in state.get("counts", {}).items():
                merged["counts"][key] = merged["counts"].get(key, 0) + value
            for key, (values, sizes) in state.get("kept", {}).items():
                kept = merged["kept"].setdefault(key, ([], []))
                kept[0].extend(values)
                kept[1].extend(sizes)
        return merged if any(merged.values()) else {}

    def empty_rank_state(self, merged: dict) -> dict:
        """The merged sums' keys, nothing counted: every rank then all-reduces the same sums at the loader's end."""
        keys = list(merged.get("sums", {})) + [k for k in merged.get("kept", {}) if k not in merged.get("sums", {})]
        if not keys:
            return {}
        return {"sums": {k: torch.zeros((), dtype=torch.float64) for k in keys}, "counts": {k: 0 for k in keys},
                "kept": {}}

    def on_loader_end(self, runner):
        self._fold()
        partial, counts = self._sums, self._counts
        self._sums, self._counts = {}, {}  # a checkpoint written after this loader holds no partial sums
        if not partial:
            return
        keys = list(partial)
        sums = torch.stack([partial[k].reshape(()) for k in keys])
        if runner.engine.is_distributed:  # one all-reduce of every rank's sums and counts, one host copy
            totals = torch.cat([sums, torch.tensor([counts[k] for k in keys], dtype=sums.dtype, device=sums.device)])
            values = runner.engine.all_reduce_samples_(totals).tolist()  # each sample once under tensor parallel
            sums, counts = values[:len(keys)], values[len(keys):]
        else:
            sums, counts = sums.tolist(), [counts[k] for k in keys]
        for key, total, count in zip(keys, sums, counts):
            runner.loop.loader_metrics[key] = total / count
