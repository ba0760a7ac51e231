"""Under tensor parallelism each sample counts once: 4 real gloo processes in 2 tensor-parallel groups, the ranks of a
group holding the same samples, sync to what one process holds over all the samples (sums, counts, gathered rows)."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchstage import Engine
from torchstage.distributed.layout import MeshLayout
from torchstage.metrics import AUCMetric, AverageMetric
from torchstage.metrics.torchmetrics_sync import sync_metric_states
from tests.helpers import free_port

pytestmark = pytest.mark.distributed

WORLD, TENSOR = 4, 2


def _samples(group: int):
    """The samples of data-parallel group ``group`` (0 or 1): scores and labels of 10 and 7 samples."""
    g = torch.Generator().manual_seed(group)
    n = (10, 7)[group]
    return torch.randn(n, generator=g), torch.randint(0, 2, (n,), generator=g)


def _worker(rank, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        engine = Engine(device="cpu", rank=rank, world_size=WORLD,
                        layout=MeshLayout(shard=WORLD // TENSOR, tensor=TENSOR))
        scores, labels = _samples(engine.dp_rank)
        average, auc = AverageMetric(), AUCMetric()
        average.update(scores.mean(), len(scores))
        auc.update(scores, labels)
        for metric in (average, auc):
            metric.sync(engine)
        result = {"average_state": average._state.tolist(), "average": average.compute()["loss"].item(),
                  "auc_rows": auc._local().shape[0], "auc": auc.compute()["auc"].item()}
        try:
            from torchmetrics.aggregation import CatMetric, SumMetric
        except ImportError:  # the torchmetrics extra
            result["torchmetrics"] = None
        else:
            cat, total = CatMetric(), SumMetric()
            cat.update(scores)
            total.update(scores)
            for metric in (cat, total):
                sync_metric_states(metric, engine)
            result["torchmetrics"] = {"rows": sum(t.numel() for t in cat.value), "sum": float(total.sum_value),
                                      "updates": total._update_count}
        torch.save(result, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp-sync")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def test_sums_counts_and_gathered_rows_count_each_sample_once(ranks):
    pytest.importorskip("torchmetrics")
    scores = torch.cat([_samples(0)[0], _samples(1)[0]])
    labels = torch.cat([_samples(0)[1], _samples(1)[1]])
    one = AUCMetric()
    one.update(scores, labels)
    for rank, result in enumerate(ranks):
        assert result["average_state"][1] == 17, rank  # 10 + 7 samples, not twice that
        assert result["average"] == pytest.approx((_samples(0)[0].sum() + _samples(1)[0].sum()).item() / 17)
        assert result["auc_rows"] == 17 and result["auc"] == pytest.approx(one.compute()["auc"].item())
        assert result["torchmetrics"] == {"rows": 17, "sum": pytest.approx(scores.sum().item()), "updates": 2}
