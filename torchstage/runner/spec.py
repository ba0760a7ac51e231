"""The arguments of ``Runner.train`` as a checked spec: every user error is raised here, before training.

:class:`TrainSpec` has a field per argument of the one declaration of them
(:func:`~torchstage.runner.train_arguments.train_signature`). Each part of the arguments is checked by its own module,
which reads only that part's: processes and strategy (:mod:`~torchstage.runner.spec_processes`), run control
(:mod:`~torchstage.runner.spec_run_control`), checkpoints and resume (:mod:`~torchstage.runner.spec_checkpoints`),
data and stages (:mod:`~torchstage.runner.spec_stages`), optimization (:mod:`~torchstage.runner.spec_optimization`), large models: initial weights, activation checkpointing, the memory
plan (:mod:`~torchstage.runner.spec_large_models`);
then the rules between parts (:mod:`~torchstage.runner.spec_rules`). An argument that configures a callback is
checked by that callback.
"""
import dataclasses
import difflib
from dataclasses import field
from typing import Optional

from torchstage.runner.defaults import stage_chains
from torchstage.runner.spec_checkpoints import check_checkpoints
from torchstage.runner.spec_large_models import check_large_models
from torchstage.runner.spec_optimization import check_optimization
from torchstage.runner.spec_processes import check_processes
from torchstage.runner.spec_rules import check_between_parts
from torchstage.runner.spec_run_control import check_run_control
from torchstage.runner.spec_stages import check_data
from torchstage.runner.train_arguments import declared_arguments

#: The checks of the parts, each reading its own arguments only, in the order they run (the first error is raised):
#: the strategy first, whose optimizer a stage may use.
#: last, the large models: the strategy resolved and the models checked
PART_CHECKS = (check_processes, check_run_control, check_checkpoints, check_data, check_optimization,
               check_large_models)


class _Checks:
    """What a :class:`TrainSpec` does besides holding the arguments."""

    def validate(self, runner) -> None:
        """Each part checks its own arguments, then the rules between parts run; raises TypeError/ValueError naming
        the argument."""
        for check in PART_CHECKS:
            check(self, runner)
        check_between_parts(self, runner)


TrainSpec = dataclasses.make_dataclass(
    "TrainSpec",
    [(argument.name, argument.kind, field(default=argument.default)) for argument in declared_arguments()] + [
        # each stage with what it inherits filled in (check_data), and its callback chain (make_spec)
        ("stage_specs", list, field(default_factory=list, init=False, repr=False)),
        ("stage_chains", list, field(default_factory=list, init=False, repr=False)),
        # the YAML of a config run, saved to logdir/config.yml by the default chain
        ("config_text", Optional[str], field(default=None, init=False, repr=False))],
    bases=(_Checks,), kw_only=True)
TrainSpec.__module__ = __name__
TrainSpec.__doc__ = """Everything ``train(...)`` accepts (a field per argument of
:func:`~torchstage.runner.train_arguments.train_signature`), checked; stage-level keys given at the top are inherited
by all stages."""


def train_arguments() -> list:
    """The names ``train()`` accepts, in signature order."""
    return [f.name for f in dataclasses.fields(TrainSpec) if f.init]


def make_spec(runner, kwargs: dict, config_text: str = None) -> TrainSpec:
    """Validate ``train`` keyword arguments, resolve stages and build their callback chains (which check the
    arguments they are given); raise ValueError/TypeError naming the argument. The one way from ``train()``'s
    arguments, or a config's, to a run: the runner translates the names of other libraries first."""
    kwargs = runner.translate_train_kwargs(kwargs)
    names = train_arguments()
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        close = {name: difflib.get_close_matches(name, names, n=1) for name in unknown}
        hint = "".join(f"; did you mean {c[0]!r} for {name!r}?" for name, c in close.items() if c)
        raise TypeError(f"train() got unknown argument(s) {unknown}; accepted: {', '.join(names)}{hint}")
    spec = TrainSpec(**kwargs)
    spec.validate(runner)
    spec.config_text = config_text
    spec.stage_chains = stage_chains(runner, spec)
    return spec
