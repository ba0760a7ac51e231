"""Catalyst 22's precision / recall / F1 / support metric: per-class counts summed on the device (and across ranks),
Catalyst 22.04's formulas at loader end (its F1 has 1e-5 in the denominator), keys ``precision/_micro``,
``recall/_macro``, ``f1/_weighted`` and, with ``compute_per_class_metrics``, ``precision/class_00``...
"""
import logging

import numpy as np
import torch

from torchstage.metrics._inputs import _tensor
from torchstage.metrics.base import AdditiveStateMetric, Values

logger = logging.getLogger("torchstage")
_AVERAGES = ("_micro", "_macro", "_weighted")


def _ratio(hits: float, misses: float, zero_division: float) -> float:
    """Catalyst 22's precision (misses = false positives) or recall (false negatives), as it computes them."""
    if hits == 0 and misses == 0:
        return zero_division
    return 1 - misses / (hits + misses)


def _f1(precision: float, recall: float) -> float:
    return 2 * (precision * recall) / (precision + recall + 1e-5)


class PrecisionRecallF1SupportMetric(AdditiveStateMetric):
    """State ``[tp(C), fp(C), fn(C), support(C), samples, outputs neither 0 nor 1]``, C known from the first batch.

    - ``multilabel=False``: outputs ``(N, C)`` scores (the prediction is their argmax) or ``(N,)`` class
      indices, targets ``(N,)`` class indices;
    - ``multilabel=True``: outputs and 0/1 targets ``(N, C)``; as in Catalyst 22, a label counts as predicted
      only where the output equals 1 (threshold the scores first, e.g. with a BatchTransformCallback).
    """

    def __init__(self, num_classes=None, multilabel: bool = False, zero_division: float = 0,
                 compute_per_class_metrics: bool = False, prefix: str = "", suffix: str = ""):
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                        or num_classes < 1):
            raise ValueError(f"PrecisionRecallF1SupportCallback: num_classes must be a positive int or None (taken "
                             f"from the outputs), got {num_classes!r}")
        self.num_classes, self.multilabel, self.zero_division = num_classes, multilabel, zero_division
        self.per_class, self.suffix, self._warned = bool(compute_per_class_metrics), suffix or "", False
        self._state_size = 4 * (num_classes or 0) + 2  # else set by the first batch
        super().__init__(prefix or "")

    def _reset_state(self) -> None:
        super()._reset_state()
        self._classes = self.num_classes

    def _names(self) -> tuple:
        names = [f"{m}/{a}" for a in _AVERAGES for m in ("precision", "recall", "f1")]
        if self.per_class and self.num_classes:
            names += [f"{m}/class_{i:02d}" for m in ("precision", "recall", "f1", "support")
                      for i in range(self.num_classes)]
        return tuple(name + self.suffix for name in names)

    def _update(self, outputs, targets) -> None:
        owner = type(self).__name__
        outputs, targets = _tensor(outputs, "outputs", owner), _tensor(targets, "targets", owner)
        unread = None  # multi-label outputs that are neither 0 nor 1
        if self.multilabel:
            if outputs.ndim != 2 or targets.shape != outputs.shape:
                raise ValueError(f"Multilabel{owner}: expects outputs and 0/1 targets of the same shape (N, C), got "
                                 f"outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)}")
            predicted, actual = outputs == 1, targets == 1
            unread = ((outputs != 0) & ~predicted).sum()  # counted as not predicted, as Catalyst 22 does
        else:
            width = self._classes
            if outputs.ndim == targets.ndim + 1:
                width = width or outputs.shape[-1]
                outputs = outputs.argmax(dim=-1)
            if outputs.ndim != 1 or targets.shape != outputs.shape or outputs.is_floating_point():
                raise ValueError(f"{owner}: expects scores (N, C) or class indices (N,) and class-index targets (N,), "
                                 f"got outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)}")
            if width is None:
                raise ValueError(f"{owner}: outputs are class indices {tuple(outputs.shape)}; give num_classes=...")
            labels = torch.arange(width, device=outputs.device)
            predicted, actual = outputs[:, None] == labels, targets[:, None] == labels
        counts = torch.stack([(predicted & actual).sum(0), (predicted & ~actual).sum(0),
                              (~predicted & actual).sum(0), actual.sum(0)])
        if self._classes is None:
            self._classes = counts.shape[1]
        elif counts.shape[1] != self._classes:
            raise ValueError(f"{owner}: this batch has {counts.shape[1]} classes, earlier ones {self._classes}")
        self._state_size = 4 * self._classes + 2
        # made on the device (a fill, not a copy from host memory): no host sync per batch on a GPU
        seen = torch.full((), outputs.shape[0], dtype=counts.dtype, device=counts.device)
        extra = torch.stack([seen, counts.new_zeros(()) if unread is None else unread])
        self._add(torch.cat([counts.reshape(-1), extra]))

    def _sync(self, engine) -> None:
        if self.num_classes is None:  # the class count agreed first: a rank that saw no batch does not know it
            width = torch.tensor([float(self._classes or 0)], dtype=torch.float64, device=engine.device)
            self._classes = int(engine.all_reduce_(width, op="max").item()) or None
            self._state_size = 4 * (self._classes or 0) + 2
        super()._sync(engine)

    def _compute(self) -> Values:
        state = self._checked_state()
        counts = state.tolist()
        if counts[-2] == 0:
            raise self._empty_error()
        if counts[-1] and not self._warned:
            self._warned = True
            logger.warning("MultilabelPrecisionRecallF1SupportCallback: %d outputs were neither 0 nor 1; as in "
                           "Catalyst 22 only outputs equal to 1 count as predicted labels. Give it 0/1 predictions "
                           "(e.g. a BatchTransformCallback thresholding the scores)", int(counts[-1]))
        tp, fp, fn, support = np.asarray(counts[:-2], dtype=np.float64).reshape(4, -1)
        zd = self.zero_division
        precision = np.array([_ratio(t, f, zd) for t, f in zip(tp, fp)])
        recall = np.array([_ratio(t, f, zd) for t, f in zip(tp, fn)])
        f1 = np.array([_f1(p, r) for p, r in zip(precision, recall)])
        weight = support / support.sum()
        micro_p, micro_r = _ratio(tp.sum(), fp.sum(), zd), _ratio(tp.sum(), fn.sum(), zd)
        averages = {"_micro": (micro_p, micro_r, _f1(micro_p, micro_r)),
                    "_macro": (precision.mean(), recall.mean(), f1.mean()),
                    "_weighted": ((precision * weight).sum(), (recall * weight).sum(), (f1 * weight).sum())}
        values = {f"{m}/{a}": v for a, triple in averages.items()
                  for m, v in zip(("precision", "recall", "f1"), triple)}
        if self.per_class:
            for m, per in zip(("precision", "recall", "f1", "support"), (precision, recall, f1, support)):
                values.update({f"{m}/class_{i:02d}": v for i, v in enumerate(per)})
        device = state.device
        return {k + self.suffix: torch.tensor(float(v), dtype=torch.float64, device=device) for k, v in values.items()}
