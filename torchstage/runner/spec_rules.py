"""The rules between the parts of ``train()``'s arguments, in one place: each part checks only its own arguments
(``runner/spec_*.py``), and these, run after them all, relate arguments of several parts."""
import os

from torchstage.runner.spec_optimization import check_components
from torchstage.runner.spec_stages import trains

#: ``check=True`` with a logdir writes to ``logdir/check``, so the real run on that logdir starts clean.
CHECK_FOLDER = "check"


def check_between_parts(spec, runner) -> None:
    """The rules, in order: a smoke run's logdir (run control x checkpoints), what needs a logdir (run control x
    checkpoints), what each training stage needs (data x processes: the strategy may supply the optimizer), and
    each stage's criterion, optimizer and scheduler against the model (data x optimization)."""
    if spec.check and spec.logdir is not None:  # a smoke run writes to a scratch folder, never the real run's
        spec.logdir, spec.overwrite = os.path.join(os.fspath(spec.logdir), CHECK_FOLDER), True
    if spec.log_period is not None and spec.logdir is None:
        raise ValueError(f"log_period={spec.log_period!r} writes TensorBoard scalars and needs a logdir")
    for stage in spec.stage_specs:
        _check_needs(runner, stage, spec.strategy)
        check_components(stage, spec.model, spec.scheduler_step)


def _check_needs(runner, stage, strategy) -> None:
    """The arguments the runner ``requires`` (``("criterion", "optimizer")``) in a stage that trains; a stage of
    evaluation loaders only needs none (as in Catalyst 22), and a strategy that supplies the optimizer (DeepSpeed's
    config) gives that one."""
    if not runner.requires or not trains(stage):
        return
    prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
    for name in runner.requires:
        if getattr(stage, name) is None and not (name == "optimizer" and strategy.supplies_optimizer):
            raise ValueError(f"{prefix}{type(runner).__name__} needs {name}=...; got {name}=None (a stage "
                             f"whose loaders are all evaluation loaders, not 'train*', needs none)")
