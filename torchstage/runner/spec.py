"""The arguments of ``Runner.train`` as a checked spec: every user error is raised here, before training.

:class:`TrainSpec` is made of five parts, each a dataclass in its own module that checks its own arguments
(``validate``): data and stages (:mod:`~torchstage.runner.spec_stages`), optimization
(:mod:`~torchstage.runner.spec_optimization`), checkpoints and resume (:mod:`~torchstage.runner.spec_checkpoints`),
run control (:mod:`~torchstage.runner.spec_run_control`), processes and strategy
(:mod:`~torchstage.runner.spec_processes`), large models: initial weights, activation checkpointing, the memory plan
(:mod:`~torchstage.runner.spec_large_models`). An argument that configures a callback is checked by that callback.
"""
import dataclasses
import difflib
import functools
from dataclasses import dataclass, field
from typing import Callable, Optional, ParamSpec, TypeVar

from torchstage.runner.defaults import stage_chains
from torchstage.runner.errors import shorten_user_error
from torchstage.runner.spec_checkpoints import CheckpointsAndResume
from torchstage.runner.spec_large_models import LargeModels
from torchstage.runner.spec_optimization import Optimization
from torchstage.runner.spec_processes import ProcessesAndStrategy
from torchstage.runner.spec_run_control import RunControl
from torchstage.runner.spec_stages import DataAndStages

P = ParamSpec("P")
R = TypeVar("R")


# A dataclass takes the fields of its bases last base first: data and stages come first, as in train()'s signature.
@dataclass
class TrainSpec(LargeModels, ProcessesAndStrategy, RunControl, CheckpointsAndResume, Optimization, DataAndStages):
    """Everything ``train(...)`` accepts, part by part. Stage-level keys given at the top are inherited by all
    stages."""

    #: Each stage's callback chain (:func:`~torchstage.runner.defaults.stage_chains`), built by make_spec.
    stage_chains: list = field(default_factory=list, init=False, repr=False)
    #: The YAML of a config run, saved to ``logdir/config.yml`` by the default chain.
    config_text: Optional[str] = field(default=None, init=False, repr=False)

    def validate(self, runner) -> None:
        """Each part checks its own arguments, each rule once; raises TypeError/ValueError naming the argument."""
        ProcessesAndStrategy.validate(self, runner)  # first: a stage's optimizer may come from the strategy
        RunControl.validate(self, runner)
        CheckpointsAndResume.validate(self, runner)
        DataAndStages.validate(self, runner)  # resolves the stages, which the optimization part checks
        Optimization.validate(self, runner)
        LargeModels.validate(self, runner)  # last: the strategy resolved, the models checked


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


def passes_arguments_as_given(run: Callable) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorates ``Runner.train``, whose parameters are written out (what ``help()``, IDEs and type checkers show; a
    test keeps them equal to TrainSpec's): a call runs ``run(runner, given)`` with the keyword arguments exactly as
    given. So make_spec fills in the defaults, and an argument passed at its default value still counts as given
    (``train(main_metric="loss", valid_metric="loss")`` is refused as two names for one argument).

    A user error found before training reaches the user here, under their own call, without torchstage's frames
    (:func:`~torchstage.runner.errors.shorten_user_error`)."""
    def decorate(train: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(train)
        def given(self, **kwargs):
            try:
                return run(self, kwargs)
            except Exception as exc:
                if shorten_user_error(exc, self):  # the user's error, under the user's call
                    raise exc
                raise
        return given
    return decorate
