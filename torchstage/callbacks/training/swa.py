"""Stochastic weight averaging: a uniform average of the weights from ``start`` on, BatchNorm statistics recomputed.

The averaged weights never saw a forward pass, so their BatchNorm running statistics are recomputed with one
pass over the training loader (as ``torch.optim.swa_utils.update_bn`` does) before they are evaluated or
applied, averaged across ranks. That pass runs under a saved and restored random state, so it changes
nothing else in the run.
"""
import torch

from torchstage.callbacks.training.weight_averaging import WeightAveragingCallback
from torchstage.rng import get_rng_state, set_rng_state


class SWACallback(WeightAveragingCallback):
    """``avg = mean of the weights after steps start+every, start+2*every, ...``; see :class:`EMACallback`.

    ``update_bn``: recompute BatchNorm statistics of the averaged weights with a pass over the first
    training loader before each evaluation and at the end (only if the model has BatchNorm layers).
    """

    name = "swa"

    def __init__(self, start: int = 0, every: int = 1, evaluate: bool = True, apply_on_end: bool = True,
                 update_bn: bool = True, model_key: str = None):
        super().__init__(start=start, every=every, evaluate=evaluate, apply_on_end=apply_on_end, model_key=model_key)
        self.update_bn = bool(update_bn)
        self._bn_at = None  # num_averaged when the statistics were last recomputed

    def weight(self, n: int) -> float:
        return 1.0 / n

    def _swap_in(self, runner) -> None:
        self._refresh_bn(runner)
        super()._swap_in(runner)

    def on_experiment_end(self, runner):
        if self.apply_on_end and self.num_averaged:
            self._refresh_bn(runner)
        super().on_experiment_end(runner)

    def _refresh_bn(self, runner) -> None:
        """Recompute the averaged model's BatchNorm statistics if its weights changed since the last time."""
        norms = [m for m in self.averaged.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        if not self.update_bn or not norms or self._bn_at == self.num_averaged:
            return
        loader = next((loader for key, loader in runner.loop.loaders.items() if key.startswith("train")), None)
        if loader is None:
            return
        self._bn_at = self.num_averaged
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the pass
        model, saved_state, was_training = runner.model, get_rng_state(), self.averaged.training
        runner.model = ({**model, self.model_key: self.averaged} if isinstance(model, dict) else self.averaged)
        self.averaged.train()
        try:
            with torch.no_grad():
                for batch in loader:
                    runner.predict_batch(runner.engine.to_device(batch))
        finally:
            runner.model = model
            self.averaged.train(was_training)
            set_rng_state(saved_state)
            for m, momentum in zip(norms, momenta):
                m.momentum = momentum
        engine = runner.engine
        if engine.is_distributed:  # each rank saw its shard: the mean of the ranks' statistics
            for m in norms:
                for buffer in (m.running_mean, m.running_var):
                    if buffer is not None:
                        engine.all_reduce_(buffer).div_(engine.world_size)
