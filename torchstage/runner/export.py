"""A trained model out of the runner: ``runner.trace`` (TorchScript or ``torch.export``) and ``runner.infer``
(a pass of the callback chain over inference loaders), the two Catalyst 20.12 methods with no other home."""
import os

import torch

from torchstage.callbacks.base import CancelStage
from torchstage.files.checkpoint import load_checkpoint
from torchstage.runner.chain import check_callbacks, merge_chain
from torchstage.runner.defaults import default_callbacks
from torchstage.runner.inference import ready

BACKENDS = ("jit", "export")


class _Recorder(torch.nn.Module):
    """Stands in for the model during ``predict_batch`` and records the arguments of its first call."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []

    def forward(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.model(*args, **kwargs)


def trace(runner, model=None, batch=None, loader=None, logdir=None, mode: str = "eval", requires_grad: bool = False,
          device="cpu", backend: str = "jit", method_name: str = "forward", fp16=None, predict_params=None):
    """The model as traced on ``batch`` (or the first batch of ``loader``) through ``runner.predict_batch``.

    ``backend="jit"`` gives a ``torch.jit.ScriptModule`` (saved as ``logdir/trace/traced-forward.pth``),
    ``backend="export"`` a ``torch.export.ExportedProgram`` (``.pt2``). The model's mode, device and
    ``requires_grad`` flags are restored afterwards.
    """
    if backend not in BACKENDS:
        raise ValueError(f"trace(backend={backend!r}): expected one of {BACKENDS}")
    if mode not in ("eval", "train"):
        raise ValueError(f"trace(mode={mode!r}): expected 'eval' or 'train'")
    if method_name != "forward":
        raise ValueError(f"trace(method_name={method_name!r}): only 'forward' is traced; wrap the method in a "
                         f"module whose forward calls it")
    if fp16:
        raise ValueError("trace(fp16=...): tracing runs in full precision; convert the traced model afterwards "
                         "(e.g. traced.half()) if you need half precision")
    if batch is None:
        if loader is None:
            raise ValueError("trace() needs batch=... or loader=... (its first batch is used)")
        batch = next(iter(loader))
    if model is not None:
        runner.model = model
    ready(runner, "trace")
    net = runner.unwrapped_model
    if isinstance(net, dict):
        raise ValueError("trace(): the runner holds a dict of models; pass model=<the one to trace>")
    saved = (runner.model, runner.engine.device, net.training,
             [p.requires_grad for p in net.parameters()], next(net.parameters(), torch.empty(0)).device)
    recorder = _Recorder(net)
    try:
        net.to(device).train(mode == "train")
        for p in net.parameters():
            p.requires_grad_(requires_grad)
        runner.model, runner.engine.device = recorder, torch.device(device)
        with torch.set_grad_enabled(requires_grad):
            runner.predict_batch(runner.engine.to_device(batch) if runner.engine.moves_batches else batch,
                                 **(predict_params or {}))
        if not recorder.calls:
            raise ValueError(f"trace(): {type(runner).__name__}.predict_batch did not call the model")
        args, kwargs = recorder.calls[0]
        with torch.set_grad_enabled(requires_grad):
            if backend == "export":
                traced = torch.export.export(net, args, kwargs)
            elif kwargs:
                traced = torch.jit.trace(net, example_kwarg_inputs=kwargs)
            else:
                traced = torch.jit.trace(net, args)
    finally:
        runner.model, runner.engine.device = saved[0], saved[1]
        net.train(saved[2]).to(saved[4])
        for p, flag in zip(net.parameters(), saved[3]):
            p.requires_grad_(flag)
    if logdir is not None:
        _save(traced, logdir, backend, mode, requires_grad)
    return traced


def _save(traced, logdir, backend: str, mode: str, requires_grad: bool) -> str:
    folder = os.path.join(os.fspath(logdir), "trace")
    os.makedirs(folder, exist_ok=True)
    name = "traced-forward" + ("" if mode == "eval" else "-in-train") + ("-with-grad" if requires_grad else "")
    path = os.path.join(folder, name + (".pth" if backend == "jit" else ".pt2"))
    if backend == "jit":
        torch.jit.save(traced, path)
    else:
        torch.export.save(traced, path)
    return path


def use_model(runner, model, resume, what: str) -> None:
    """``model=`` replaces the runner's model; ``resume=`` loads a checkpoint's model weights into it."""
    if model is not None:
        runner.model = model
    ready(runner, what)
    if resume is not None:
        runner.load_state_dict(load_checkpoint(os.fspath(resume)), weights_only=True)


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
    runner.stage_key, runner.num_epochs, runner.epoch, runner.loaders = "infer", 1, 0, dict(loaders)
    runner.global_epoch_step = runner.global_batch_step = runner.global_sample_step = 0
    runner.epoch_metrics = {}
    runner._run_event("stage", runner._run_epochs, CancelStage)
    return runner
