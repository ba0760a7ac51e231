"""Stateful data loaders (``state_dict()``/``load_state_dict()``, e.g. torchdata's ``StatefulDataLoader``):
their position is saved in checkpoints, per rank, and a resumed loader continues from it.

Index skipping (:mod:`torchstage.data.resume`) replays a map-style sampler's order; a stateful loader
knows better where it stands (iterable datasets, worker states, user pipelines), so its own state is used.
"""
from torchstage.callbacks.base import Callback, CallbackOrder


def is_stateful_loader(loader) -> bool:
    """True if ``loader`` can save and restore its position in a pass."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


class LoaderStateCallback(Callback):
    """Keeps the current stateful loader's ``state_dict()`` in mid-epoch checkpoints and restores it on resume.

    Added to the default chain when a loader of the run is stateful. Each rank reads its own shard, so the
    state is kept per rank.
    """

    order = CallbackOrder.Internal + 1
    name = "loader_state"
    state_per_rank = True

    def __init__(self):
        self._key, self._loader, self._resumed = None, None, None

    def on_experiment_start(self, runner):
        if runner.engine.prefetch:
            raise ValueError("prefetch=True reads the next batch ahead, so a stateful loader's saved position would "
                             "be one batch past the checkpoint; use prefetch=False with a StatefulDataLoader (its "
                             "pin_memory=True and workers overlap the copies)")

    def on_loader_start(self, runner):
        loop = runner.loop
        self._key, self._loader = loop.loader_key, loop.loader if is_stateful_loader(loop.loader) else None
        resumed, self._resumed = self._resumed, None
        point = runner.loop.resume_point
        if resumed and self._loader is not None and point is not None and point.loader == runner.loop.loader_key:
            self._loader.load_state_dict(resumed["state"])
            point.loader_restored = True  # the loader continues by itself: no index skipping

    def on_loader_end(self, runner):
        self._key, self._loader = None, None

    def state_dict(self) -> dict:
        """The position of the stateful loader in its pass (empty between loaders or for other loaders)."""
        if self._loader is None:
            return {}
        return {"loader": self._key, "state": self._loader.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self._resumed = state
