"""A model summary at the start of a run: parameters, trainable ones and size, in total and per top-level child."""
import logging
import os

import torch

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope
from torchstage.callbacks.loggers.logger_base import log_artifact
from torchstage.files.atomic import write_atomic

logger = logging.getLogger("torchstage")


def summarize(model: torch.nn.Module) -> list:
    """Rows ``(name, type, parameters, trainable, megabytes)``: one per top-level child, then the total.

    Sizes count parameters and buffers; parameters shared between children count once, in the total."""
    rows = [_row(name, child) for name, child in model.named_children()]
    own = [p for p in model.parameters(recurse=False)]
    if own:
        rows.append(("(own parameters)", "", sum(_numel(p) for p in own),
                     sum(_numel(p) for p in own if p.requires_grad), sum(_bytes(p) for p in own) / 2**20))
    rows.append(_row("total", model))
    return rows


def _row(name, module):
    params = list(module.parameters())
    tensors = params + list(module.buffers())
    return (name, type(module).__name__, sum(_numel(p) for p in params),
            sum(_numel(p) for p in params if p.requires_grad), sum(_bytes(t) for t in tensors) / 2**20)


def _numel(tensor) -> int:
    """Its number of values; a ZeRO-3 parameter holds a shard of them, and says the whole in ``ds_numel``."""
    return getattr(tensor, "ds_numel", None) or tensor.numel()


def _bytes(tensor) -> int:
    return _numel(tensor) * tensor.element_size()


def format_summary(rows: list, title: str = "model") -> str:
    """A plain-text table of :func:`summarize` rows."""
    header = ("name", "type", "params", "trainable", "size MB")
    lines = [header] + [(n, t, f"{p:,}", f"{tr:,}", f"{mb:.3f}") for n, t, p, tr, mb in rows]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = [f"{title}:"]
    for i, line in enumerate(lines):
        cells = [str(c).ljust(w) if j < 2 else str(c).rjust(w) for j, (c, w) in enumerate(zip(line, widths))]
        text.append("  " + "  ".join(cells).rstrip())
        if i == 0 or i == len(lines) - 2:
            text.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(text) + "\n"


class ModelSummary(Callback):
    """Writes ``logdir/model_summary.txt`` (and sends it to the loggers) and, with ``verbose``, logs it."""

    order = CallbackOrder.Logging + 1  # after the loggers opened their runs
    scope = CallbackScope.Main
    name = "model_summary"

    def __init__(self, verbose: bool = True, logdir: str = None):
        self.verbose, self.logdir = verbose, logdir

    def on_experiment_start(self, runner):
        models = runner.unwrapped_model
        models = models if isinstance(models, dict) else {"model": models}
        text = "".join(format_summary(summarize(model), name) for name, model in models.items())
        if self.verbose:
            logger.info("%s", text.rstrip())
        logdir = self.logdir or runner.spec.logdir
        if logdir is not None:
            path = os.path.join(logdir, "model_summary.txt")
            write_atomic(path, text.encode(), durable=False)
            log_artifact(runner, path, "summary")
