"""A trained model out of the runner: ``runner.trace`` (TorchScript or ``torch.export``), the Catalyst 20.12 method
with no other home."""
import os
from dataclasses import replace

import torch

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
    saved = (runner.model, runner.engine, net.training,
             [p.requires_grad for p in net.parameters()], next(net.parameters(), torch.empty(0)).device)
    recorder = _Recorder(net)
    try:
        net.to(device).train(mode == "train")
        for p in net.parameters():
            p.requires_grad_(requires_grad)
        runner.model, runner.engine = recorder, replace(runner.engine, device=torch.device(device))
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
        runner.model, runner.engine = saved[0], saved[1]
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
