"""A runner's own event methods (``on_loader_end(self, runner)``...), run as Catalyst 22 runs them.

Catalyst's runner is itself a callback: its ``on_*_start`` methods run before the callbacks of that event and its
``on_*_end`` (and ``on_exception``) after them. Here a runner's start method runs right after the bookkeeping
callbacks (order ``Internal``: counters, train/eval mode, fresh ``batch_metrics``), which Catalyst's own base
methods did before a subclass's code; its end method runs after every callback below the ``Logging`` phase, so that
what it writes (``runner.loader_metrics[...] = ...``) reaches the loggers, as it reached Catalyst's own logging.
"""
from torchstage.callbacks.base import CallbackOrder

#: Events whose runner method runs before the callbacks (after the bookkeeping ones).
STARTS = frozenset({"on_experiment_start", "on_stage_start", "on_epoch_start", "on_loader_start", "on_batch_start"})


class RunnerHooks:
    """The no-op event methods of a runner, each an override point called with the runner itself (Catalyst 22's
    signature ``on_loader_end(self, runner)``); ``super().on_loader_end(runner)`` works in an override."""

    def on_experiment_start(self, runner): pass
    def on_stage_start(self, runner): pass
    def on_epoch_start(self, runner): pass
    def on_loader_start(self, runner): pass
    def on_batch_start(self, runner): pass
    def on_batch_end(self, runner): pass
    def on_loader_end(self, runner): pass
    def on_epoch_end(self, runner): pass
    def on_stage_end(self, runner): pass
    def on_experiment_end(self, runner): pass
    def on_exception(self, runner): pass


def overridden_hooks(runner) -> dict:
    """Event -> the runner's bound method, for each event method that ``runner``'s class overrides."""
    cls = type(runner)
    return {event: getattr(runner, event) for event in _EVENTS if getattr(cls, event) is not getattr(RunnerHooks, event)}


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


_EVENTS = tuple(name for name in vars(RunnerHooks) if name.startswith("on_"))
