import pytest
import torch

from torchstage import Engine
from torchstage.metrics import (AccuracyMetric, AUCMetric, AverageMetric, FunctionalMetric, Metric,
                                PrecisionRecallF1Metric)
from tests.metrics.helpers import values
from torchstage.catalyst.classification22 import PrecisionRecallF1SupportMetric


def _cases(device="cpu"):
    """(metric, make_batch) for every metric and input mode; batches are on ``device``."""
    g = torch.Generator().manual_seed(0)

    def mc(n):
        return torch.randn(n, 5, generator=g).to(device), torch.randint(0, 5, (n,), generator=g).to(device)

    def bi(n):
        return torch.randn(n, generator=g).to(device), torch.randint(0, 2, (n,), generator=g).to(device)

    def ml(n):
        return torch.randn(n, 3, generator=g).to(device), torch.randint(0, 2, (n, 3), generator=g).to(device)

    def ml01(n):  # 0/1 predictions, as Catalyst 22's multi-label metric reads them
        preds = torch.randint(0, 2, (n, 3), generator=g).float()
        return preds.to(device), torch.randint(0, 2, (n, 3), generator=g).to(device)

    def loss(n):
        return torch.rand((), generator=g).to(device), n

    def mse(o, t):
        return ((torch.sigmoid(o) - t) ** 2).mean()

    return {
        "average": (AverageMetric(), loss),
        "functional": (FunctionalMetric(mse, "mse"), bi),
        "accuracy_multiclass": (AccuracyMetric(topk=(1, 3)), mc),
        "accuracy_binary": (AccuracyMetric(), bi),
        "prf_binary": (PrecisionRecallF1Metric(), bi),
        "prf_macro": (PrecisionRecallF1Metric(num_classes=5), mc),
        "prf_micro": (PrecisionRecallF1Metric(num_classes=5, average="micro"), mc),
        "auc_binary": (AUCMetric(), bi),
        "auc_multilabel": (AUCMetric(), ml),
        "auc_multiclass": (AUCMetric(), mc),
        "prf22_multiclass": (PrecisionRecallF1SupportMetric(), mc),  # (support, a count, would double in a twin sync)
        "prf22_multilabel": (PrecisionRecallF1SupportMetric(3, multilabel=True), ml01),
    }


HOST_SYNCS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__")


def test_no_host_sync_in_50_updates(monkeypatch):
    cases = _cases()
    batches = {name: [make(1 + (i * 7) % 13) for i in range(50)] for name, (_, make) in cases.items()}
    calls = []
    for attr in HOST_SYNCS:
        original = getattr(torch.Tensor, attr)
        monkeypatch.setattr(torch.Tensor, attr, lambda self, *a, _n=attr, _f=original, **k: (calls.append(_n),
                                                                                              _f(self, *a, **k))[1])
    for name, (metric, _) in cases.items():
        for batch in batches[name]:
            metric.update(*batch)
        assert not calls, f"{name}: host sync via Tensor.{calls[0]} during update"
    monkeypatch.undo()
    for metric, _ in cases.values():
        assert all(torch.isfinite(v) for v in metric.compute().values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_no_cuda_sync_in_updates():
    cases = _cases("cuda")
    batches = {name: [make(1 + (i * 7) % 13) for i in range(50)] for name, (_, make) in cases.items()}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for name, (metric, _) in cases.items():
            for batch in batches[name]:
                metric.update(*batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for metric, _ in cases.values():
        assert all(v.is_cuda for v in metric.compute().values())


class _TwinEngine:
    """A fake world of two identical ranks: sums double, gathers repeat."""

    is_distributed, device = True, torch.device("cpu")

    def all_reduce_(self, tensor, op="sum"):
        return tensor.mul_(2) if op == "sum" else tensor

    def all_gather_cat(self, tensor):
        return torch.cat([tensor, tensor])

    def all_reduce_samples_(self, tensor):  # no tensor parallelism: each rank's samples are its own
        return self.all_reduce_(tensor)

    def all_gather_samples(self, tensor):
        return self.all_gather_cat(tensor)


@pytest.mark.parametrize("name", list(_cases()))
def test_lifecycle_sync_is_idempotent_and_update_after_sync_raises(name):
    metric, make = _cases()[name]
    for n in (3, 8, 1):
        metric.update(*make(n))
    before = values(metric)
    metric.sync(_TwinEngine())
    metric.sync(_TwinEngine())  # no-op: the state is already global
    assert values(metric) == pytest.approx(before, abs=1e-12, nan_ok=True)
    with pytest.raises(RuntimeError, match="after sync"):
        metric.update(*make(2))
    metric.reset()
    with pytest.raises(ValueError, match="no samples"):
        metric.compute()
    metric.update(*make(4))
    metric.sync(Engine(device="cpu"))  # one process: nothing to reduce
    assert set(values(metric)) == set(before)


@pytest.mark.parametrize("name", list(_cases()))
def test_empty_rank_joins_sync(name):
    metric, _ = _cases()[name]
    metric.sync(_TwinEngine())  # no update on this rank: still takes part, then has nothing to compute
    with pytest.raises(ValueError, match="no samples"):
        metric.compute()


def test_base_class_contract():
    assert issubclass(AverageMetric, Metric) and issubclass(AUCMetric, Metric)
    with pytest.raises(TypeError):
        Metric()
    with pytest.raises(TypeError, match="prefix"):
        AccuracyMetric(prefix=None)
    assert AccuracyMetric(prefix="train/").prefix == "train/"
