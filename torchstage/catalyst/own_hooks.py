"""A runner's own event methods (``on_loader_end(self, runner)``...), run as Catalyst 22 runs them.

Catalyst's runner is itself a callback: its ``on_*_start`` methods run before the callbacks of that event and its
``on_*_end`` (and ``on_exception``) after them. Here a runner's start method runs right after the bookkeeping
callbacks (order ``Internal``: counters, train/eval mode, fresh ``batch_metrics``), which Catalyst's own base
methods did before a subclass's code; its end method runs after every callback below the ``Logging`` phase, so that
what it writes (``runner.loader_metrics[...] = ...``) reaches the loggers, as it reached Catalyst's own logging.
"""
from torchstage.callbacks.base import CallbackOrder, EventMethods
from torchstage.logging_setup import note_alias

#: Events whose runner method runs before the callbacks (after the bookkeeping ones).
STARTS = frozenset({"on_experiment_start", "on_stage_start", "on_epoch_start", "on_loader_start", "on_batch_start"})


class RunnerHooks(EventMethods):
    """The no-op event methods of a runner, each an override point called with the runner itself (Catalyst 22's
    signature ``on_loader_end(self, runner)``); ``super().on_loader_end(runner)`` works in an override."""

    #: True where ``runner.batch_step`` has Catalyst 22's meaning (``dl.IRunner``), not torchstage's
    catalyst22_batch_step = False


def overridden_hooks(runner) -> dict:
    """Event -> the runner's bound method, for each event method that ``runner``'s class overrides.

    Such a runner is written in Catalyst's style, where ``runner.batch_step`` counted the batches of the whole run:
    a one-time note says that it is the batch within the loader here (``dl.IRunner`` keeps Catalyst 22's meaning).
    """
    cls = type(runner)
    hooks = {event: getattr(runner, event) for event in _EVENTS
             if getattr(cls, event) is not getattr(RunnerHooks, event)}
    if hooks and not cls.catalyst22_batch_step and not cls.__module__.startswith("torchstage."):
        note_alias("runner.batch_step in a runner with its own on_* methods (Catalyst 22: the batches of the whole "
                   "run)", "runner.loop.run_batch_step; runner.batch_step is the batch within the current loader",
                   version="22")
    return hooks


def with_runner_hooks(event: str, active: list, hooks: dict) -> list:
    """The handlers of ``event``: those of the ``active`` callbacks (in chain order), with the runner's own method
    inserted where Catalyst 22 runs it (see the module docstring)."""
    handlers = [getattr(cb, event) for cb in active if cb.handles(event)]
    own = hooks.get(event)
    if own is None:
        return handlers
    if event in STARTS:
        at = sum(1 for cb in active if cb.handles(event) and int(cb.order) <= CallbackOrder.Internal)
    else:
        at = sum(1 for cb in active if cb.handles(event) and int(cb.order) < CallbackOrder.Logging)
    return handlers[:at] + [own] + handlers[at:]


_EVENTS = tuple(name for name in vars(EventMethods) if name.startswith("on_"))
