"""Inference with a runner: model outputs batch by batch, and the metrics of one pass without training."""
import torch

from torchstage.callbacks.base import Callback, CancelStage
from torchstage.callbacks.checkpoints.checkpoint_saver import CheckpointCallback
from torchstage.callbacks.safety.watchdog import HangWatchdog
from torchstage.named import each
from torchstage.runner.chain import merge_chain
from torchstage.runner.defaults import default_callbacks
from torchstage.runner.errors import RunnerException
from torchstage.runner.loop_state import LoopState
from torchstage.runner.engine import Engine


def ready(runner, what: str) -> None:
    """Give a never-trained runner an engine and put its model(s) on the engine's device."""
    if runner.model is None:
        raise ValueError(f"{what} needs a model: pass {type(runner).__name__}(model=...) or call train() first")
    if runner.engine is None:
        runner.engine = Engine()
    if runner.spec is None:  # train() has not placed the models
        for model in each(runner.model):
            model.to(runner.engine.device)


def predict_loader(runner, loader, to_cpu: bool = False):
    """Yield ``runner.predict_batch(batch)`` per batch in eval mode without grad; model modes restored at the end."""
    ready(runner, "predict_loader")
    models = each(runner.model)
    modes = [model.training for model in models]
    try:
        for model in models:
            model.eval()
        for batch in loader:
            with torch.no_grad():  # not held across the yield: the caller's grad mode stays its own
                output = runner.predict_batch(runner.engine.to_device(batch))
            yield _to_cpu(output) if to_cpu else output
    finally:
        for model, mode in zip(models, modes):
            model.train(mode)


def evaluate_loader(runner, loader, callbacks=None, criterion=None) -> dict:
    """Run ``loader`` once as a ``valid`` loader through loop, loss (if a criterion), averaging and ``callbacks``.

    Returns the loader metrics; the runner's own state (chain, counters, metrics) is left as it was.
    """
    ready(runner, "evaluate_loader")
    items = callbacks.items() if isinstance(callbacks, dict) else enumerate(callbacks or ())
    for key, callback in items:
        if not isinstance(callback, Callback):
            raise TypeError(f"callbacks[{key!r}] must be a torchstage Callback, got {type(callback).__name__}")
        if isinstance(callback, CheckpointCallback):  # as Catalyst 22 refused it (IRunnerError)
            raise RunnerException(f"callbacks[{key!r}]: a CheckpointCallback has nothing to save in "
                                  f"evaluate_loader, which trains nothing; drop it")
    saved = runner.loop, runner.callbacks, runner._handlers, runner.criterion
    grad = torch.is_grad_enabled()  # a loader failing midway must not leave it off
    try:
        runner.loop = LoopState(stage_key="evaluate", num_epochs=1, loaders={"valid": loader})
        if criterion is not None:
            runner.criterion = criterion
        chain = default_callbacks(runner, evaluate=True)
        chain.update({k: cb for k, cb in saved[1].items() if isinstance(cb, HangWatchdog)})  # beats on
        runner.set_callbacks(merge_chain(chain, callbacks))
        runner._run_event("stage", runner._run_epochs, CancelStage)
        return dict(runner.epoch_metrics.get("valid", {}))
    finally:
        runner.loop, runner.callbacks, runner._handlers, runner.criterion = saved
        torch.set_grad_enabled(grad)


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
