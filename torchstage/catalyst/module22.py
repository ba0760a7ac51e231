"""Catalyst 22 names on ``torchstage`` itself (``dl.CPUEngine``, ``dl.IRunner``, ``dl.IRunnerError``): each resolved
here on first use, with a one-time note naming torchstage's spelling."""
from torchstage.catalyst import engines
from torchstage.catalyst.names import note_alias


def catalyst22_attribute(name: str):
    """The object Catalyst 22's ``dl.<name>`` means; AttributeError (with the reason) for a refused one, KeyError
    for a name that is not Catalyst 22's."""
    if name in ("CPUEngine", "GPUEngine"):
        return getattr(engines, name)
    if name in engines.DISTRIBUTED:
        engines.refused_engine(name)
    if name == "IRunner":
        from torchstage.catalyst.irunner import IRunner  # imports the runner: only when asked for
        return IRunner
    if name == "IRunnerError":
        from torchstage.runner.errors import RunnerException
        note_alias("dl.IRunnerError", "torchstage.RunnerException (a ValueError raised before training)",
                   version="22")
        return RunnerException
    raise KeyError(name)
