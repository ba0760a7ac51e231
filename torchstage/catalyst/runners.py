"""``torchstage.Runner`` and ``torchstage.SupervisedRunner`` as Catalyst scripts meet them: the core runners (which
they stand for in ``isinstance``) with Catalyst 20.12's attribute names, ``_handle_batch`` and flat epoch-metric keys,
Catalyst 22's own event methods, and ``train()``'s Catalyst argument names (see :mod:`torchstage.catalyst.runner`)."""
import torch

from torchstage.callbacks.base import EVENTS
from torchstage.catalyst.core_types import StandsForCore
from torchstage.catalyst.own_hooks import RunnerHooks, overridden_hooks, with_runner_hooks
from torchstage.catalyst.runner import (CatalystAttributes, FlatEpochMetrics, catalyst_target_key,
                                        refuse_ignored_getters, translate_train_kwargs)
from torchstage.runner import runner, supervised


class Runner(runner.Runner, CatalystAttributes, RunnerHooks, metaclass=StandsForCore, core=runner.Runner):
    """The core :class:`~torchstage.runner.runner.Runner`, also read and written in Catalyst's spellings: a subclass
    may override ``_handle_batch(batch)`` (20.12) or the event methods (``on_loader_end(self, runner)``, run around
    the callbacks as in Catalyst 22: :mod:`torchstage.catalyst.own_hooks`)."""

    epoch_metrics_type = FlatEpochMetrics

    def __init__(self, model=None, engine=None, device=None):
        if isinstance(engine, (str, torch.device)):  # Catalyst 20.12's Runner(model, device)
            engine, device = None, engine
        super().__init__(model=model, engine=engine, device=device)

    def translate_train_kwargs(self, kwargs: dict) -> dict:
        """Catalyst 20.12's and 22's ``train()`` argument names translated (each noted once); a class overriding
        Catalyst 22's ``get_*`` methods, which ``train()`` would ignore, is refused."""
        refuse_ignored_getters(self)
        return translate_train_kwargs(kwargs)

    def chain_handlers(self, active: list) -> dict:
        """The callbacks' handlers, with this runner's own event methods where its class overrides them."""
        hooks = overridden_hooks(self)
        return {event: with_runner_hooks(event, active, hooks) for event in EVENTS}


class SupervisedRunner(supervised.SupervisedRunner, Runner, metaclass=StandsForCore, core=supervised.SupervisedRunner):
    """The core :class:`~torchstage.runner.supervised.SupervisedRunner` with Catalyst's spellings (see
    :class:`Runner`), also taking Catalyst 20.12's ``input_target_key=`` for ``target_key``."""

    def __init__(self, model=None, engine=None, input_key="features", output_key="logits",
                 target_key="targets", loss_key="loss", device=None, input_target_key=None):
        if input_target_key is not None:  # Catalyst 20.12's name
            target_key = catalyst_target_key(target_key, input_target_key)
        super().__init__(model=model, engine=engine, input_key=input_key, output_key=output_key,
                         target_key=target_key, loss_key=loss_key, device=device)
