"""Errors of the runner that a user's setup causes (kept under Catalyst 20.12's name, RunnerException)."""


class RunnerException(ValueError):
    """A run that cannot start as given, such as an empty loader; a ValueError, raised before training."""
