"""One batch metric made of others, e.g. ``loss = 0.7 * loss_ce + 0.3 * loss_dice`` (Catalyst 20.12's callback)."""
from torchstage.callbacks.base import Callback, CallbackOrder

_MODES = ("sum", "mean", "weighted_sum", "weighted_mean")


class MetricAggregationCallback(Callback):
    """Writes ``batch_metrics[prefix]`` from other batch metrics, after the losses and before averaging.

    ``metrics``: a list of names (``mode`` ``"sum"``/``"mean"``; None takes all) or a dict name -> weight
    (``"weighted_sum"``, or ``"weighted_mean"`` with weights normalised to sum to 1); ``multiplier`` scales
    the result. A dict criterion in ``train()`` (see :class:`~torchstage.Loss`) is torchstage's own spelling.
    """

    order = CallbackOrder.MetricAggregation - 1

    def __init__(self, prefix: str = None, metrics=None, mode: str = "mean", scope: str = "batch",
                 multiplier: float = 1.0):
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"MetricAggregationCallback: prefix must be the new metric's name, got {prefix!r}")
        if mode not in _MODES:
            raise ValueError(f"MetricAggregationCallback: mode must be one of {_MODES}, got {mode!r}")
        if scope != "batch":
            raise ValueError(f"MetricAggregationCallback(scope={scope!r}): only 'batch' is supported; loader and "
                             f"epoch values are batch-size-weighted averages of the batch metrics")
        metrics = [metrics] if isinstance(metrics, str) else metrics
        if mode.startswith("weighted") != isinstance(metrics, dict):
            raise TypeError(f"MetricAggregationCallback(mode={mode!r}) needs metrics as "
                            f"{'a dict name -> weight' if mode.startswith('weighted') else 'a list of names or None'}"
                            f", got {metrics!r}")
        if mode == "weighted_mean":
            total = sum(metrics.values())
            metrics = {name: weight / total for name, weight in metrics.items()}
        self.prefix, self.metrics, self.mode, self.multiplier = prefix, metrics, mode, multiplier

    @property
    def produces(self):
        return (self.prefix,)

    def on_batch_end(self, runner):
        values = runner.loop.batch_metrics
        if isinstance(self.metrics, dict):
            result = sum(values[name] * weight for name, weight in self.metrics.items())
        else:
            parts = [values[name] for name in (self.metrics or [k for k in values if k != self.prefix])]
            result = sum(parts) / len(parts) if self.mode == "mean" else sum(parts)
        values[self.prefix] = result * self.multiplier if self.multiplier != 1 else result
