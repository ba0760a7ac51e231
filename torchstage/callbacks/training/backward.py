"""Backward as its own callback (Catalyst 22's ``BackwardCallback``): every train batch, the strategy backpropagates
one loss; an :class:`~torchstage.OptimizerCallback` of the same ``metric_key`` then only steps."""
import functools

import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.callbacks.training.loss_checks import nonscalar_loss_error
from torchstage.one_or_many import each

#: ``grad_clip_fn`` given by name -> the torch function.
CLIP_FUNCTIONS = {"clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
                  "clip_grad_value_": torch.nn.utils.clip_grad_value_}


class BackwardCallback(Callback):
    """Every train batch: ``runner.strategy.backward(runner.batch_metrics[metric_key], None)``, then ``grad_clip_fn`` on the
    parameters of the model(s) (``model_key`` picks one of a dict of models).

    Several of them back-propagate their losses before any optimizer steps (their phase, ``Backward``, comes
    before ``Optimizer``): a GAN whose generator loss needs the discriminator's weights unchanged. An
    :class:`~torchstage.OptimizerCallback` with the same ``metric_key`` leaves the backward to this callback and
    steps (then resets the gradients) every ``accumulation_steps`` train batches, as Catalyst 22's did.
    ``grad_clip_fn`` is a callable taking the parameters, or ``"clip_grad_norm_"``/``"clip_grad_value_"``, with
    ``grad_clip_params`` as its keyword arguments; ``log_gradient`` adds the norm it returns to the batch metrics
    as ``gradient/<metric_key>/norm``.
    """

    order = CallbackOrder.Backward
    train_batches_only = True

    def __init__(self, metric_key: str = "loss", grad_clip_fn=None, grad_clip_params: dict = None,
                 log_gradient: bool = False, model_key: str = None):
        if not isinstance(metric_key, str):
            raise TypeError(f"BackwardCallback: metric_key must be a str (a key of runner.batch_metrics), "
                            f"got {metric_key!r}")
        self.metric_key, self.model_key, self.log_gradient = metric_key, model_key, bool(log_gradient)
        self.grad_clip_fn = _clip_function(grad_clip_fn, grad_clip_params)
        if self.log_gradient and self.grad_clip_fn is None:
            raise ValueError("BackwardCallback(log_gradient=True) logs the norm that grad_clip_fn returns; "
                             "give grad_clip_fn=... too")

    def attach(self, shared) -> None:
        shared.add_backward(self.metric_key)  # its optimizer callback only steps

    def on_batch_end(self, runner):
        loop = runner.loop
        if not loop.is_train_loader or loop.batch_skipped:
            return
        loss = loop.batch_metrics.get(self.metric_key)
        if loss is None:
            raise KeyError(f"BackwardCallback(metric_key={self.metric_key!r}) found no such loss in batch_metrics; "
                           f"it has {sorted(loop.batch_metrics)}")
        try:
            runner.strategy.backward(loss, None)
        except RuntimeError as exc:  # torch's "grad can be implicitly created only for scalar outputs", named
            error = nonscalar_loss_error(runner.criterion, self.metric_key, loss)
            if error is None:
                raise
            raise error from exc
        if self.grad_clip_fn is not None:
            if runner.scaler is not None:
                raise ValueError("BackwardCallback(grad_clip_fn=...) under amp='fp16' would clip scaled gradients; "
                                 "clip with OptimizerCallback(grad_clip_norm=...) instead")
            models = runner.model if self.model_key is None else {self.model_key: runner.model[self.model_key]}
            params = [p for model in each(models) for p in model.parameters() if p.grad is not None]
            norm = self.grad_clip_fn(params)
            if self.log_gradient:
                loop.batch_metrics[f"gradient/{self.metric_key}/norm"] = norm


def _clip_function(fn, params):
    """The clipping function ``fn`` (a callable or a name of :data:`CLIP_FUNCTIONS`) bound to ``params``."""
    if fn is None:
        if params is not None:
            raise TypeError("BackwardCallback: grad_clip_params without grad_clip_fn; give grad_clip_fn="
                            "'clip_grad_norm_' (or 'clip_grad_value_', or a callable)")
        return None
    if isinstance(fn, str):
        if fn not in CLIP_FUNCTIONS:
            raise ValueError(f"BackwardCallback: grad_clip_fn={fn!r}; expected a callable or one of "
                             f"{sorted(CLIP_FUNCTIONS)}")
        fn = CLIP_FUNCTIONS[fn]
    if not callable(fn):
        raise TypeError(f"BackwardCallback: grad_clip_fn must be callable (parameters -> norm) or a name, got {fn!r}")
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"BackwardCallback: grad_clip_params must be a dict of keyword arguments, got {params!r}")
    return functools.partial(fn, **params) if params else fn
