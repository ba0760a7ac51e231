"""ROC AUC, exact: keeps every score and target, gathers them across ranks, ranks them with ties averaged."""
from typing import List, Optional, Sequence

import torch

from torchstage.metrics._inputs import _tensor
from torchstage.metrics.base import Metric, Values


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Exact binary ROC AUC of 1-d ``scores`` against bool ``positive`` (ties count one half).

    Equals sklearn's ``roc_auc_score`` (trapezoids over distinct thresholds) via the Mann-Whitney
    statistic with average ranks. NaN when only one class is present. Runs on the scores' device.
    """
    scores = scores.to(torch.float64)
    order = torch.argsort(scores)
    _, inverse, counts = torch.unique_consecutive(scores[order], return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    ranks = ((2 * ends - counts + 1) / 2)[inverse]  # 1-based average rank of each sorted score
    pos = positive[order].to(torch.float64)
    n_pos, n_neg = pos.sum(), (1 - pos).sum()
    u = (ranks * pos).sum() - n_pos * (n_pos + 1) / 2
    return torch.where((n_pos > 0) & (n_neg > 0), u / (n_pos * n_neg).clamp_min(1), torch.nan)


class AUCMetric(Metric):
    """ROC AUC per column of the scores, exact over the whole loader (and all ranks after ``sync``).

    Inputs (scores used as given: AUC only depends on their order, so logits and probabilities agree):
    - binary: outputs ``(N,)``/``(N, 1)``, targets 0/1 of the same shape -> key ``prefix + "auc"``;
    - multi-label: outputs ``(N, C)``, targets 0/1 ``(N, C)``;
    - multi-class one-vs-rest: outputs ``(N, C)``, targets ``(N,)`` class indices (one-hot internally).
    With C > 1 columns the keys are ``prefix + "auc/<name>"`` per column (``class_names`` or the column
    index) plus ``prefix + "auc"``, the macro mean over the columns where AUC is defined, if ``average="macro"``.
    A column whose targets are all one class has AUC NaN (sklearn raises there); the mean skips it.
    """

    def __init__(self, average: Optional[str] = "macro", class_names: Optional[Sequence[str]] = None,
                 prefix: str = ""):
        if average not in ("macro", None):
            raise ValueError(f"AUCMetric: average must be 'macro' or None, got {average!r}")
        self.average = average
        self.class_names = None if class_names is None else [str(c) for c in class_names]
        super().__init__(prefix)

    def _reset_state(self) -> None:
        self._chunks: List[torch.Tensor] = []  # each (n, 2C) float64: scores then 0/1 targets
        self._gathered: Optional[torch.Tensor] = None

    def state_dict(self) -> dict:
        return {"chunks": self._local().detach().cpu()} if self._chunks else {}

    def load_state_dict(self, state: dict) -> None:
        self.reset()
        if "chunks" in state:
            self._chunks = [state["chunks"].clone()]

    def merge_state_dicts(self, states: list) -> dict:
        parts = [state["chunks"] for state in states if "chunks" in state]
        return {"chunks": torch.cat(parts)} if parts else {}

    def _update(self, outputs, targets) -> None:
        owner = "AUCMetric"
        outputs, targets = _tensor(outputs, "outputs", owner), _tensor(targets, "targets", owner)
        scores = outputs[:, None] if outputs.ndim == 1 else outputs
        if scores.ndim == 2 and targets.ndim == 1 and targets.shape[0] == scores.shape[0]:
            if scores.shape[1] > 1 and not (targets.is_floating_point() or targets.dtype == torch.bool):
                targets = torch.zeros(scores.shape, dtype=torch.float64, device=scores.device).scatter_(
                    1, targets[:, None].long(), 1.0)  # class indices -> one-hot, one-vs-rest
            else:
                targets = targets[:, None]
        if scores.ndim != 2 or targets.shape != scores.shape:
            raise ValueError(f"{owner}: expects outputs (N,)/(N, C) with targets of the same shape (0/1) or "
                             f"class indices (N,), got outputs {tuple(outputs.shape)} and targets "
                             f"{tuple(targets.shape)}")
        width = self._width()
        if width is not None and scores.shape[1] != width:
            raise ValueError(f"{owner}: outputs {tuple(outputs.shape)} have {scores.shape[1]} columns, "
                             f"earlier batches had {width}")
        self._chunks.append(torch.cat([scores.to(torch.float64), (targets == 1).to(torch.float64)], dim=1))

    def _width(self) -> Optional[int]:
        return self._chunks[0].shape[1] // 2 if self._chunks else None

    def _local(self, device=None) -> torch.Tensor:
        if self._gathered is not None:
            return self._gathered
        if not self._chunks:
            return torch.zeros((0, 0), dtype=torch.float64, device=device)
        return torch.cat(self._chunks) if len(self._chunks) > 1 else self._chunks[0]

    def _sync(self, engine) -> None:
        local = self._local(engine.device).to(engine.device)
        width = torch.tensor([local.shape[1], -local.shape[1]], device=engine.device)
        engine.all_reduce_(width, op="max")  # max and -min of the column count in one collective
        widest, narrowest = int(width[0]), -int(width[1])
        if local.shape[1] == 0:
            local = local.new_zeros((0, widest))
        elif narrowest != widest and narrowest > 0:
            raise ValueError(f"AUCMetric.sync: ranks hold different numbers of columns ({narrowest} vs {widest})")
        self._chunks, self._gathered = [], engine.all_gather_samples(local.contiguous())

    def _names(self) -> tuple:
        return ("auc",) if self.average == "macro" else ()

    def _compute(self) -> Values:
        data = self._local()
        if data.shape[0] == 0:
            raise self._empty_error()
        width = data.shape[1] // 2
        aucs = torch.stack([roc_auc(data[:, c], data[:, width + c] == 1) for c in range(width)])
        if width == 1:
            return {"auc": aucs[0]}
        names = self.class_names or [str(c) for c in range(width)]
        if len(names) != width:
            raise ValueError(f"AUCMetric: {len(names)} class_names for {width} columns")
        values = {f"auc/{name}": auc for name, auc in zip(names, aucs)}
        if self.average == "macro":
            values["auc"] = aucs.nanmean()
        return values
