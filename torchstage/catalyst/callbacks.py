"""The callbacks that take Catalyst 20.12's or 22's arguments besides torchstage's: each is the core callback of
the same name (``isinstance`` holds both ways), translating Catalyst's arguments (noted once) or refusing them with
where they went, then running the core constructor."""
from torchstage.arguments import ArgumentError
from torchstage.callbacks import base
from torchstage.callbacks.checkpoints import checkpoint_saver
from torchstage.callbacks.control import debug, early_stopping, optuna_pruning
from torchstage.callbacks.metrics import aggregation
from torchstage.callbacks.training import criterion, optimizer
from torchstage.catalyst.callback_args import criterion_args, optimizer_args, renamed_argument
from torchstage.catalyst.checkpoint_args import POSITIONAL_HINT, catalyst22_checkpoint_args
from torchstage.catalyst.core_types import StandsForCore
from torchstage.catalyst.names import callback_scope
from torchstage.periods import Epoch


class Callback(base.Callback, metaclass=StandsForCore, core=base.Callback):
    """The base class of callbacks; ``node`` is Catalyst 20.12's name for ``scope`` (``Callback(order, node)``), and
    its third positional argument (a stage/experiment scope) is refused with the reason."""

    def __init__(self, order: int = None, node: base.CallbackScope = None, *catalyst_scope,
                 scope: base.CallbackScope = None):
        super().__init__(order, callback_scope(type(self).__name__, node, catalyst_scope, scope, base.CallbackScope))


class CriterionCallback(criterion.CriterionCallback, metaclass=StandsForCore, core=criterion.CriterionCallback):
    """Also Catalyst 20.12's ``input_key=<target>, output_key=<model output>, prefix=<metric name>``."""

    def __init__(self, input_key: str = None, target_key: str = None, metric_key: str = None,
                 criterion_key: str = None, *, output_key: str = None, prefix: str = None, multiplier: float = 1.0):
        input_key, target_key, metric_key = criterion_args(type(self).__name__, input_key, target_key, output_key,
                                                           metric_key, prefix)
        super().__init__(input_key, target_key, metric_key, criterion_key, multiplier=multiplier)


class OptimizerCallback(optimizer.OptimizerCallback, metaclass=StandsForCore, core=optimizer.OptimizerCallback):
    """Also Catalyst 20.12's ``loss_key``, ``grad_clip_params`` (translated), ``decouple_weight_decay``,
    ``use_amp``, ``use_apex`` (refused with where they went), ``use_fast_zero_grad`` (torchstage always resets
    gradients to None) and Catalyst 22's ``grad_clip_fn`` (refused: 22 never applied it)."""

    def __init__(self, metric_key: str = "loss", optimizer_key: str = None, accumulation_steps: int = 1,
                 grad_clip_norm: float = None, grad_clip_value: float = None, *, grad_clip_params: dict = None,
                 loss_key: str = None, decouple_weight_decay: bool = False, use_fast_zero_grad: bool = False,
                 use_amp: bool = None, use_apex: bool = None, grad_clip_fn=None):
        if grad_clip_fn is not None:  # Catalyst 22 kept it and never applied it
            raise TypeError("OptimizerCallback(grad_clip_fn=...) is Catalyst 22's argument, which it never applied; "
                            "clip with BackwardCallback(metric_key, grad_clip_fn=..., grad_clip_params=...) or "
                            "OptimizerCallback(grad_clip_norm=... / grad_clip_value=...)")
        if callable(grad_clip_norm) or isinstance(grad_clip_norm, str):  # 22's fourth positional argument
            raise TypeError(f"OptimizerCallback: the fourth argument is grad_clip_norm (a number), got "
                            f"{grad_clip_norm!r}; Catalyst 22's grad_clip_fn belongs to BackwardCallback")
        metric_key, grad_clip_norm, grad_clip_value = optimizer_args(
            metric_key, loss_key, grad_clip_norm, grad_clip_value, grad_clip_params, decouple_weight_decay, use_amp,
            use_apex)
        super().__init__(metric_key, optimizer_key, accumulation_steps, grad_clip_norm, grad_clip_value)


