"""Samplers that split data across processes: shuffled shards for training, exact shards for evaluation."""
import math

from torch.utils.data import DistributedSampler, IterableDataset, Sampler

from torchstage.distributed.engine import Engine


class StridedEvalSampler(Sampler):
    """Rank ``r`` of ``n`` gets indices ``r, r+n, ...`` with no padding, so each sample counts exactly once."""

    def __init__(self, dataset, num_replicas: int, rank: int):
        self.size, self.num_replicas, self.rank = len(dataset), num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.size, self.num_replicas))

    def __len__(self):
        return max(0, math.ceil((self.size - self.rank) / self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        """Evaluation order does not change between epochs."""


def make_sampler(dataset, engine: Engine, shuffle: bool, is_train: bool, seed: int = 0):
    """A sampler for ``dataset`` under ``engine`` (split by its data-parallel coordinate); ``None`` when every
    process reads everything (one process, or one tensor-parallel group)."""
    if engine.dp_size == 1 or isinstance(dataset, IterableDataset):
        return None
    if is_train:
        return DistributedSampler(dataset, num_replicas=engine.dp_size, rank=engine.dp_rank,
                                  shuffle=shuffle, seed=seed)
    return StridedEvalSampler(dataset, engine.dp_size, engine.dp_rank)

