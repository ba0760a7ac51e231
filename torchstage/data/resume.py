"""Starting a loader in the middle of its pass: the same order, the first batches skipped by index, never read.

A shuffled pass draws its order from random generators when it starts (the global torch RNG for a
RandomSampler without a generator, the DataLoader's or sampler's own generator otherwise). The runner
captures those states just before ``iter(loader)`` (:func:`capture_loader_rng`); a checkpoint keeps them,
and :func:`resume_iterator` replays the draws, drops the index batches already trained on and then puts
back the RNG state of the interrupted run, so the next batch, its augmentation and the model's dropout
draw exactly what they would have drawn.
"""
import logging
import math

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from torchstage.rng import set_rng_state

logger = logging.getLogger("torchstage")


def _generators(loader) -> list:
    """The explicit torch generators a loader's pass may draw from, by a stable name (deduplicated)."""
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    found, seen = [], set()
    for name, owner in (("loader", loader), ("sampler", sampler), ("batch_sampler.sampler", inner)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and id(generator) not in seen:
            seen.add(id(generator))
            found.append((name, generator))
    return found


def _reuses_iterator(loader) -> bool:
    """True when ``iter(loader)`` will reset a persistent-workers iterator instead of making a new one."""
    return (isinstance(loader, DataLoader) and loader.persistent_workers
            and getattr(loader, "_iterator", None) is not None)


def capture_loader_rng(loader) -> dict:
    """The random state a pass over ``loader`` starts from; call it just before ``iter(loader)``."""
    return {"torch": torch.get_rng_state(),
            "generators": {name: g.get_state() for name, g in _generators(loader)},
            "fresh_iterator": not _reuses_iterator(loader)}


def _apply_loader_rng(loader, state: dict) -> None:
    torch.set_rng_state(state["torch"])
    for name, generator in _generators(loader):
        if name in state["generators"]:
            generator.set_state(state["generators"][name])


class SkipBatches:
    """Index sampler wrapper: on its first pass, drop the first ``skip`` items and then set ``run_rng``.

    ``loader_rng`` (if given) is applied just before the wrapped sampler starts, for passes whose
    original draws happened there rather than at ``iter(loader)``. Later passes go straight through.
    """

    def __init__(self, inner, skip: int, loader, loader_rng, run_rng: dict):
        self.inner, self.skip, self.loader = inner, skip, loader
        self.loader_rng, self.run_rng, self.used = loader_rng, run_rng, False

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)  # sampler, batch_size, drop_last, set_epoch ... of the wrapped one

    def __iter__(self):
        if self.used:
            yield from self.inner
            return
        self.used = True
        if self.loader_rng is not None:
            _apply_loader_rng(self.loader, self.loader_rng)
        indices = iter(self.inner)
        for _ in range(self.skip):
            if next(indices, None) is None:
                break
        set_rng_state(self.run_rng)
        yield from indices


def resume_iterator(loader, skip: int, loader_rng: dict, run_rng: dict):
    """An iterator over ``loader`` yielding what the interrupted pass would have yielded after ``skip`` batches.

    ``loader_rng`` is what :func:`capture_loader_rng` returned when that pass started; ``run_rng`` is the
    :func:`~torchstage.rng.get_rng_state` of the run at the interruption. A map-style DataLoader skips by
    index without loading data; any other iterable is replayed and its first ``skip`` batches dropped.
    """
    if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        attr = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        original = getattr(loader, attr)
        fresh = loader_rng["fresh_iterator"]
        wrapper = SkipBatches(original, skip, loader, None if fresh else loader_rng, run_rng)
        if fresh:
            _apply_loader_rng(loader, loader_rng)
        object.__setattr__(loader, attr, wrapper)  # DataLoader refuses a plain assignment after __init__
        try:
            return iter(loader)
        finally:
            object.__setattr__(loader, attr, original)
    logger.info("resuming a %s mid-pass: reading and dropping its first %d batches (only map-style "
                "DataLoaders skip by index)", type(loader).__name__, skip)
    _apply_loader_rng(loader, loader_rng)
    batches = iter(loader)
    for _ in range(skip):
        if next(batches, _END) is _END:
            break
    set_rng_state(run_rng)
    return batches


_END = object()


def batch_size_changed(loader, batches: int, samples: int):
    """``(old, new)`` batch sizes when ``samples`` samples in ``batches`` full batches (a mid-epoch checkpoint's
    position) no longer fit ``loader``'s batches, else None; None too where the loader's batch size is unknown."""
    new = getattr(loader, "batch_size", None) if isinstance(loader, DataLoader) else None
    if not new or not batches:
        return None
    try:
        total = len(loader.batch_sampler.sampler)
    except (AttributeError, TypeError):
        total = None
    expected = batches * new if total is None else min(batches * new, total)
    return None if samples == expected else (samples / batches, new)


def skips_samples(loader) -> bool:
    """True for a loader that can start a pass after a number of samples (torch's BatchSampler over a sampler)."""
    return (isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)
            and type(loader.batch_sampler) is BatchSampler)


def resume_after_samples(loader, samples: int, loader_rng: dict, run_rng: dict):
    """``(iterator, batches)``: ``loader``'s pass from sample ``samples + 1`` on, batched with its batch size
    (the interrupted pass batched them otherwise), and how many of its batches that counts as done.

    The sampler's order is replayed as in :func:`resume_iterator` and its first ``samples`` indices dropped.
    """
    original = loader.batch_sampler
    fresh = loader_rng["fresh_iterator"]
    rest = SkipBatches(original.sampler, samples, loader, None if fresh else loader_rng, run_rng)
    remaining = max(0, len(original.sampler) - samples)
    left = remaining // original.batch_size if original.drop_last else math.ceil(remaining / original.batch_size)
    if fresh:
        _apply_loader_rng(loader, loader_rng)
    object.__setattr__(loader, "batch_sampler", BatchSampler(rest, original.batch_size, original.drop_last))
    try:
        return iter(loader), max(0, len(original) - left)
    finally:
        object.__setattr__(loader, "batch_sampler", original)