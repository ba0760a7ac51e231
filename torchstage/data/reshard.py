"""A train loader's pass resumed by another number of processes: the epoch's order, the samples done, the rest
dealt out anew.

Under N processes torchstage deals an epoch's order out the way ``DistributedSampler`` does (the order padded
to a multiple of N, rank r taking items r, r + N, ...), so after k samples on each rank the first k x N items
of the order are done, whichever rank trained them. A resumed pass rebuilds that order (alone: the loader's
sampler replayed from the random state its pass started from), drops the done items and deals the rest out
to the new world, padded the same way. Each sample of the epoch is then trained once, apart from the padding.
"""
import math

import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler,
                              SequentialSampler)

from torchstage.data.resume import discard_persistent_iterator, filtered_batch_sampler
from torchstage.data.worker_start import started


def order_kind(loader):
    """``(shuffle, seed)`` of a loader whose pass this module can rebuild, else None: a map-style DataLoader
    batching torch's own index samplers (torchstage's ``DistributedSampler``, or a plain random or sequential
    sampler when one process reads everything)."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    if type(loader.batch_sampler) is not BatchSampler:
        return None
    sampler = loader.sampler
    if type(sampler) is DistributedSampler and not sampler.drop_last:
        return sampler.shuffle, sampler.seed
    if type(sampler) is SequentialSampler:
        return False, None
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        return True, None
    return None


def epoch_order(size: int, world: int, shuffle: bool, seed: int, epoch: int, loader_rng: dict = None) -> list:
    """The epoch's order of ``size`` samples as ``world`` processes were dealt it (padded to a multiple of
    ``world``); alone, a shuffled order is replayed from ``loader_rng``, the random state its pass started from."""
    if world > 1:
        shards = []
        for rank in range(world):
            sampler = DistributedSampler(range(size), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        return [shards[i % world][i // world] for i in range(len(shards[0]) * world)]
    if not shuffle:
        return list(range(size))
    return _replay_shuffle(size, loader_rng)


def _replay_shuffle(size: int, loader_rng: dict) -> list:
    """The order a shuffled DataLoader drew when its pass started from ``loader_rng``: a DataLoader over the
    indices, with the same generators, draws the same numbers in the same order (the iterator's base seed, then
    the sampler's); an iterator its persistent workers reused draws only the sampler's."""
    generators = loader_rng.get("generators", {})

    def generator(name):
        if name not in generators:
            return None
        made = torch.Generator()
        made.set_state(generators[name])
        return made
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(loader_rng["torch"])
        of_loader = generator("loader")
        of_sampler = generator("sampler") if "sampler" in generators else of_loader
        sampler = RandomSampler(range(size), generator=of_sampler)
        if not loader_rng.get("fresh_iterator", True):
            return list(sampler)
        return [int(index) for batch in DataLoader(range(size), sampler=sampler, generator=of_loader)
                for index in batch]


def dealt(items: list, world: int) -> list:
    """``items`` padded to a multiple of ``world`` as ``DistributedSampler`` pads (from their start): the order
    of the items that ``world`` processes are dealt, rank r taking items r, r + world, ..."""
    if world <= 1 or not items:
        return list(items)
    total = math.ceil(len(items) / world) * world
    return (items * math.ceil(total / len(items)))[:total]


def pass_order(base: dict, steps: list) -> list:
    """The order of an epoch's pass that was resumed ``steps`` times on other numbers of processes: the epoch's
    order (``base``: :func:`epoch_order`'s arguments), then for each ``(done, world)`` the items left after the
    first ``done``, dealt to ``world`` processes."""
    order = epoch_order(**base)
    for done, world in steps:
        order = dealt(order[done:], world)
    return order


def resume_shard(loader, indices: list, source=None):
    """``(iterator, batches)``: ``loader`` yielding the samples ``indices`` in batches of its own size, and how
    many of its batches that counts as done (so the pass ends at ``len(loader)``); ``source``: a function giving
    the pass filter of these batches (a rollback run's, see :func:`~torchstage.data.resume.filtered_batch_sampler`)."""
    original = loader.batch_sampler
    batches = BatchSampler(indices, original.batch_size, original.drop_last)
    done = max(0, len(original) - len(batches))
    if source is not None:
        discard_persistent_iterator(loader)
        source().first_position = done + 1

    def start():  # DataLoader refuses a plain assignment after __init__; a wrapper anew for each start of the workers
        object.__setattr__(loader, "batch_sampler", filtered_batch_sampler(batches, loader, source))
        try:
            return iter(loader)
        finally:
            object.__setattr__(loader, "batch_sampler", original)
    return started(loader, start), done
