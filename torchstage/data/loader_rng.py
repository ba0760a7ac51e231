"""The random state a DataLoader's pass starts from: captured just before ``iter(loader)``, put back to draw the
same pass again (a mid-epoch resume replays the interrupted pass's order; workers started again draw the same seeds).

A shuffled pass draws its order when it starts, from the global torch RNG (a RandomSampler without a generator) or
from the DataLoader's or sampler's own generator; its workers' base seed comes from the loader's generator or the
global RNG.
"""
import torch
from torch.utils.data import DataLoader


def generators(loader) -> list:
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


def reuses_iterator(loader) -> bool:
    """True when ``iter(loader)`` will reset a persistent-workers iterator instead of making a new one."""
    return (isinstance(loader, DataLoader) and loader.persistent_workers
            and getattr(loader, "_iterator", None) is not None)


def capture_loader_rng(loader) -> dict:
    """The random state a pass over ``loader`` starts from; call it just before ``iter(loader)``."""
    return {"torch": torch.get_rng_state(),
            "generators": {name: g.get_state() for name, g in generators(loader)},
            "fresh_iterator": not reuses_iterator(loader)}


def apply_loader_rng(loader, state: dict) -> None:
    """Put back a :func:`capture_loader_rng` state: the next pass draws what the captured one drew."""
    torch.set_rng_state(state["torch"])
    for name, generator in generators(loader):
        if name in state["generators"]:
            generator.set_state(state["generators"][name])
