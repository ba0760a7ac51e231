"""Training-feature arguments of ``train()``: their checks, their callbacks, and ``torch.compile``.

``amp``, ``accumulation_steps``, ``grad_clip_norm``, ``grad_clip_value``, ``compile``, ``check``,
``overfit``, ``timeit``, ``monitor`` and ``valid_every`` are checked here before anything runs.
"""
import numbers

import torch

from torchstage.callbacks.debug import CheckRunCallback, LimitBatchesCallback
from torchstage.callbacks.monitor import ThroughputMonitor
from torchstage.callbacks.optimizer import OptimizerCallback
from torchstage.callbacks.timer import TimerCallback
from torchstage.callbacks.validation import ValidEveryCallback
from torchstage.runner.amp import amp_dtype

#: ``check=True``: batches per loader and epochs per stage of a smoke run.
CHECK_BATCHES, CHECK_EPOCHS = 2, 2
_OPTIMIZER_ARGS = ("accumulation_steps", "grad_clip_norm", "grad_clip_value")


def check_feature_args(spec) -> None:
    """Raise ValueError/TypeError naming the argument if a feature argument is malformed."""
    amp_dtype(spec.amp)
    _check_int("accumulation_steps", spec.accumulation_steps)
    _check_int("valid_every", spec.valid_every)
    for name in ("grad_clip_norm", "grad_clip_value"):
        value = getattr(spec, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0):
            raise ValueError(f"{name} must be a number > 0 or None, got {value!r}")
    if not isinstance(spec.compile, (bool, dict)):
        raise TypeError(f"compile must be True/False or a dict of torch.compile arguments "
                        f"(e.g. {{'mode': 'reduce-overhead'}}), got {spec.compile!r}")
    for name in ("check", "timeit", "monitor"):
        if not isinstance(getattr(spec, name), bool):
            raise TypeError(f"{name} must be True or False, got {getattr(spec, name)!r}")
    if not isinstance(spec.overfit, bool):
        _check_int("overfit", spec.overfit, "True/False or the number of batches to repeat, >= 1")
    if spec.valid_period is not None:
        from torchstage.callbacks.periodic_validation import PeriodicValidationCallback
        PeriodicValidationCallback(spec.valid_period)  # raises on a malformed period
    if spec.log_period is not None:
        from torchstage.callbacks.logger_base import check_batch_period
        check_batch_period(spec.log_period)
        if spec.logdir is None:
            raise ValueError(f"log_period={spec.log_period!r} writes TensorBoard scalars and needs a logdir")


def _check_int(name, value, expected="an integer >= 1") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def optimizer_options(spec) -> dict:
    """The keyword arguments of the default :class:`OptimizerCallback` taken from ``train()``."""
    return {name: getattr(spec, name) for name in _OPTIMIZER_ARGS}


def feature_callbacks(spec) -> dict:
    """Name -> callback for ``valid_every``, ``check``, ``overfit``, ``timeit`` and ``monitor`` (empty when all
    are off)."""
    chain = {}
    if spec.valid_every > 1:
        chain["valid_every"] = ValidEveryCallback(spec.valid_every)
    if spec.valid_period is not None:
        from torchstage.callbacks.periodic_validation import PeriodicValidationCallback
        chain["periodic_validation"] = PeriodicValidationCallback(spec.valid_period)
    if spec.check:
        chain["check"] = CheckRunCallback(num_epochs=CHECK_EPOCHS)
        chain["limit_batches"] = LimitBatchesCallback(CHECK_BATCHES)
    if spec.overfit:
        chain["limit_batches"] = LimitBatchesCallback(1 if spec.overfit is True else spec.overfit, same_batches=True)
    if spec.timeit:
        chain["timer"] = TimerCallback()
    if spec.monitor:
        chain["monitor"] = ThroughputMonitor()
    return chain


def check_feature_chain(spec, chains) -> None:
    """Optimizer arguments of ``train()`` need an OptimizerCallback to apply them, and must not contradict one."""
    given = {name: getattr(spec, name) for name in _OPTIMIZER_ARGS
             if getattr(spec, name) != (1 if name == "accumulation_steps" else None)}
    if not given:
        return
    for chain in chains:
        callbacks = [cb for cb in chain.values() if isinstance(cb, OptimizerCallback)]
        if not callbacks:
            raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())} is applied by an "
                             f"OptimizerCallback, and this run's callbacks have none (a custom handle_batch "
                             f"steps its own optimizers); add OptimizerCallback(...) or apply it in handle_batch")
        for cb in callbacks:
            for name, value in given.items():
                if getattr(cb, name) != value:
                    raise ValueError(f"{name}={value!r} was given to train() but the OptimizerCallback in "
                                     f"callbacks has {name}={getattr(cb, name)!r}; set it in one place")


def compile_models(runner, compile) -> None:
    """``compile=True`` (or a dict of torch.compile arguments): compile each placed model."""
    if not compile:
        return
    kwargs = {} if compile is True else dict(compile)
    if isinstance(runner.model, dict):
        runner.model = {k: torch.compile(m, **kwargs) for k, m in runner.model.items()}
    else:
        runner.model = torch.compile(runner.model, **kwargs)
