"""Any torchmetrics ``Metric`` or ``MetricCollection`` over each loader, logged like the built-in metrics.

Updates stay on the device; at loader end the states are synced through the runner's engine (torchmetrics'
own sync is off, see :mod:`torchstage.metrics.torchmetrics_sync`), computed once and copied to the host
once. A checkpoint written mid-loader keeps each rank's partial states, so a resumed loader continues them.
"""
import re
import warnings

import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.metrics.torchmetrics_sync import state_names, sync_metric_states


class TorchMetricsCallback(Callback):
    """Feeds ``(batch[input_key], batch[target_key])`` to a torchmetrics metric; results in ``loader_metrics``.

    ``name``: the logged name of a single metric (default: its class name in snake case, e.g.
    ``multiclass_f1_score``); for a collection, a prefix ``name/`` before each of its keys. A metric
    returning several values (per-class scores, a dict) logs ``name/<index or key>``. ``loaders``
    limits it to some loaders (default: all).
    """

    order = CallbackOrder.Metric
    state_per_rank = True  # the partial states of a mid-loader checkpoint differ between ranks

    def __init__(self, metric_or_collection, name: str = None, input_key: str = "logits",
                 target_key: str = "targets", loaders=None):
        import torchmetrics  # an optional extra: pip install torchstage[torchmetrics]
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"TorchMetricsCallback: name must be a non-empty str or None, got {name!r}")
        for key, value in (("input_key", input_key), ("target_key", target_key)):
            if not isinstance(value, str):
                raise TypeError(f"TorchMetricsCallback: {key} must be a str, got {value!r}")
        if isinstance(metric_or_collection, torchmetrics.MetricCollection):
            self.members = {key: m for key, m in metric_or_collection.items(keep_base=False, copy_state=False)}
            prefix = "" if name is None else f"{name}/"
            self.members = {prefix + key: m for key, m in self.members.items()}
        elif isinstance(metric_or_collection, torchmetrics.Metric):
            self.members = {name or _snake(type(metric_or_collection).__name__): metric_or_collection}
        else:
            raise TypeError(f"TorchMetricsCallback: metric_or_collection must be a torchmetrics.Metric or "
                            f"MetricCollection, got {type(metric_or_collection).__name__}")
        for metric in self.members.values():
            metric.sync_on_compute, metric._to_sync = False, False  # synced by the engine instead
            metric.dist_sync_on_step = False
        self.metric, self.input_key, self.target_key = metric_or_collection, input_key, target_key
        self.loaders = None if loaders is None else ({loaders} if isinstance(loaders, str) else set(loaders))
        self._resumed, self._placed, self._loader_key = None, False, None

    @property
    def produces(self):
        return tuple(self.members)

    def _active(self, runner) -> bool:
        return self.loaders is None or runner.loop.loader_key in self.loaders

    def on_loader_start(self, runner):
        if not self._placed:
            for metric in self.members.values():
                metric.to(runner.engine.device)
            self._placed = True
        for metric in self.members.values():
            metric.reset()
        self._loader_key = runner.loop.loader_key
        resumed, self._resumed = self._resumed, None
        if resumed and resumed.get("loader") == runner.loop.loader_key:
            self._load_states(resumed["states"], runner.engine.device)

    def on_batch_end(self, runner):
        if not self._active(runner):
            return
        outputs, targets = runner.loop.batch[self.input_key], runner.loop.batch[self.target_key]
        with torch.no_grad():
            outputs = outputs.detach()
            for metric in self.members.values():
                metric.update(outputs, targets)

    def on_loader_end(self, runner):
        if not self._active(runner):
            return
        values = {}
        for key, metric in self.members.items():
            sync_metric_states(metric, runner.engine)
            with warnings.catch_warnings():  # an empty loader warns; its NaN/error is reported below
                warnings.simplefilter("ignore")
                values.update(_flatten(key, metric.compute()))
            metric.reset()  # a checkpoint written after this loader holds no partial state
        if values:
            floats = torch.stack([v.reshape(()).double() for v in values.values()]).tolist()  # one host copy
            runner.loop.loader_metrics.update(zip(values, floats))

    def state_dict(self) -> dict:
        """Each member's states mid-loader (empty between loaders), on the CPU."""
        if not any(m._update_count for m in self.members.values()):
            return {}
        states = {}
        for key, metric in self.members.items():
            states[key] = {"update_count": metric._update_count}
            for name in state_names(metric):
                value = getattr(metric, name)
                states[key][name] = [t.detach().cpu() for t in value] if isinstance(value, list) else value.detach().cpu()
        return {"loader": self._loader_key, "states": states}

    def load_state_dict(self, state: dict) -> None:
        self._resumed = state

    def _load_states(self, states: dict, device) -> None:
        for key, metric in self.members.items():
            saved = states[key]
            metric._update_count = saved["update_count"]
            for name in state_names(metric):
                value = saved[name]
                setattr(metric, name, [t.to(device) for t in value] if isinstance(value, list) else value.to(device))


def _snake(name: str) -> str:
    """``MulticlassF1Score`` -> ``multiclass_f1_score``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _flatten(key: str, value) -> dict:
    """``{key: 0-dim tensor}``; a vector gives ``key/0``, ``key/1``...; a dict gives ``key/<its key>``."""
    if isinstance(value, dict):
        return {k: v for sub, item in value.items() for k, v in _flatten(f"{key}/{sub}", item).items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in _flatten(f"{key}/{i}", item).items()}
    value = torch.as_tensor(value)
    if value.numel() == 1:
        return {key: value.reshape(())}
    return {f"{key}/{i}": v for i, v in enumerate(value.reshape(-1))}
