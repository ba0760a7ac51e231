"""Weight averaging: an exponential (EMA) or uniform (SWA) average of the weights, kept on the device.

The average is updated after each optimizer step with fused ``torch._foreach`` ops (no host sync, unlike
``AveragedModel.update_parameters``, which tests a tensor counter on the host). It is saved in
checkpoints, may replace the weights during validation (``evaluate=True``) and at the end of the run.
"""
import copy

import torch

from torchstage.callbacks.base import Callback, CallbackOrder


class WeightAveragingCallback(Callback):
    """Base class: ``weight(n)`` is the share of the new weights in the ``n``-th update (1-based).

    ``start``: train batches (optimizer steps) before averaging starts; ``every``: steps between updates.
    ``evaluate``: validation loaders see the averaged weights. ``apply_on_end``: the model keeps the
    averaged weights after the run. ``model_key``: which model of a dict of models is averaged.
    """

    order = CallbackOrder.Optimizer + 1  # right after the step

    def __init__(self, start: int = 0, every: int = 1, evaluate: bool = True, apply_on_end: bool = False,
                 model_key: str = None):
        name = type(self).__name__
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"{name}: start must be an integer >= 0 (optimizer steps before averaging), got {start!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"{name}: every must be an integer >= 1, got {every!r}")
        self.start, self.every, self.evaluate, self.apply_on_end = start, every, bool(evaluate), bool(apply_on_end)
        self.model_key = model_key
        self.averaged, self.num_averaged, self.steps = None, 0, 0
        self._stepped, self._hook, self._backup, self._loaded, self._engine = False, None, None, None, None

    def weight(self, n: int) -> float:
        raise NotImplementedError

    # ---- the model and its averaged copy -------------------------------------------------------
    def _model(self, runner) -> torch.nn.Module:
        model = runner.unwrapped_model
        if isinstance(model, dict):
            if self.model_key not in model:
                raise KeyError(f"{type(self).__name__}(model_key={self.model_key!r}): the run's models are "
                               f"{sorted(model)}; pass model_key=one of them")
            return model[self.model_key]
        return model

    @staticmethod
    def _tensors(module) -> list:
        return [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]

    def attach(self, shared) -> None:
        if self.evaluate:  # one callback at most swaps the model's weights for validation
            shared.claim("put their averaged weights into the model for validation",
                         "pass evaluate=False to all but one", self)

    def on_stage_start(self, runner):
        self._engine = runner.engine
        model = self._model(runner)
        if self.averaged is None:
            self.averaged = copy.deepcopy(model).requires_grad_(False)
            if self._loaded is not None:
                self.averaged.load_state_dict(self._loaded)
                self._loaded = None
        optimizer = runner.optimizer if not isinstance(runner.optimizer, dict) else list(runner.optimizer.values())
        if self._hook is not None:
            self._hook.remove()
        optimizers = optimizer if isinstance(optimizer, list) else [optimizer]
        hooks = [o.register_step_post_hook(self._on_step) for o in optimizers if o is not None]
        self._hook = _Hooks(hooks)

    def _on_step(self, optimizer, args, kwargs) -> None:
        self._stepped = True

    def on_batch_end(self, runner):
        if not (runner.loop.is_train_loader and self._stepped):
            return
        self._stepped = False
        self.steps += 1
        if self.steps <= self.start or (self.steps - self.start - 1) % self.every:
            return
        self.num_averaged += 1
        with torch.no_grad():
            current, averaged = self._tensors(self._model(runner)), self._tensors(self.averaged)
            torch._foreach_lerp_(averaged, current, self.weight(self.num_averaged))
            for avg, buf in zip(self.averaged.buffers(), self._model(runner).buffers()):
                if not buf.is_floating_point():
                    avg.copy_(buf)  # counters such as BatchNorm's num_batches_tracked

    # ---- evaluation with the averaged weights ------------------------------------------------------
    def on_loader_start(self, runner):
        if self.evaluate and not runner.loop.is_train_loader and self.num_averaged:
            self._swap_in(runner)

    def on_loader_end(self, runner):
        self._swap_out(runner)

    def on_exception(self, runner):
        self._swap_out(runner)

    def _sync_buffers(self) -> None:
        """Make the averaged floating buffers the mean over ranks; collective, called where every rank is.

        Under DDP each rank's BatchNorm statistics follow its own batches, so their averages differ;
        averaging is linear, so the mean over ranks equals the average of the ranks' mean.
        """
        engine = self._engine
        if engine is None or not engine.is_distributed or self.averaged is None:
            return
        with torch.no_grad():
            for buffer in self.averaged.buffers():
                if buffer.is_floating_point():
                    engine.all_reduce_(buffer).div_(engine.world_size)

    def _swap_in(self, runner) -> None:
        self._sync_buffers()
        with torch.no_grad():
            model = self._model(runner)
            self._backup = [t.detach().clone() for t in self._tensors(model)]
            torch._foreach_copy_(self._tensors(model), self._tensors(self.averaged))

    def _swap_out(self, runner) -> None:
        if self._backup is not None:
            with torch.no_grad():
                torch._foreach_copy_(self._tensors(self._model(runner)), self._backup)
            self._backup = None

    def on_experiment_end(self, runner):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._sync_buffers()
        if self.apply_on_end and self.num_averaged:
            with torch.no_grad():
                torch._foreach_copy_(self._tensors(self._model(runner)), self._tensors(self.averaged))

    # ---- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The averaged weights and counters; every rank calls it (a checkpoint), so buffers are synced here."""
        if self.averaged is None:
            return {}
        self._sync_buffers()
        return {"weights": self.averaged.state_dict(), "num_averaged": self.num_averaged, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.num_averaged, self.steps = state["num_averaged"], state["steps"]
        if self.averaged is not None:
            self.averaged.load_state_dict(state["weights"])
        else:
            self._loaded = state["weights"]


class EMACallback(WeightAveragingCallback):
    """Exponential moving average: ``avg = decay * avg + (1 - decay) * weights`` after each step.

    The first update copies the weights (``avg`` starts from the model at ``start``). Floating buffers
    (BatchNorm running statistics) are averaged the same way.
    """

    name = "ema"

    def __init__(self, decay: float = 0.999, start: int = 0, every: int = 1, evaluate: bool = True,
                 apply_on_end: bool = False, model_key: str = None):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise ValueError(f"EMACallback: decay must be a number in [0, 1), got {decay!r}")
        super().__init__(start=start, every=every, evaluate=evaluate, apply_on_end=apply_on_end, model_key=model_key)
        self.decay = float(decay)

    def weight(self, n: int) -> float:
        return 1.0 if n == 1 else 1.0 - self.decay


class _Hooks:
    """Several hook handles removed together."""

    def __init__(self, handles):
        self.handles = handles

    def remove(self):
        for handle in self.handles:
            handle.remove()
