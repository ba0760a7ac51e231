"""A loss per model output, plus regularizers, from a criterion given as a dict keyed by name.

``criterion={"logits": nn.CrossEntropyLoss(), "box": Loss(nn.L1Loss(), weight=0.5),
"sparsity": Regularizer(lambda embedding: embedding.abs().mean(), weight=1e-3)}``: each term is
logged as ``loss_<name>`` (unweighted) and their weighted sum is ``loss``.

Targets: by default the target of output ``name`` is ``batch[target_key][name]``, i.e. the
dataset yields ``(features, {"logits": y, "box": b})`` (or a dict batch whose ``"targets"`` is such
a dict); ``Loss(fn, target="box_targets")`` reads a batch key instead.
"""
import inspect
from dataclasses import dataclass
from typing import Callable, Optional

from torchstage.callbacks.training.criterion import CriterionCallback


@dataclass
class Loss:
    """``weight * fn(batch[output], target)``; ``output`` defaults to the dict key, ``target`` as above."""

    fn: Callable
    weight: float = 1.0
    target: Optional[str] = None
    output: Optional[str] = None


@dataclass
class Regularizer:
    """``weight * fn(**{p: batch[p]})`` for each parameter ``p`` of ``fn``: model outputs by keyword name."""

    fn: Callable
    weight: float = 1.0


def as_terms(criterion, where: str = "criterion") -> dict:
    """Name -> :class:`Loss` / :class:`Regularizer` for a dict criterion; TypeError naming a bad entry."""
    terms = {}
    for name, term in criterion.items():
        if not isinstance(term, (Loss, Regularizer)):
            if not callable(term):
                raise TypeError(f"{where}[{name!r}] must be a loss (callable), Loss(...) or Regularizer(...), "
                                f"got {type(term).__name__}")
            term = Loss(term)
        if not callable(term.fn):
            raise TypeError(f"{where}[{name!r}].fn must be callable, got {type(term.fn).__name__}")
        terms[str(name)] = term
    return terms


class OutputLossesCallback(CriterionCallback):
    """The criterion callback of :class:`~torchstage.SupervisedRunner`: a plain criterion works as in
    :class:`~torchstage.CriterionCallback`; a dict criterion gives one loss per output (see module doc).

    ``names`` (the dict keys, known from ``train()``) let ``valid_metric="loss_<name>"`` be checked
    before training.
    """

    def __init__(self, input_key: str = "logits", target_key: str = "targets", metric_key: str = "loss",
                 names=()):
        super().__init__(input_key=input_key, target_key=target_key, metric_key=metric_key)
        self.names = tuple(names)

    @property
    def produces(self):
        return (self.metric_key, *(f"{self.metric_key}_{name}" for name in self.names))

    def on_stage_start(self, runner):
        if not isinstance(runner.criterion, dict):
            self._terms = None
            return super().on_stage_start(runner)
        self._terms = as_terms(runner.criterion)
        self._params = {name: list(inspect.signature(t.fn).parameters)
                        for name, t in self._terms.items() if isinstance(t, Regularizer)}

    def on_batch_end(self, runner):
        if self._terms is None:
            return super().on_batch_end(runner)
        batch, metrics, total = runner.loop.batch, runner.loop.batch_metrics, 0
        with runner.autocast():
            for name, term in self._terms.items():
                if isinstance(term, Regularizer):
                    value = term.fn(**{p: _get(batch, p, name) for p in self._params[name]})
                else:
                    value = term.fn(_get(batch, term.output or name, name), self._target(batch, name, term))
                metrics[f"{self.metric_key}_{name}"] = value
                total = total + term.weight * value
        metrics[self.metric_key] = total

    def _target(self, batch, name, term):
        if term.target is not None:
            return _get(batch, term.target, name)
        targets = batch.get(self.target_key)
        if not isinstance(targets, dict) or name not in targets:
            raise KeyError(f"criterion[{name!r}] needs targets: yield batch[{self.target_key!r}] as a dict with "
                           f"key {name!r} (got {type(targets).__name__}"
                           f"{' with keys ' + str(sorted(targets)) if isinstance(targets, dict) else ''}), "
                           f"or use Loss(fn, target='<batch key>')")
        return targets[name]


def _get(batch, key, name):
    if key not in batch:
        raise KeyError(f"criterion[{name!r}] reads batch[{key!r}], which is not there; the batch has "
                       f"{sorted(batch)}")
    return batch[key]
