"""Starting a loader in the middle of its pass: the same order, the first batches skipped by index, never read.

A shuffled pass draws its order from random generators when it starts (the global torch RNG for a
RandomSampler without a generator, the DataLoader's or sampler's own generator otherwise). The runner
captures those states just before ``iter(loader)`` (:func:`~torchstage.data.loader_rng.capture_loader_rng`); a
checkpoint keeps them, and :func:`resume_iterator` replays the draws, drops the index batches already trained on
and then puts back the RNG state of the interrupted run, so the next batch, its augmentation and the model's
dropout draw exactly what they would have drawn. A resumed pass starts its workers through
:func:`~torchstage.data.worker_start.started`, as a new pass does.
"""
import logging
import math

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from torchstage.data.loader_rng import apply_loader_rng
from torchstage.data.worker_start import started
from torchstage.rng import set_rng_state

logger = logging.getLogger("torchstage")


class SkipBatches:
    """Index sampler wrapper: on its first pass, drop the first ``skip`` items and then set ``run_rng`` (if given).

    ``loader_rng`` (if given) is applied just before the wrapped sampler starts, for passes whose
    original draws happened there rather than at ``iter(loader)``. Later passes go straight through.
    ``source`` (a rollback run's): a function giving the :class:`~torchstage.data.skips.PassFilter` of the pass
    starting, asked on every pass, the first included (a persistent-workers iterator keeps this wrapper).
    """

    def __init__(self, inner, skip: int, loader, loader_rng, run_rng, source=None):
        self.inner, self.skip, self.loader = inner, skip, loader
        self.loader_rng, self.run_rng, self.used, self.source = loader_rng, run_rng, False, source

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)  # sampler, batch_size, drop_last, set_epoch ... of the wrapped one

    def __iter__(self):
        pass_filter = self.source() if self.source is not None else None
        if self.used:
            yield from self.inner if pass_filter is None else pass_filter.apply(self.inner, indexed=True)
            return
        self.used = True
        if self.loader_rng is not None:
            apply_loader_rng(self.loader, self.loader_rng)
        indices = iter(self.inner)
        if pass_filter is not None:
            indices = pass_filter.apply(indices, indexed=True)
        for _ in range(self.skip):
            if next(indices, None) is None:
                break
        if self.run_rng is not None:
            set_rng_state(self.run_rng)
        yield from indices


def resume_iterator(loader, skip: int, loader_rng: dict, run_rng: dict, source=None):
    """An iterator over ``loader`` yielding what the interrupted pass would have yielded after ``skip`` batches.

    ``loader_rng`` is what :func:`~torchstage.data.loader_rng.capture_loader_rng` returned when that pass started;
    ``run_rng`` is the :func:`~torchstage.rng.get_rng_state` of the run at the interruption. A map-style DataLoader
    skips by index without loading data; any other iterable is replayed and its first ``skip`` batches dropped.
    ``source``: a function giving the pass's :class:`~torchstage.data.skips.PassFilter` (a rollback run's); the
    ``skip`` batches are counted after the filter.
    """
    if _by_index(loader):
        if source is not None:
            discard_persistent_iterator(loader)  # a kept iterator keeps its own sampler: no skipping there
        attr = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        original = getattr(loader, attr)
        fresh = loader_rng["fresh_iterator"]
        if fresh:
            apply_loader_rng(loader, loader_rng)
        return started(loader, lambda: _iterate_with(loader, attr, SkipBatches(
            original, skip, loader, None if fresh else loader_rng, run_rng, source)))
    logger.info("resuming a %s mid-pass: reading and dropping its first %d batches (only map-style "
                "DataLoaders skip by index)", type(loader).__name__, skip)
    apply_loader_rng(loader, loader_rng)
    batches = started(loader)
    pass_filter = source() if source is not None else None
    if pass_filter is not None:
        batches = pass_filter.apply(batches, indexed=False)
    for _ in range(skip):
        if next(batches, _END) is _END:
            break
    set_rng_state(run_rng)
    return batches


def filtered_pass(loader, source):
    """A new pass over ``loader`` through the pass filter ``source()`` gives (the batches of its skip list left
    out, what it draws recorded): by index for a map-style DataLoader (never read), else read and dropped."""
    if not _by_index(loader):
        return source().apply(started(loader), indexed=False)
    attr = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    original = getattr(loader, attr)
    return started(loader, lambda: _iterate_with(loader, attr, SkipBatches(original, 0, loader, None, None, source)))


def filtered_batch_sampler(batches, loader, source):
    """``batches`` (a batch sampler made for a resumed pass) seen through the pass filter ``source()`` gives."""
    return batches if source is None else SkipBatches(batches, 0, loader, None, None, source)


def discard_persistent_iterator(loader, unless_filtered: bool = False) -> None:
    """End the kept iterator of a persistent-workers DataLoader (it keeps the sampler it was made with), so that the
    next ``iter(loader)`` makes one drawing from the sampler given then; ``unless_filtered``: keep one that asks
    the pass filter of each pass already."""
    iterator = getattr(loader, "_iterator", None) if isinstance(loader, DataLoader) else None
    if iterator is None:
        return
    kept = getattr(iterator, "_index_sampler", None)
    if unless_filtered and isinstance(kept, SkipBatches) and kept.source is not None:
        return
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    loader._iterator = None


def _by_index(loader) -> bool:
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def _iterate_with(loader, attr: str, sampler):
    """``iter(loader)`` with ``sampler`` as its ``attr`` (``batch_sampler`` or ``sampler``) for this pass."""
    original = getattr(loader, attr)
    object.__setattr__(loader, attr, sampler)  # DataLoader refuses a plain assignment after __init__
    try:
        return iter(loader)
    finally:
        object.__setattr__(loader, attr, original)


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


def resume_after_samples(loader, samples: int, loader_rng: dict, run_rng: dict, source=None):
    """``(iterator, batches)``: ``loader``'s pass from sample ``samples + 1`` on, batched with its batch size
    (the interrupted pass batched them otherwise), and how many of its batches that counts as done.

    The sampler's order is replayed as in :func:`resume_iterator` and its first ``samples`` indices dropped;
    ``source``: as for :func:`resume_iterator`, the filter of these batches.
    """
    original = loader.batch_sampler
    fresh = loader_rng["fresh_iterator"]
    remaining = max(0, len(original.sampler) - samples)
    left = remaining // original.batch_size if original.drop_last else math.ceil(remaining / original.batch_size)
    done = max(0, len(original) - left)
    if source is not None:
        discard_persistent_iterator(loader)
        source().first_position = done + 1
    if fresh:
        apply_loader_rng(loader, loader_rng)

    def batches():  # made anew for each start of the workers (a sampler wrapper skips on its first pass only)
        rest = SkipBatches(original.sampler, samples, loader, None if fresh else loader_rng, run_rng)
        return filtered_batch_sampler(BatchSampler(rest, original.batch_size, original.drop_last), loader, source)
    return started(loader, lambda: _iterate_with(loader, "batch_sampler", batches())), done
