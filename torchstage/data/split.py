"""``datasets={"train": ds, "valid_ratio": 0.1}``: one dataset split into train and valid, alike on every process.

The split is a permutation drawn from its own generator seeded with ``split_seed`` (default 0), so
it does not depend on the run's seed, the process or the global random state.
"""
import numbers

import torch
from torch.utils.data import IterableDataset, Subset

#: Keys of ``datasets={...}`` that configure the split rather than name a dataset.
SPLIT_OPTIONS = ("valid_ratio", "split_seed")


def check_split(datasets, names: list, prefix: str = "") -> list:
    """Check the split options; return the loader names once the split is made (``valid`` added)."""
    if "valid_ratio" not in datasets:
        if "split_seed" in datasets:
            raise ValueError(f"{prefix}datasets['split_seed'] is set but datasets['valid_ratio'] is not")
        return names
    ratio, seed = datasets["valid_ratio"], datasets.get("split_seed", 0)
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < ratio < 1:
        raise ValueError(f"{prefix}datasets['valid_ratio'] must be a number between 0 and 1 (exclusive), "
                         f"got {ratio!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{prefix}datasets['split_seed'] must be an integer, got {seed!r}")
    if "train" not in names:
        raise ValueError(f"{prefix}datasets['valid_ratio'] splits datasets['train'], which is missing "
                         f"(datasets: {names})")
    if "valid" in names:
        raise ValueError(f"{prefix}datasets has both 'valid' and 'valid_ratio'; give one of them")
    return [*names, "valid"]


def split_valid(built: dict, datasets) -> dict:
    """``built`` with ``train`` replaced by its train part, followed by ``valid`` (when ``valid_ratio`` is set)."""
    if "valid_ratio" not in datasets:
        return built
    names = check_split(datasets, list(built))
    train = built["train"]
    if isinstance(train, IterableDataset) or not hasattr(train, "__len__"):
        raise TypeError("datasets['valid_ratio'] needs a map-style train dataset with a length, "
                        f"got {type(train).__name__}")
    n = len(train)
    n_valid = round(n * datasets["valid_ratio"])
    if not 1 <= n_valid < n:
        raise ValueError(f"datasets['valid_ratio']={datasets['valid_ratio']} of {n} samples leaves "
                         f"{n_valid} for valid and {n - n_valid} for train; both need at least one")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(datasets.get("split_seed", 0)))
    valid_idx, train_idx = sorted(order[:n_valid].tolist()), sorted(order[n_valid:].tolist())
    result = {}
    for name in names:
        if name == "train":
            result["train"] = Subset(train, train_idx)
        elif name == "valid":
            result["valid"] = Subset(train, valid_idx)
        else:
            result[name] = built[name]
    return result
