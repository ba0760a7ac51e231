"""Loaders from ``datasets={...}``: built at run time, inside each process, once the world exists.

The datasets are made with every generator seeded alike on every rank (the run's ``seed``, as Catalyst seeded
before calling ``get_datasets_fn``), so data drawn there without a seed is the same data on every rank; the
generators are put back afterwards, so the training's own seeding (``seed`` + data-parallel rank) is untouched.
"""
import inspect
from collections.abc import Mapping

from torch.utils.data import DataLoader, Dataset, IterableDataset

from torchstage.data.samplers import make_sampler
from torchstage.data.split import SPLIT_OPTIONS, check_split, split_valid
from torchstage.rng import seeded
from torchstage.distributed.engine import Engine

#: Options of ``datasets={...}`` passed to every DataLoader; all other keys name datasets.
LOADER_OPTIONS = ("batch_size", "num_workers", "collate_fn", "drop_last", "pin_memory", "worker_init_fn",
                  "persistent_workers", "prefetch_factor", "shuffle")
FACTORY = "get_datasets_fn"


def _is_dataset(obj) -> bool:
    return isinstance(obj, (Dataset, IterableDataset)) or (hasattr(obj, "__getitem__") and hasattr(obj, "__len__"))


def dataset_loader_names(datasets, prefix: str = "") -> list:
    """Check a ``datasets`` dict without building anything; the loader names it makes (None: not yet known)."""
    if not isinstance(datasets, Mapping):
        raise TypeError(f"{prefix}datasets must be a dict like {{'batch_size': 32, 'train': ds, 'valid': ds}}, "
                        f"got {type(datasets).__name__}")
    batch_size = datasets.get("batch_size")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{prefix}datasets['batch_size'] must be an integer >= 1, got {batch_size!r}")
    workers = datasets.get("num_workers", 0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"{prefix}datasets['num_workers'] must be an integer >= 0, got {workers!r}")
    if FACTORY in datasets:
        fn = datasets[FACTORY]
        if not callable(fn):
            raise TypeError(f"{prefix}datasets['{FACTORY}'] must be callable, got {type(fn).__name__}")
        kwargs = _factory_kwargs(datasets)
        params = inspect.signature(fn).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            unknown = sorted(set(kwargs) - set(params))
            if unknown:
                raise ValueError(f"{prefix}datasets has unknown key(s) {unknown}: not a loader option "
                                 f"({', '.join(LOADER_OPTIONS)}) nor an argument of {fn.__name__}{inspect.signature(fn)}")
        if "valid_ratio" in datasets:
            check_split(datasets, ["train"], prefix)
        return None  # the factory's loader names are known only once it has run
    names = []
    for key, value in datasets.items():
        if key in LOADER_OPTIONS or key in SPLIT_OPTIONS:
            continue
        if not _is_dataset(value):
            raise ValueError(f"{prefix}datasets[{key!r}] = {value!r:.60} is neither a loader option "
                             f"({', '.join(LOADER_OPTIONS)}) nor a Dataset")
        check_not_empty(key, value, prefix)
        names.append(key)
    if not names:
        raise ValueError(f"{prefix}datasets holds no dataset: add e.g. 'train': dataset, 'valid': dataset")
    return check_split(datasets, names, prefix)


def check_not_empty(name, dataset, prefix: str = "", made_by=None) -> None:
    """A map-style dataset of length 0 would yield no batch (torch's sampler says ``num_samples should be a
    positive integer``): refused, naming it (and the ``get_datasets_fn`` that ``made_by`` it)."""
    if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__") and len(dataset) == 0:
        made = f" (made by {getattr(made_by, '__name__', made_by)}())" if made_by is not None else ""
        raise ValueError(f"{prefix}datasets[{name!r}]{made} is empty (len 0): it would yield no batch; give it a "
                         f"dataset with at least one sample")


def _factory_kwargs(datasets) -> dict:
    return {k: v for k, v in datasets.items() if k not in LOADER_OPTIONS and k not in SPLIT_OPTIONS and k != FACTORY}


def build_datasets(datasets: Mapping, seed: int = 0) -> dict:
    """Name -> Dataset, calling ``get_datasets_fn(**kwargs)`` if given (inside the worker process) with every
    generator seeded with ``seed`` for the call (the same on every rank, restored after it)."""
    if FACTORY in datasets:
        with seeded(seed):
            made = datasets[FACTORY](**_factory_kwargs(datasets))
        if not isinstance(made, Mapping) or not made or not all(_is_dataset(d) for d in made.values()):
            raise TypeError(f"datasets['{FACTORY}'] must return a dict name -> Dataset, got {made!r:.80}")
        return split_valid(dict(made), datasets)
    return split_valid({k: v for k, v in datasets.items() if k not in LOADER_OPTIONS and k not in SPLIT_OPTIONS},
                       datasets)


def build_loaders(datasets: Mapping, engine: Engine, seed: int = 0) -> dict:
    """DataLoaders for ``datasets``: train loaders shuffle; under several processes each rank gets its shard. The
    datasets are made under ``seed`` (the run's), alike on every rank."""
    options = {k: v for k, v in datasets.items() if k in LOADER_OPTIONS}
    shuffle = options.pop("shuffle", None)
    if options.get("num_workers", 0) > 0:
        options.setdefault("persistent_workers", True)  # no worker start-up cost every epoch
    options.setdefault("pin_memory", engine.device.type == "cuda")  # asynchronous host-to-device copies
    loaders = {}
    for name, dataset in build_datasets(datasets, seed).items():
        check_not_empty(name, dataset, made_by=datasets.get(FACTORY))
        is_train = name.startswith("train")
        train_shuffle = is_train if shuffle is None else (shuffle and is_train)
        sampler = make_sampler(dataset, engine, shuffle=train_shuffle, is_train=is_train, seed=seed)
        if sampler is None:
            loaders[name] = DataLoader(dataset, shuffle=train_shuffle and not isinstance(dataset, IterableDataset),
                                       **options)
        else:
            loaders[name] = DataLoader(dataset, sampler=sampler, **options)
    return loaders
