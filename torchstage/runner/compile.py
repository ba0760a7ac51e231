"""``train(compile=...)``: ``torch.compile`` on each placed model."""
import torch

from torchstage.one_or_many import map_named


def compile_models(runner, compile) -> None:
    """``compile=True`` (or a dict of torch.compile arguments): compile each placed model."""
    if not compile:
        return
    kwargs = {} if compile is True else dict(compile)
    runner.model = map_named(lambda model: torch.compile(model, **kwargs), runner.model)
