"""A config -> the very ``runner.train(...)`` call a script would make, and running it.

Components are ``{_target_: import.path, **kwargs}`` nodes (see :mod:`torchstage.config.instantiate`). The config
is checked against :class:`~torchstage.runner.spec.TrainSpec` at run time, so new ``train`` arguments are
config keys at once. Every mistake raises :class:`~torchstage.ConfigError` naming the YAML path, before training.
"""
import re
from collections.abc import Mapping

from torchstage.config.components import (build_callbacks, build_datasets, build_models, build_optimizers,
                                          build_runner, build_schedulers, runner_class)
from torchstage.config.schema import EXTRA_KEYS, check_config
from torchstage.config.yaml_files import dump_config
from torchstage.config.instantiate import ConfigError, instantiate, join
from torchstage.rng import set_seed
from torchstage.runner.large_models import log_memory_plan
from torchstage.runner.setup import prepare, train_in_world
from torchstage.runner.spec import TrainSpec, make_spec
from torchstage.runner.spec_stages import STAGE_KEYS


def build_train_call(config: Mapping, model=None):
    """Seed, then build the runner and every component: returns ``(runner, train_kwargs)``; ``model``: the model
    already built from the config's (``torchstage plan`` builds it on the meta device).

    Python, numpy and torch are seeded with the config's ``seed`` (default: TrainSpec's) before the first
    component is built, so model initialisation is reproducible; ``train`` then seeds again as usual.
    Order: model, runner, then per level (top, then each stage) criterion, optimizer, scheduler, data,
    callbacks; so a script that calls ``set_seed(seed)`` and builds its model first gets the same weights.
    """
    check_config(config)
    defaults = TrainSpec()
    set_seed(config.get("seed", defaults.seed), config.get("deterministic", defaults.deterministic))
    if model is None and "model" in config:
        model = build_models(config["model"])
    kwargs = {"model": model} if model is not None else {}
    runner = build_runner(config.get("runner"))
    for key, value in config.items():
        if key not in (*EXTRA_KEYS, *STAGE_KEYS, "stages", "model"):
            kwargs[key] = instantiate(value, key)  # scalars as they are; components of new train() arguments
    model = kwargs.get("model")
    kwargs.update(_build_stage_values(config, "", model, inherited={}))
    if config.get("stages") is not None:
        top = {"optimizer": kwargs.get("optimizer"), "scheduler_config": config.get("scheduler")}
        kwargs["stages"] = {name: _build_stage_values(stage, join("stages", name), model, inherited=top)
                            for name, stage in config["stages"].items()}
    return runner, kwargs


def _build_stage_values(node: Mapping, path: str, model, inherited: dict) -> dict:
    """The stage-level train arguments of ``node`` (the top level or one stage), built in a fixed order."""
    built_here = ("criterion", "optimizer", "scheduler", "datasets", "loaders", "callbacks")
    values = {key: instantiate(node[key], join(path, key))
              for key in STAGE_KEYS if key in node and key not in built_here}
    if "criterion" in node:
        values["criterion"] = instantiate(node["criterion"], join(path, "criterion"))
    if "optimizer" in node:
        values["optimizer"] = build_optimizers(node["optimizer"], join(path, "optimizer"), model)
    optimizer = values.get("optimizer", inherited.get("optimizer"))
    if "scheduler" in node:
        values["scheduler"] = build_schedulers(node["scheduler"], join(path, "scheduler"), optimizer)
    elif "optimizer" in node and inherited.get("scheduler_config") is not None:
        # a new optimizer gets its own copy of the inherited scheduler, never the one bound to the old optimizer
        values["scheduler"] = (None if optimizer is None else
                               build_schedulers(inherited["scheduler_config"], "scheduler", optimizer))
    if "datasets" in node:
        values["datasets"] = build_datasets(node["datasets"], join(path, "datasets"))
    if "loaders" in node:
        values["loaders"] = instantiate(node["loaders"], join(path, "loaders"))
    if "callbacks" in node:
        values["callbacks"] = build_callbacks(node["callbacks"], join(path, "callbacks"))
    return values


def train_from_config(config: Mapping, dry_run: bool = False, callbacks: Mapping = None):
    """``runner.train(**kwargs)`` built from ``config``; ``dry_run`` builds and prepares everything, trains nothing.

    ``callbacks``: name -> callback objects added to the config's (``torchstage tune`` adds its pruning one).

    With a ``logdir``, the merged config (seed filled in) is written to ``logdir/config.yml`` when the run
    starts, so ``torchstage run -C logdir/config.yml`` repeats it. Returns the runner.
    """
    config = with_defaults(config)
    runner, kwargs = build_train_call(config)
    if callbacks:
        given = kwargs.get("callbacks")
        kwargs["callbacks"] = ({**given, **callbacks} if isinstance(given, Mapping)
                               else [*(given or []), *callbacks.values()])
    try:
        spec = make_spec(runner, kwargs, config_text=dump_config(config))  # train()'s checks, as config errors
    except (TypeError, ValueError) as exc:  # "stages['ft']: datasets['batch_size'] ..." -> "stages.ft: datasets.batch_size"
        raise ConfigError("", re.sub(r"(?<=\w)\[(['\"])([^'\"\]]*)\1\]", r".\2", str(exc))) from exc
    if dry_run:
        prepare(runner, spec)
        return runner
    if spec.dry_run:  # the config's dry_run: true: the memory plan, as train(dry_run=True) gives it
        return log_memory_plan(runner, spec)
    return train_in_world(runner, spec)


def with_defaults(config: Mapping) -> dict:
    """A copy of ``config`` with its runner's spellings of train() arguments translated as ``train()`` translates
    them (Catalyst's ``fp16: true`` is ``amp: fp16-or-full``) and ``seed`` filled in, so a saved config does not
    depend on a default. The runner class is imported, not built: the translation reads only its class."""
    cls = runner_class(config.get("runner"))
    try:
        config = cls.translate_train_kwargs(cls.__new__(cls), dict(config))
    except (TypeError, ValueError) as exc:
        raise ConfigError("", str(exc)) from exc
    return {**config, "seed": config.get("seed", TrainSpec().seed)}
