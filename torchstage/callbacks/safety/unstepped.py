"""An optimizer given to ``train()`` that nothing steps trains nothing: refused at the end of the first train
loader, naming the fix, instead of a run that ends with exit 0 and its weights unchanged.

The runner adds this check only for the optimizers of a stage that no callback of its chain declares to step
(a custom ``handle_batch`` that should step them itself). A step post hook on each counts its steps during the
first train loader of the stage (no host sync, removed at the loader's end); an optimizer that was not stepped
once, and whose parameters hold no gradient a grad scaler may have skipped, ends the run.
"""
from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.one_or_many import named


class UnsteppedOptimizerError(ValueError):
    """An optimizer given to train() was never stepped in the first train loader: the run would change nothing."""


FIX = ("step it: in handle_batch call self.engine.backward(loss) and then optimizer.step() and optimizer.zero_grad() "
       "(as Catalyst 22 runners do), or add the stepping callbacks: train(..., callbacks=[BackwardCallback(), "
       "OptimizerCallback()]) for a handle_batch that writes self.batch_metrics['loss'] (or use SupervisedRunner); "
       "an optimizer it should not step is not given to train()")


class UnsteppedOptimizerCheck(Callback):
    """Ends the run when one of ``names`` (the stage's optimizers no callback steps) was not stepped in the first
    train loader of the stage."""

    order = CallbackOrder.External

    def __init__(self, names):
        self.names = tuple(names)
        self._hooks, self._steps, self._done = [], {}, False

    def on_stage_start(self, runner):
        self._remove()
        self._done, self._steps = False, {}
        for name, optimizer in named(runner.optimizer, "optimizer").items():
            if name in self.names and hasattr(optimizer, "register_step_post_hook"):
                self._steps[name] = 0
                self._hooks.append(optimizer.register_step_post_hook(self._counter(name)))

    def _counter(self, name):
        def count(optimizer, args, kwargs):
            self._steps[name] += 1
        return count

    def on_loader_end(self, runner):
        if self._done or not runner.loop.is_train_loader:
            return
        self._done = True
        self._remove()
        optimizers = named(runner.optimizer, "optimizer")
        scaler = getattr(getattr(runner.strategy, "precision", None), "scaler", None)
        for name, steps in self._steps.items():
            optimizer = optimizers.get(name)
            if steps or optimizer is None or (scaler is not None and _has_gradients(optimizer)):
                continue  # a grad scaler may have skipped every step of a short loader on inf gradients
            which = "the optimizer" if name == "optimizer" and len(optimizers) == 1 else f"the optimizer {name!r}"
            batches = f" ({runner.loop.batch_step} batches)" if runner.loop.batch_step else ""
            raise UnsteppedOptimizerError(
                f"{which} given to train() ({type(optimizer).__name__}) was not stepped in the first train loader "
                f"{runner.loop.loader_key!r}{batches}, and no callback of the chain steps it: training changes nothing. "
                f"To train, {FIX}")

    def on_stage_end(self, runner):
        self._remove()

    def on_exception(self, runner):
        self._remove()

    def _remove(self):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def _has_gradients(optimizer) -> bool:
    return any(p.grad is not None for group in optimizer.param_groups for p in group["params"])
