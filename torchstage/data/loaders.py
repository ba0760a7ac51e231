"""User DataLoaders rebuilt for one rank: same options, each rank reading its own shard of the samples."""
import logging
import math
import sys

from torch.utils.data import (DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler,
                              SequentialSampler)

from torchstage.data.fork_check import KEEP_WORKERS_ENV, keeps_workers
from torchstage.data.samplers import StridedEvalSampler
from torchstage.rng import seeded
from torchstage.distributed.engine import Engine

logger = logging.getLogger("torchstage")


class ShardedSampler(Sampler):
    """Rank ``rank``'s share of another sampler's items (indices, or batches of a batch sampler).

    Every rank draws the wrapped sampler's full sequence under the same seed (``seed + epoch`` for
    python, numpy and torch's CPU generator, restored afterwards), so the ranks agree on it, then takes
    items ``rank, rank + n, ...``. With ``pad`` (training) the sequence is first extended cyclically to a
    multiple of ``n`` so every rank gets as many items (DDP needs equal step counts); without it
    (evaluation) each item is read exactly once.
    """

    def __init__(self, sampler, num_replicas: int, rank: int, seed: int = 0, pad: bool = True):
        self.sampler, self.num_replicas, self.rank = sampler, num_replicas, rank
        self.seed, self.pad, self.epoch = seed, pad, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        with seeded(self.seed + self.epoch):
            items = list(self.sampler)
        if self.pad and items:
            total = math.ceil(len(items) / self.num_replicas) * self.num_replicas
            items = (items * math.ceil(total / len(items)))[:total]
        return iter(items[self.rank::self.num_replicas])

    def __len__(self):
        size = len(self.sampler)
        if self.pad:
            return math.ceil(size / self.num_replicas) if size else 0
        return max(0, math.ceil((size - self.rank) / self.num_replicas))


def distribute_loaders(loaders, engine: Engine, seed: int = 0) -> dict:
    """Name -> loader for this rank; names starting with ``train`` are training loaders (padded shards)."""
    return {name: distribute_loader(loader, engine, name.startswith("train"), seed) for name, loader in loaders.items()}


def distribute_loader(loader, engine: Engine, is_train: bool, seed: int = 0):
    """``loader`` rebuilt with a sampler giving this rank its shard; keeps batch size and every option.

    Batch size stays per process. Data is split by the data-parallel coordinate (``engine.dp_rank`` of
    ``engine.dp_size``): the ranks of a tensor-parallel group get the same batches. A loader that is not a
    map-style DataLoader, or already has a distributed sampler, is returned unchanged (a warning says so for the
    former).
    """
    if engine.dp_size == 1:
        return loader
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        logger.warning("a %s loader is used as is on every rank: torchstage shards only DataLoaders over "
                       "map-style datasets; shard it by data-parallel rank yourself or each sample is read %d "
                       "times", type(loader).__name__ if not isinstance(loader, DataLoader) else "IterableDataset",
                       engine.dp_size)
        return loader
    if isinstance(loader.sampler, (DistributedSampler, StridedEvalSampler, ShardedSampler)):
        return loader
    options = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                   timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                   multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
                   persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device)
    # CPython gh-112275: a worker forked at each epoch beside gloo's threads may hang (a stateful loader's workers
    # carry its resumable state: left as the loader asked, and warned about before training)
    if keeps_workers(loader) and not hasattr(loader, "load_state_dict"):
        options["persistent_workers"] = True
        if engine.is_main:
            logger.warning("a DataLoader with num_workers=%d keeps its workers for the run (persistent_workers=True): "
                           "Python %s can hang a worker forked at each epoch beside torch.distributed's threads "
                           "(CPython gh-112275, fixed in 3.11.10 and 3.12); the workers keep their copy of the dataset "
                           "between epochs. %s=0 forks them at each epoch as the loader asked", loader.num_workers,
                           ".".join(map(str, sys.version_info[:3])), KEEP_WORKERS_ENV)
    if loader.num_workers > 0:
        options["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        options["in_order"] = loader.in_order
    world, rank = engine.dp_size, engine.dp_rank
    cls = type(loader) if hasattr(loader, "load_state_dict") else DataLoader  # keep a StatefulDataLoader stateful
    if loader.batch_size is None and loader.batch_sampler is not None:  # a custom batch sampler
        batches = ShardedSampler(loader.batch_sampler, world, rank, seed, pad=is_train)
        return cls(loader.dataset, batch_sampler=batches, **options)
    sampler = loader.sampler
    plain = type(sampler) is SequentialSampler or (
        type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None
        and sampler.generator is None)
    if plain and is_train:
        sampler = DistributedSampler(loader.dataset, world, rank, shuffle=type(sampler) is RandomSampler, seed=seed)
    elif plain:
        sampler = StridedEvalSampler(loader.dataset, world, rank)
    else:
        sampler = ShardedSampler(sampler, world, rank, seed, pad=is_train)
    return cls(loader.dataset, batch_size=loader.batch_size, sampler=sampler, drop_last=loader.drop_last, **options)
