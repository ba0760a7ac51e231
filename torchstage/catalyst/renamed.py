"""A metric whose result keys carry other names, e.g. Catalyst 20.12's ``accuracy01`` for ``accuracy``."""
from torchstage.metrics.base import Metric, Values


class RenamedMetric(Metric):
    """Delegates to ``metric``; result keys are mapped through ``names`` (keys missing there are kept)."""

    def __init__(self, metric: Metric, names: dict):
        self.metric, self.mapping = metric, dict(names)
        super().__init__("")

    @property
    def names(self) -> tuple:
        return tuple(self.mapping.get(name, name) for name in self.metric.names)

    def reset(self) -> None:
        self.metric.reset()

    def update(self, outputs, targets) -> None:
        self.metric.update(outputs, targets)

    def sync(self, engine) -> None:
        self.metric.sync(engine)

    def state_dict(self) -> dict:
        return self.metric.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.metric.load_state_dict(state)

    def merge_state_dicts(self, states: list) -> dict:
        return self.metric.merge_state_dicts(states)

    def compute(self) -> Values:
        return {self.mapping.get(name, name): value for name, value in self.metric.compute().items()}

    # the wrapped metric keeps the state
    def _reset_state(self) -> None: pass
    def _update(self, outputs, targets) -> None: pass
    def _sync(self, engine) -> None: pass
    def _compute(self) -> Values: return {}
