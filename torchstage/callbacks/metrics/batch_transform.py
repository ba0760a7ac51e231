"""New batch entries from existing ones, e.g. ``scores = sigmoid(logits)`` for metrics that read probabilities."""
import difflib
import pkgutil
from functools import partial

from torchstage.callbacks.base import Callback, CallbackOrder

_SCOPES = ("on_batch_end", "on_batch_start")


def _keys(value, what: str):
    if value is None or isinstance(value, str):
        return None if value is None else [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(k, str) for k in value):
        return list(value)
    raise TypeError(f"BatchTransformCallback: {what} must be a str or a list of str (keys of runner.batch), "
                    f"got {value!r}")


def resolve_transform(transform):
    """``transform`` itself, or the function an import path such as ``"torch.sigmoid"`` names (a typo gets the
    closest names of its module)."""
    if not isinstance(transform, str):
        if not callable(transform):
            raise TypeError(f"BatchTransformCallback: transform must be callable or an import path such as "
                            f"'torch.sigmoid', got {transform!r}")
        return transform
    try:
        found = pkgutil.resolve_name(transform)
    except (ImportError, AttributeError, ValueError) as exc:
        module, _, name = transform.rpartition(".")
        try:
            close = difflib.get_close_matches(name, dir(pkgutil.resolve_name(module)), n=3) if module else []
        except (ImportError, AttributeError, ValueError):
            close = []
        hint = f"; did you mean {', '.join(repr(f'{module}.{c}') for c in close)}?" if close else ""
        raise ValueError(f"BatchTransformCallback(transform={transform!r}): cannot import {transform!r} "
                         f"({exc}){hint}") from None
    if not callable(found):
        raise TypeError(f"BatchTransformCallback(transform={transform!r}): that is a {type(found).__name__}, not a "
                        f"function")
    return found


class BatchTransformCallback(Callback):
    """Writes ``batch[output_key] = transform(batch[input_key])`` (several keys: ``transform(*inputs)`` returns one
    value per output key) at ``scope`` ``"on_batch_end"`` (after the model ran, before losses and metrics) or
    ``"on_batch_start"``. Without ``input_key`` the whole batch becomes ``transform(batch)``.

    ``transform`` is a callable or an import path (``"torch.sigmoid"``); ``transform_kwargs`` are bound to it.
    ``output_key`` defaults to ``input_key`` (replaced in place). Catalyst 22's signature.
    """

    order = CallbackOrder.Internal + 1  # after the loop's own bookkeeping, before the criterion and metrics

    def __init__(self, transform, scope: str, input_key=None, output_key=None, transform_kwargs: dict = None):
        transform = resolve_transform(transform)
        if transform_kwargs is not None:
            transform = partial(transform, **transform_kwargs)
        if scope not in _SCOPES:
            raise ValueError(f"BatchTransformCallback: scope must be one of {_SCOPES}, got {scope!r}")
        self.input_key, self.output_key = _keys(input_key, "input_key"), _keys(output_key, "output_key")
        if self.output_key is not None and self.input_key is None:
            raise TypeError("BatchTransformCallback: output_key needs input_key (the entries the transform reads)")
        self.output_key = self.output_key or self.input_key
        self._single = isinstance(output_key, str) or (output_key is None and isinstance(input_key, str))
        self.transform, self.event = transform, scope  # (Callback.scope says which ranks run it)

    def handles(self, event: str) -> bool:
        return event == self.event

    def _apply(self, runner) -> None:
        batch = runner.loop.batch
        if self.input_key is None:
            runner.loop.batch = self.transform(batch)
            return
        if not isinstance(batch, dict):
            raise TypeError(f"BatchTransformCallback(input_key={self.input_key}): runner.batch is a "
                            f"{type(batch).__name__}, not a dict of named entries")
        missing = [k for k in self.input_key if k not in batch]
        if missing:
            raise KeyError(f"BatchTransformCallback: runner.batch has no {missing}; it has {sorted(batch)}")
        outputs = self.transform(*(batch[k] for k in self.input_key))
        if self._single:
            outputs = (outputs,)
        elif not isinstance(outputs, (tuple, list)) or len(outputs) != len(self.output_key):
            raise TypeError(f"BatchTransformCallback(output_key={self.output_key}): the transform returned a "
                            f"{type(outputs).__name__}, expected a tuple or list of {len(self.output_key)} value(s), "
                            f"one per output key")
        batch.update(zip(self.output_key, outputs))

    def on_batch_start(self, runner):
        if self.event == "on_batch_start":
            self._apply(runner)

    def on_batch_end(self, runner):
        if self.event == "on_batch_end":
            self._apply(runner)
