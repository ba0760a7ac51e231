"""Real 2-process gloo runs: uneven shards synced must equal one process on the whole data."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchstage import Engine
from tests.helpers import free_port
from tests.metrics.helpers import batches, values
from tests.metrics.test_base import _cases

pytestmark = pytest.mark.distributed

N = 100
SHARDS = {"uneven": (37, 63), "one_rank_empty": (N, 0)}


def _data():
    """Every case's whole dataset as one list of per-sample-sliceable batches (same on every rank)."""
    torch.manual_seed(0)
    return {name: [make(1) for _ in range(N)] for name, (_, make) in _cases().items()}


def _feed(metric, samples):
    """Update with uneven batches of consecutive samples (a loss batch weights by its count)."""
    start, sizes = 0, [s for s in (5, 1, 11, 3, 20, 8) * 10]
    while start < len(samples):
        chunk = samples[start:start + sizes[0]]
        sizes.pop(0)
        start += len(chunk)
        if isinstance(chunk[0][1], int):  # (loss, count) pairs
            for value, count in chunk:
                metric.update(value, count)
        else:
            metric.update(*(torch.cat(parts) for parts in zip(*chunk)))


def _worker(rank, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        engine = Engine(device="cpu", rank=rank, world_size=2)
        data, results = _data(), {}
        for shard, (first, _) in SHARDS.items():
            lo, hi = (0, first) if rank == 0 else (first, N)
            for name, (metric, _) in _cases().items():
                _feed(metric, data[name][lo:hi])
                metric.sync(engine)
                results[shard, name] = values(metric)
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()



@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("shard", list(SHARDS))
@pytest.mark.parametrize("name", list(_cases()))
def test_synced_equals_single_process(ranks, shard, name):
    metric, _ = _cases()[name]
    _feed(metric, _data()[name])
    expected = values(metric)
    for r in range(2):
        assert ranks[r][shard, name] == pytest.approx(expected, abs=1e-6, nan_ok=True), f"rank {r}"
