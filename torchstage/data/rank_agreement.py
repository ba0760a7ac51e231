"""Do the ranks hold the same data? One cheap check before the first step, under any launcher.

Every rank must start from the same dataset and take its own shard of it; data built without a seed in each
process (module-level ``torch.rand`` under torchrun, SLURM or mpirun) silently gives each rank its own data, and
"exact" validation then mixes them. Per map-style dataset: its length and a hash of a few fixed items (first,
middle, last), read under a fixed seed (random transforms agree) through a shallow copy (read counters don't see
it), gathered from all ranks in one collective. A loader whose sampler the user made to shard (a
``DistributedSampler``) and iterable datasets are not checked.
"""
import copy
import hashlib
import logging
from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from torchstage.data.loaders import ShardedSampler
from torchstage.data.samplers import StridedEvalSampler
from torchstage.rng import seeded
from torchstage.distributed.engine import Engine

logger = logging.getLogger("torchstage")
#: The seed items are read under: a dataset's random transforms give the same item on every rank.
READ_SEED = 0
#: The fix, by where the data came from: ``loaders=`` the user built, datasets the user built and passed in
#: ``datasets={...}``, or datasets ``get_datasets_fn`` made (torchstage seeded every rank alike before calling it).
_MADE_BEFORE = ("made before the ranks were seeded alike, or from something that differs per rank (the rank, the "
                "host, a file per rank). Under torchrun, srun and mpirun every rank is seeded alike "
                "when it imports torchstage (and a rank torchstage starts, before its first line), so build the "
                "data after `import torchstage`, or build the data from a fixed seed (torch.manual_seed(...) before "
                "making it), or read it from a file")
ADVICE = {
    "loaders": f"the loaders' data was {_MADE_BEFORE}; or pass datasets={{'get_datasets_fn': fn, ...}} so "
               f"torchstage makes it in each process after seeding every rank alike",
    "datasets": f"the datasets given in datasets={{...}} were {_MADE_BEFORE}; or make them in "
                f"datasets['get_datasets_fn'], which torchstage calls after seeding every rank alike",
    "get_datasets_fn": "torchstage called datasets['get_datasets_fn'] after seeding every rank alike with the run's "
                       "seed, so it reads something that differs between the ranks (the rank, the host, the time, a "
                       "file per rank): make it return the same data on every rank",
}


def checked_dataset(loader, built: bool = False):
    """The dataset of ``loader`` to compare across ranks, or None: not a DataLoader over a map-style dataset, or a
    sampler the user made to shard it (``built``: torchstage made the loader, its sampler shards as planned)."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    if not built and _user_sharded(loader):
        return None
    try:
        len(loader.dataset)
    except TypeError:
        return None
    return loader.dataset


def _user_sharded(loader) -> bool:
    samplers = [loader.sampler, getattr(loader.batch_sampler, "sampler", None), loader.batch_sampler]
    return any(isinstance(s, (DistributedSampler, StridedEvalSampler, ShardedSampler))
               or (hasattr(s, "num_replicas") and hasattr(s, "rank")) for s in samplers)


def fingerprint(dataset) -> tuple:
    """``(length, hash of items 0, n//2, n-1)`` of a map-style dataset (hash None when its items cannot be read)."""
    size = len(dataset)
    if size == 0:
        return 0, None
    try:
        reader = copy.copy(dataset)
    except Exception:  # noqa: BLE001 (a dataset that cannot be copied is read as is)
        reader = dataset
    digest = hashlib.sha1()
    try:
        with seeded(READ_SEED):
            for index in sorted({0, size // 2, size - 1}):
                _feed(digest, reader[index])
    except Exception as error:  # noqa: BLE001 (training reads the items and says what is wrong)
        logger.debug("could not read items of %s to compare ranks: %r", type(dataset).__name__, error)
        return size, None
    return size, digest.hexdigest()[:12]


def _feed(digest, item) -> None:
    """Hash ``item`` by value: tensors and arrays by dtype, shape and bytes; containers recursively."""
    if isinstance(item, torch.Tensor):
        tensor = item.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{item.dtype}{tuple(item.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(item, np.ndarray):
        digest.update(f"A{item.dtype}{item.shape}".encode())
        digest.update(np.ascontiguousarray(item).tobytes() if item.dtype != object else repr(item).encode())
    elif isinstance(item, Mapping):
        for key in sorted(item, key=repr):
            digest.update(repr(key).encode())
            _feed(digest, item[key])
    elif isinstance(item, (list, tuple)):
        digest.update(f"L{len(item)}".encode())
        for value in item:
            _feed(digest, value)
    elif item is None or isinstance(item, (bool, int, float, complex, str, bytes, np.generic)):
        digest.update(repr(item).encode())
    elif hasattr(item, "__array__"):  # a PIL image...
        _feed(digest, np.asarray(item))
    else:  # an object whose repr may hold its address: its type only
        digest.update(type(item).__qualname__.encode())


def check_same_data(datasets: dict, engine: Engine, origins: dict = None) -> None:
    """Raise ValueError before training when the ranks' ``datasets`` (label -> dataset) differ, naming the loader,
    the ranks and the fix for where the data came from (``origins``: label -> a key of :data:`ADVICE`, default
    "loaders"); one ``all_gather_object`` for all of them, nothing without several processes."""
    if not engine.is_distributed or not datasets:
        return
    mine = {label: fingerprint(dataset) for label, dataset in datasets.items()}
    everyone = engine.all_gather_object(mine)
    problems = {label: _describe(label, [prints.get(label) for prints in everyone]) for label in datasets}
    problems = {label: problem for label, problem in problems.items() if problem}
    if problems:
        fixes = dict.fromkeys((origins or {}).get(label, "loaders") for label in problems)
        raise ValueError("the ranks hold different data, so each would train on its own and validation would "
                         f"mix them: {'; '.join(problems.values())}. To fix it: "
                         f"{'; and '.join(ADVICE[fix] for fix in fixes)}")


def _describe(label: str, prints: list) -> str:
    """What differs between the ranks' fingerprints of one loader ('' when they agree)."""
    sizes = {p[0] for p in prints if p is not None}
    if len(sizes) > 1:
        return f"{label} has {_by_rank([None if p is None else f'{p[0]} samples' for p in prints])}"
    hashes = [p[1] for p in prints if p is not None and p[1] is not None]
    if len(set(hashes)) > 1:
        size = next(iter(sizes))
        picks = sorted({0, size // 2, size - 1})
        return (f"{label}: items {', '.join(map(str, picks))} of its {size} differ between ranks "
                f"({_by_rank([None if p is None else p[1] for p in prints], 'hash ')})")
    return ""


def _by_rank(values: list, prefix: str = "") -> str:
    """``values`` grouped by rank: 'rank 0: 10 samples, ranks 1, 2: 12 samples'."""
    groups = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return ", ".join(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {prefix}{value}"
                     for value, ranks in groups.items() if value is not None)