class MetricAggregationCallback(aggregation.MetricAggregationCallback, metaclass=StandsForCore,
                                core=aggregation.MetricAggregationCallback):
    """Also Catalyst 22's ``metric_key=`` for ``prefix``."""

    def __init__(self, prefix: str = None, metrics=None, mode: str = "mean", scope: str = "batch",
                 multiplier: float = 1.0, *, metric_key: str = None):
        prefix = renamed_argument("MetricAggregationCallback", "metric_key", metric_key, "prefix", prefix,
                                  version="22")
        super().__init__(prefix, metrics, mode, scope, multiplier)


class CheckpointCallback(checkpoint_saver.CheckpointCallback, metaclass=StandsForCore,
                         core=checkpoint_saver.CheckpointCallback):
    """Also Catalyst 20.12's ``save_n_best`` and Catalyst 22's arguments (``loader_key``, ``metric_key``,
    ``minimize``, ``mode``...) by name: the best epoch is then judged by that loader's metric instead of the run's
    ``valid_metric``, and ``logdir`` is the checkpoint folder itself (see :mod:`torchstage.catalyst.checkpoint_args`
    for the file names)."""

    def __init__(self, logdir: str = None, period=Epoch(1), topk: int = 0, load_best_on_end: bool = False, *,
                 save_n_best: int = None, loader_key: str = None, metric_key: str = None, minimize: bool = None,
                 mode: str = None, save_last: bool = None, save_best: bool = None, resume_model: str = None,
                 resume_runner: str = None):
        topk = renamed_argument("CheckpointCallback", "save_n_best", save_n_best, "topk", topk, default=0)
        #: Catalyst 22's arguments: logdir is the folder itself, the best judged by loader_key/metric_key/minimize
        self.catalyst22 = catalyst22_checkpoint_args(logdir, loader_key, metric_key, minimize, mode,
                                                     save_last, save_best, resume_model, resume_runner)
        try:
            super().__init__(logdir, period, topk, load_best_on_end)
        except ArgumentError as error:
            if error.name != "period" or not isinstance(period, str):
                raise
            raise ArgumentError("period", error.problem + POSITIONAL_HINT) from None
        self.loader_key, self.metric_key, self.minimize = loader_key, metric_key, minimize

    def folder_of(self, run_logdir) -> str:
        """With Catalyst 22's arguments, ``logdir`` is the checkpoint folder itself."""
        return self.logdir if self.catalyst22 else super().folder_of(run_logdir)


class CheckRunCallback(debug.CheckRunCallback, metaclass=StandsForCore, core=debug.CheckRunCallback):
    """Also Catalyst 20.12's ``num_epoch_steps=`` for ``num_epochs``."""

    def __init__(self, num_epochs: int = None, num_batch_steps: int = 3, *, num_epoch_steps: int = None):
        num_epochs = renamed_argument("CheckRunCallback", "num_epoch_steps", num_epoch_steps, "num_epochs", num_epochs)
        super().__init__(num_epochs, num_batch_steps)


class EarlyStoppingCallback(early_stopping.EarlyStoppingCallback, metaclass=StandsForCore,
                            core=early_stopping.EarlyStoppingCallback):
    """Also Catalyst 20.12's ``metric=`` for ``metric_key``."""

    def __init__(self, patience: int, metric_key: str = None, loader_key: str = None, minimize: bool = None,
                 min_delta: float = 0.0, *, metric: str = None):
        metric_key = renamed_argument("EarlyStoppingCallback", "metric", metric, "metric_key", metric_key)
        super().__init__(patience, metric_key, loader_key, minimize, min_delta)


class OptunaPruningCallback(optuna_pruning.OptunaPruningCallback, metaclass=StandsForCore,
                            core=optuna_pruning.OptunaPruningCallback):
    """Also Catalyst 22's ``OptunaPruningCallback(trial, loader_key, metric_key, minimize, min_delta=1e-6)``."""

    def __init__(self, trial=None, loader: str = None, metric: str = None, minimize: bool = None,
                 min_delta: float = None, *, loader_key: str = None, metric_key: str = None):
        catalyst22 = loader_key is not None or metric_key is not None
        owner = "OptunaPruningCallback"
        loader = renamed_argument(owner, "loader_key", loader_key, "loader", loader, version="22")
        metric = renamed_argument(owner, "metric_key", metric_key, "metric", metric, version="22")
        min_delta = (1e-6 if catalyst22 else 0.0) if min_delta is None else min_delta
        super().__init__(trial, loader, metric, minimize, min_delta)
