"""Assembling the callback chain: defaults, then train-level, then stage-level callbacks, by name."""
import re
from collections.abc import Mapping

from torchstage.callbacks.base import Callback, CallbackScope


def callback_name(callback) -> str:
    """A callback's chain name: its ``name`` attribute, else its class name in snake case."""
    name = getattr(callback, "name", None)
    if name:
        return name
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", type(callback).__name__).lower()
    return snake[: -len("_callback")] if snake.endswith("_callback") else snake


def check_callbacks(callbacks, prefix: str = "") -> list:
    """``callbacks`` of ``train()``, a stage, ``infer`` or ``evaluate_loader``: None, a list of Callbacks or a dict
    name -> Callback (None there removes that default); raise TypeError naming the bad one. Returns ``(key,
    callback)`` pairs."""
    if callbacks is not None and not isinstance(callbacks, (list, tuple, Mapping)):
        raise TypeError(f"{prefix}callbacks must be a list or a dict name -> Callback, "
                        f"got {type(callbacks).__name__}")
    items = list(callbacks.items()) if isinstance(callbacks, Mapping) else list(enumerate(callbacks or ()))
    for key, callback in items:
        if not (isinstance(callback, Callback) or (callback is None and isinstance(callbacks, Mapping))):
            raise TypeError(f"{prefix}callbacks[{key!r}] must be a torchstage Callback, got "
                            f"{type(callback).__name__}")
    return items


def merge_chain(*layers) -> dict:
    """Ordered name -> callback; a later layer's name replaces an earlier one and ``None`` removes it.

    Callbacks given as a list are named by :func:`callback_name`; repeats within one list get ``_2``,
    ``_3``... The result is stably sorted by ``order``.
    """
    chain = {}
    for layer in layers:
        if not layer:
            continue
        if isinstance(layer, Mapping):
            items = list(layer.items())
        else:
            items, seen = [], {}
            for callback in layer:
                name = callback_name(callback)
                seen[name] = seen.get(name, 0) + 1
                items.append((name if seen[name] == 1 else f"{name}_{seen[name]}", callback))
        for name, callback in items:
            chain.pop(name, None)
            if callback is not None:
                chain[name] = callback
    return dict(sorted(chain.items(), key=lambda item: int(item[1].order)))


#: How the start-of-run listing names where a callback runs (nothing for every rank).
_WHERE = {CallbackScope.Main: " (main rank only)", CallbackScope.Distributed: " (every rank, several processes only)"}


def describe_chain(chain: dict) -> str:
    """One line per callback: order, name, class and scope, for the start-of-run log."""
    return "\n".join(f"  {int(cb.order):>4}  {name:<16} {type(cb).__name__}{_WHERE.get(CallbackScope(cb.scope), '')}"
                     for name, cb in chain.items())
