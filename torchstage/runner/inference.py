"""Inference with a runner: model outputs batch by batch, the metrics of one pass without training, and
``runner.infer``'s pass of the callback chain over inference loaders."""
import os

import torch

from torchstage.callbacks.base import CancelStage
from torchstage.files.checkpoint_read import load_checkpoint
from torchstage.one_or_many import each
from torchstage.runner.chain import check_callbacks, merge_chain
from torchstage.runner.defaults import default_callbacks
from torchstage.runner.errors import RunnerException
from torchstage.runner.loop_state import LoopState
from torchstage.distributed.engine import Engine
from torchstage.runner.shared import share


def ready(runner, what: str) -> None:
    """Give a never-trained runner an engine and put its model(s) on the engine's device."""
    if runner.model is None:
        raise ValueError(f"{what} needs a model: pass {type(runner).__name__}(model=...) or call train() first")
    if runner.engine is None:
        runner.engine = Engine()
    if runner.spec is None:  # train() has not placed the models
        for model in each(runner.model):
            model.to(runner.engine.device)


def use_model(runner, model, resume, what: str) -> None:
    """``model=`` replaces the runner's model; ``resume=`` loads a checkpoint's model weights into it."""
    if model is not None:
        runner.model = model
    ready(runner, what)
    if resume is not None:
        runner.load_state_dict(load_checkpoint(os.fspath(resume)), weights_only=True)


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
    for key, callback in check_callbacks(callbacks):
        if share([callback]).checkpoint_writers:  # a CheckpointCallback, as Catalyst 22 refused it (IRunnerError)
            raise RunnerException(f"callbacks[{key!r}]: a CheckpointCallback has nothing to save in "
                                  f"evaluate_loader, which trains nothing; drop it")
    saved = runner.loop, runner.callbacks, runner._handlers, runner.criterion, runner.shared
    grad = torch.is_grad_enabled()  # a loader failing midway must not leave it off
    try:
        runner.loop = LoopState(stage_key="evaluate", num_epochs=1, loaders={"valid": loader})
        if criterion is not None:
            runner.criterion = criterion
        chain = default_callbacks(runner, evaluate=True)
        runner.set_callbacks(merge_chain(chain, saved[4].nested, callbacks))  # the hang watchdog beats on
        runner._run_event("stage", runner._run_epochs, CancelStage)
        return dict(runner.loop.epoch_metrics.get("valid", {}))
    finally:
        runner.loop, runner.callbacks, runner._handlers, runner.criterion, runner.shared = saved
        torch.set_grad_enabled(grad)


def infer(runner, model=None, loaders=None, callbacks=None, resume=None, **unsupported):
    """Run every loader of ``loaders`` once through ``handle_batch`` and ``callbacks`` (eval mode, no grad).

    Callbacks read ``runner.batch`` (inputs and model outputs) per batch, e.g. to collect predictions.
    ``resume``: a checkpoint whose model weights are loaded first. Returns the runner.
    """
    if unsupported:
        raise TypeError(f"infer() got argument(s) {sorted(unsupported)} it does not take; it takes model, loaders, "
                        f"callbacks and resume")
    if not isinstance(loaders, dict) or not loaders:
        raise TypeError(f"infer() needs loaders={{name: loader}}, got {loaders!r:.80}")
    training = [name for name in loaders if str(name).startswith("train")]
    if training:
        raise ValueError(f"infer(): loaders {training} would train (their names start with 'train'); rename them, "
                         f"e.g. 'infer'")
    use_model(runner, model, resume, "infer")
    check_callbacks(callbacks)
    runner.set_callbacks(merge_chain(default_callbacks(runner), callbacks))
    runner.loop.stage_key, runner.loop.num_epochs, runner.loop.epoch, runner.loop.loaders = "infer", 1, 0, dict(loaders)
    runner.loop.global_epoch_step = runner.loop.global_batch_step = runner.loop.global_sample_step = 0
    runner.loop.epoch_metrics = runner.epoch_metrics_type()
    runner._run_event("stage", runner._run_epochs, CancelStage)
    return runner


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
