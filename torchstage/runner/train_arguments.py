"""``Runner.train``'s arguments, declared once: :func:`train_signature`.

Its signature is ``train()``'s: the names, types and defaults that ``help(Runner.train)``, IDEs and type checkers
show (:func:`takes_arguments_of` gives it to the method), each argument tagged with its :class:`Part`. The rest is
made from it: the checked spec (:class:`~torchstage.runner.spec.TrainSpec`, each part of it checked by its own
module, the rules between parts in :mod:`~torchstage.runner.spec_rules`), the config schema
(:mod:`torchstage.config.schema`), and ``docs/api.md``'s tables, a table per part, which a test keeps equal to it.
"""
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Concatenate, Mapping, Optional, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class Part:
    """A part of ``train()``'s arguments: the heading of its table in ``docs/api.md``."""

    heading: str


DATA, OPTIMIZATION, CHECKPOINTS = Part("Data and stages"), Part("Optimization"), Part("Checkpoints and resume")
RUN_CONTROL, PROCESSES, LARGE_MODELS = Part("Run control"), Part("Processes and strategy"), Part("Large models")
#: The parts in ``train()``'s order.
PARTS = (DATA, OPTIMIZATION, CHECKPOINTS, RUN_CONTROL, PROCESSES, LARGE_MODELS)
# an argument's type and part, one alias a part (one assignment each: what type checkers read as an alias)
Data = Annotated[T, DATA]
Optimization = Annotated[T, OPTIMIZATION]
Checkpoints = Annotated[T, CHECKPOINTS]
RunControl = Annotated[T, RUN_CONTROL]
Processes = Annotated[T, PROCESSES]
LargeModels = Annotated[T, LARGE_MODELS]

#: The defaults ``docs/api.md`` shows otherwise than as the value: what ``None`` means there.
SHOWN_DEFAULTS = {"model": "required", "checkpoint_period": "`Epoch(1)`"}


def train_signature(
        *,
        model: Data[Any] = None, criterion: Data[Any] = None, optimizer: Data[Any] = None,
        scheduler: Data[Any] = None, loaders: Data[Optional[Mapping]] = None, datasets: Data[Optional[dict]] = None,
        callbacks: Data[Any] = None, num_epochs: Data[int] = 1, valid_loader: Data[str] = "valid",
        valid_metric: Data[str] = "loss", minimize_valid_metric: Data[bool] = True,
        stages: Data[Optional[Mapping]] = None,
        scheduler_step: Optimization[str] = "epoch", accumulation_steps: Optimization[int] = 1,
        grad_clip_norm: Optimization[Optional[float]] = None, grad_clip_value: Optimization[Optional[float]] = None,
        amp: Optimization[Any] = None, compile: Optimization[Any] = False, channels_last: Optimization[bool] = False,
        logdir: Checkpoints[Optional[str]] = None, resume: Checkpoints[Optional[str]] = None,
        overwrite: Checkpoints[bool] = False, resume_lr: Checkpoints[str] = "refuse",
        checkpoint_period: Checkpoints[Any] = None, topk: Checkpoints[int] = 0,
        load_best_on_end: Checkpoints[bool] = False, requeue: Checkpoints[Optional[bool]] = None,
        seed: RunControl[int] = 42, deterministic: RunControl[bool] = False, verbose: RunControl[bool] = False,
        check: RunControl[bool] = False, overfit: RunControl[Any] = False, timeit: RunControl[bool] = False,
        monitor: RunControl[bool] = False, valid_every: RunControl[int] = 1, valid_period: RunControl[Any] = None,
        log_period: RunControl[Any] = None, loggers: RunControl[Optional[Mapping]] = None,
        distributed: Processes[Optional[bool]] = None, nprocs: Processes[Optional[int]] = None,
        strategy: Processes[Any] = "ddp", engine: Processes[Any] = None, prefetch: Processes[bool] = False,
        hang_timeout: Processes[Optional[float]] = 300, max_restarts: Processes[Optional[int]] = None,
        preflight: Processes[bool] = False,
        init_from: LargeModels[Any] = None, init_weights: LargeModels[Optional[Callable]] = None,
        activation_checkpointing: LargeModels[Any] = None, dry_run: LargeModels[bool] = False,
        **more: Any) -> None:
    """Every argument of ``Runner.train``; ``**more``: other libraries' names for them (Catalyst's ``fp16=``...),
    which a runner translates (``translate_train_kwargs``)."""


@dataclass(frozen=True)
class Argument:
    """One argument of ``train()`` as declared: name, type, default and part."""

    name: str
    kind: Any
    default: Any
    part: Part


def declared_arguments() -> list:
    """The :class:`Argument` s of :func:`train_signature`, in its order."""
    hints = typing.get_type_hints(train_signature, include_extras=True)
    arguments = []
    for name, parameter in inspect.signature(train_signature).parameters.items():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kind, part = typing.get_args(hints[name])
            arguments.append(Argument(name, kind, parameter.default, part))
    return arguments


def takes_arguments_of(source: Callable[P, Any]) -> Callable[[Callable[..., R]], Callable[Concatenate[Any, P], R]]:
    """Give a method taking ``(self, **given)`` the signature of ``source`` (after ``self``): what ``help()``, IDEs
    and type checkers show, while the method receives the keyword arguments exactly as given (an argument passed at
    its default value counts as given)."""
    kinds = typing.get_type_hints(source)  # the types without their parts (``Annotated``'s extras)
    parameters = [parameter.replace(annotation=kinds.get(name, parameter.annotation))
                  for name, parameter in inspect.signature(source).parameters.items()]

    def decorate(method: Callable[..., R]) -> Callable[Concatenate[Any, P], R]:
        self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        method.__signature__ = inspect.Signature([self, *parameters],
                                                 return_annotation=inspect.signature(method).return_annotation)
        return method
    return decorate
