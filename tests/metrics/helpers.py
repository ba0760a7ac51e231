"""Test data and first-principles references shared by the metric tests (plain numpy / Python loops)."""
import numpy as np
import torch

SIZES = (7, 32, 1, 19, 32, 9)  # uneven batches, one of a single sample


def batches(*tensors, sizes=SIZES):
    """Yield aligned slices of ``tensors`` in uneven batches of ``sizes``."""
    start = 0
    for size in sizes:
        yield tuple(t[start:start + size] for t in tensors)
        start += size


def multiclass_data(n=sum(SIZES), classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, classes, generator=g), torch.randint(0, classes, (n,), generator=g)


def binary_data(n=sum(SIZES), seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-3, 4, (n,), generator=g).float() if ties else torch.randn(n, generator=g)
    return scores, torch.randint(0, 2, (n,), generator=g)


def ref_topk_accuracy(scores, targets, k):
    s, t = np.asarray(scores), np.asarray(targets)
    return np.mean([t[i] in np.argsort(-s[i])[:k] for i in range(len(t))])


def ref_counts(pred, true, cls):
    tp = sum(1 for p, y in zip(pred, true) if p == cls and y == cls)
    return tp, sum(1 for p in pred if p == cls), sum(1 for y in true if y == cls)


def _div(a, b):
    return a / b if b else 0.0


def ref_prf(pred, true, classes, average):
    """Precision, recall, F1 from per-class counts; zero denominators give 0."""
    counts = [ref_counts(list(pred), list(true), c) for c in classes]
    if average == "micro":
        tp, pp, ap = (sum(c[i] for c in counts) for i in range(3))
        return _div(tp, pp), _div(tp, ap), _div(2 * tp, pp + ap)
    per = [(_div(tp, pp), _div(tp, ap), _div(2 * tp, pp + ap)) for tp, pp, ap in counts]
    return tuple(float(np.mean([p[i] for p in per])) for i in range(3))


def ref_auc(scores, positive):
    """Probability that a random positive outscores a random negative, ties counting one half."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(positive).astype(bool)
    pos, neg = s[y][:, None], s[~y][None, :]
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))


def values(metric):
    return {k: float(v) for k, v in metric.compute().items()}
