"""The config API: YAML files + ``--set`` overrides -> the very ``runner.train(...)`` call a script would make.

Components are ``{_target_: import.path, **kwargs}`` nodes (see :mod:`torchstage.instantiate`). The config
is checked against :class:`~torchstage.runner.spec.TrainSpec` at run time, so new ``train`` arguments are
config keys at once. Every mistake raises :class:`ConfigError` naming the YAML path, before training.
"""
import copy
import dataclasses
import os
import re
import typing
from collections.abc import Mapping

import yaml

from torchstage.instantiate import (TARGET, ConfigError, _matches, _scalar_kinds, check_arguments, import_target,
                                    instantiate, is_component, join)
from torchstage.runner.dataset_loaders import LOADER_OPTIONS
from torchstage.runner.spec import STAGE_KEYS, StageSpec, TrainSpec

#: Top-level keys that are not ``train`` arguments.
EXTRA_KEYS = ("runner",)
DEFAULT_RUNNER = "torchstage.SupervisedRunner"


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loading, except that ``1e-3`` is a float (as in YAML 1.2), not the string ``'1e-3'``."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def parse_yaml(text: str, source: str):
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"invalid YAML: {exc}") from exc


# ---- loading, merging, overriding --------------------------------------------------------------
def load_config(paths, overrides=()) -> dict:
    """Merge the YAML files in order (later keys win), then apply ``a.b.c=value`` overrides."""
    config = {}
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        try:
            with open(path, encoding="utf-8") as f:
                data = parse_yaml(f.read(), os.fspath(path))
        except OSError as exc:
            raise ConfigError(os.fspath(path), f"cannot read config file: {exc.strerror}") from exc
        if data is None:
            continue
        if not isinstance(data, Mapping):
            raise ConfigError(os.fspath(path), f"a config file must hold a mapping of keys, got {type(data).__name__}")
        config = merge(config, data)
    for text in overrides:
        apply_override(config, text)
    return config


def merge(base, other):
    """Deep merge: mappings merge key by key, anything else is replaced; a new ``_target_`` replaces the node."""
    if not (isinstance(base, Mapping) and isinstance(other, Mapping)):
        return copy.deepcopy(other)
    if TARGET in other and other[TARGET] != base.get(TARGET):
        return copy.deepcopy(dict(other))  # another class: the old kwargs would not fit it
    merged = dict(base)
    for key, value in other.items():
        merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
    return merged


def apply_override(config: dict, text: str) -> None:
    """Set ``KEY.PATH=VALUE`` in place; VALUE is a YAML scalar or flow value (``3``, ``1e-3``, ``[3, 6]``, ``null``)."""
    where = f"--set {text!r}"
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(part.strip() for part in parts):
        raise ConfigError(where, "expected KEY.PATH=VALUE, e.g. --set optimizer.lr=0.01")
    value = parse_yaml(raw, where)
    node = config
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(where, f"{here}: {part!r} is not an index of the list at "
                                         f"{'.'.join(parts[:depth])} (length {len(node)})")
            part = int(part)
        elif not isinstance(node, dict):
            raise ConfigError(where, f"{'.'.join(parts[:depth])} is {type(node).__name__} {node!r:.40}, not a "
                                     f"mapping: cannot set {here}")
        if last:
            node[part] = value
        else:
            if isinstance(node, dict) and node.get(part) is None:
                node[part] = {}
            node = node[part]


def dump_config(config: Mapping) -> str:
    """The config as YAML, keys in their given order; ``load_config`` reads it back unchanged."""
    return yaml.safe_dump(_plain(config), sort_keys=False, default_flow_style=False)


def _plain(node):
    if isinstance(node, Mapping):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(value) for value in node]
    return node


# ---- checking keys and types -------------------------------------------------------------------
def train_keys() -> list:
    """The top-level keys a config accepts: every TrainSpec field plus ``runner``."""
    return [f.name for f in dataclasses.fields(TrainSpec) if f.init and f.name != "stage_specs"] + list(EXTRA_KEYS)


def check_config(config: Mapping) -> None:
    """Unknown keys and wrong scalar types, at the top level and in every stage, before anything is built."""
    _check_keys(config, train_keys(), "", "top-level key")
    _check_scalars(config, TrainSpec, "")
    stages = config.get("stages")
    if stages is None:
        return
    if not isinstance(stages, Mapping) or not stages:
        raise ConfigError("stages", f"expected a mapping of stage name -> settings, got {stages!r:.60}")
    for name, stage in stages.items():
        path = join("stages", name)
        if not isinstance(stage, Mapping):
            raise ConfigError(path, f"expected a mapping of stage settings ({', '.join(STAGE_KEYS)}), got "
                                    f"{type(stage).__name__} {stage!r:.40}")
        _check_keys(stage, STAGE_KEYS, path, "stage key")
        _check_scalars(stage, StageSpec, path)


def _check_keys(node: Mapping, accepted, path: str, what: str) -> None:
    import difflib
    for key in node:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(join(path, key), f"unknown {what} {key!r}{hint}; accepted: {', '.join(accepted)}")


def _check_scalars(node: Mapping, spec_class, path: str) -> None:
    hints = typing.get_type_hints(spec_class)
    defaults = {f.name: f.default for f in dataclasses.fields(spec_class)}
    for key, value in node.items():
        kinds = _scalar_kinds(hints.get(key))
        if kinds is None or (value is None and defaults.get(key) is None):
            continue
        if not _matches(value, kinds):
            expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(join(path, key), f"expected {expected}, got {type(value).__name__} {value!r:.60}")


# ---- building the train(...) call --------------------------------------------------------------
def build_train_call(config: Mapping):
    """Seed, then build the runner and every component: returns ``(runner, train_kwargs)``.

    Python, numpy and torch are seeded with the config's ``seed`` (default: TrainSpec's) before the first
    component is built, so model initialisation is reproducible; ``train`` then seeds again as usual.
    Order: model, runner, then per level (top, then each stage) criterion, optimizer, scheduler, data,
    callbacks; so a script that calls ``set_seed(seed)`` and builds its model first gets the same weights.
    """
    from torchstage.rng import set_seed
    check_config(config)
    defaults = TrainSpec()
    set_seed(config.get("seed", defaults.seed), config.get("deterministic", defaults.deterministic))
    kwargs = {"model": _build_models(config["model"])} if "model" in config else {}
    runner = _build_runner(config.get("runner"))
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


def _build_runner(node):
    from torchstage.runner.runner import Runner
    if node is None or (isinstance(node, Mapping) and TARGET not in node):
        node = {TARGET: DEFAULT_RUNNER, **(node or {})}
    elif not is_component(node):
        raise ConfigError("runner", f"expected {{_target_: torchstage.SupervisedRunner, ...kwargs}}, got {node!r:.60}")
    runner = instantiate(node, "runner")
    if not isinstance(runner, Runner):
        raise ConfigError(join("runner", TARGET), f"{node[TARGET]} made a {type(runner).__name__}, not a "
                                                  f"torchstage Runner")
    return runner


def _components(node, path: str, build):
    """A component, or a mapping name -> component (several models/optimizers/...): ``build(node, path)`` each."""
    if is_component(node):
        return build(node, path)
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            if not is_component(value):
                hint = " (the import path key is spelled '_target_')" if "target" in str(key).lower() else ""
                raise ConfigError(join(path, key), f"expected a component {{_target_: import.path, ...kwargs}}"
                                                   f"{hint}, got {type(value).__name__} {value!r:.50}")
        return {key: build(value, join(path, key)) for key, value in node.items()}
    raise ConfigError(path, f"expected a component {{_target_: import.path, ...kwargs}} or a mapping of them, "
                            f"got {type(node).__name__} {node!r:.50}")


def _build_models(node):
    import torch
    if node is None:
        return None

    def build(item, path):
        model = instantiate(item, path)
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(join(path, TARGET), f"{item[TARGET]} made a {type(model).__name__}, not a "
                                                  f"torch.nn.Module")
        return model
    return _components(node, "model", build)


def _build_stage_values(node: Mapping, path: str, model, inherited: dict) -> dict:
    """The stage-level train arguments of ``node`` (the top level or one stage), built in a fixed order."""
    built_here = ("criterion", "optimizer", "scheduler", "datasets", "loaders", "callbacks")
    values = {key: instantiate(node[key], join(path, key))
              for key in STAGE_KEYS if key in node and key not in built_here}
    if "criterion" in node:
        values["criterion"] = instantiate(node["criterion"], join(path, "criterion"))
    if "optimizer" in node:
        values["optimizer"] = _build_optimizers(node["optimizer"], join(path, "optimizer"), model)
    optimizer = values.get("optimizer", inherited.get("optimizer"))
    if "scheduler" in node:
        values["scheduler"] = _build_schedulers(node["scheduler"], join(path, "scheduler"), optimizer)
    elif "optimizer" in node and inherited.get("scheduler_config") is not None:
        # a new optimizer gets its own copy of the inherited scheduler, never the one bound to the old optimizer
        values["scheduler"] = (None if optimizer is None else
                               _build_schedulers(inherited["scheduler_config"], "scheduler", optimizer))
    if "datasets" in node:
        values["datasets"] = _build_datasets(node["datasets"], join(path, "datasets"))
    if "loaders" in node:
        values["loaders"] = instantiate(node["loaders"], join(path, "loaders"))
    if "callbacks" in node:
        values["callbacks"] = _build_callbacks(node["callbacks"], join(path, "callbacks"))
    return values


def _build_optimizers(node, path: str, model):
    import itertools

    import torch
    if node is None:
        return None

    def build(item, where):
        names = item.get("params")
        if isinstance(model, Mapping):
            if names is None:
                raise ConfigError(join(where, "params"), f"the model is a dict ({', '.join(model)}): name the model(s) "
                                                         f"this optimizer updates, e.g. params: {next(iter(model))}")
            names = [names] if isinstance(names, str) else names
            if not isinstance(names, list) or any(n not in model for n in names):
                raise ConfigError(join(where, "params"), f"expected a model name or a list of them "
                                                         f"({', '.join(model)}), got {names!r}")
            params = list(itertools.chain.from_iterable(model[n].parameters() for n in names))
        elif names is not None:
            raise ConfigError(join(where, "params"), "leave params out: the optimizer gets the model's parameters "
                                                     "(params names a model only when model is a dict)")
        elif model is None:
            raise ConfigError(where, "an optimizer needs a model: add a model: {_target_: ...} key")
        else:
            params = model.parameters()
        rest = {k: v for k, v in item.items() if k != "params"}
        optimizer = instantiate(rest, where, params=params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(join(where, TARGET), f"{item[TARGET]} made a {type(optimizer).__name__}, not a "
                                                   f"torch.optim.Optimizer")
        return optimizer
    return _components(node, path, build)


def _build_schedulers(node, path: str, optimizer):
    if node is None:
        return None

    def build(item, where):
        name = item.get("optimizer")
        if optimizer is None:
            raise ConfigError(where, "a scheduler needs an optimizer, and none is configured here")
        if isinstance(optimizer, Mapping):
            if name not in optimizer:
                raise ConfigError(join(where, "optimizer"), f"the optimizer is a dict ({', '.join(optimizer)}): "
                                                            f"name the one to schedule, got {name!r}")
            chosen = optimizer[name]
        elif name is not None:
            raise ConfigError(join(where, "optimizer"), "leave optimizer out: the scheduler gets the run's "
                                                        "optimizer (it names one only when optimizer is a dict)")
        else:
            chosen = optimizer
        return instantiate({k: v for k, v in item.items() if k != "optimizer"}, where, optimizer=chosen)
    return _components(node, path, build)


def _build_datasets(node, path: str) -> dict:
    """``datasets:`` -> TrainSpec's datasets dict: loader options plus datasets, or ``get_datasets_fn`` + kwargs.

    ``{_target_: fn, batch_size: .., **fn_kwargs}`` becomes ``get_datasets_fn=fn`` (called in each worker, it
    returns a dict of datasets); otherwise each non-option key is a dataset component built now.
    """
    from torchstage.runner.dataset_loaders import FACTORY, _is_dataset
    if not isinstance(node, Mapping):
        raise ConfigError(path, f"expected a mapping like {{batch_size: 32, train: {{_target_: ...}}, valid: "
                                f"{{_target_: ...}}}}, got {type(node).__name__} {node!r:.50}")
    options = {key: value for key, value in node.items() if key in LOADER_OPTIONS}
    if TARGET in node:
        fn = import_target(node[TARGET], path)
        kwargs = {key: value for key, value in node.items() if key not in LOADER_OPTIONS and key != TARGET}
        check_arguments(fn, kwargs, path, node[TARGET])
        return {**options, FACTORY: fn, **{key: instantiate(value, join(path, key)) for key, value in kwargs.items()}}
    datasets = dict(options)
    for key, value in node.items():
        if key in LOADER_OPTIONS:
            continue
        if not is_component(value):
            raise ConfigError(join(path, key), f"neither a loader option ({', '.join(LOADER_OPTIONS)}) nor a "
                                               f"dataset {{_target_: ...}}; got {type(value).__name__} {value!r:.40}")
        dataset = instantiate(value, join(path, key))
        if not _is_dataset(dataset):
            raise ConfigError(join(path, key, ), f"{value[TARGET]} made a {type(dataset).__name__}, not a Dataset")
        datasets[key] = dataset
    return datasets


def _build_callbacks(node, path: str):
    from torchstage.callbacks.base import Callback
    if node is None:
        return None
    if isinstance(node, list):
        items = list(enumerate(node))
    elif isinstance(node, Mapping) and not is_component(node):
        items = list(node.items())
    else:
        raise ConfigError(path, "expected a list of callback components or a mapping name -> component (null "
                                f"removes a default callback), got {node!r:.60}")
    built = {}
    for key, value in items:
        if value is None and isinstance(node, Mapping):
            built[key] = None
            continue
        if not is_component(value):
            raise ConfigError(join(path, key), f"expected a callback {{_target_: ...}}, got {value!r:.50}")
        callback = instantiate(value, join(path, key))
        if not isinstance(callback, Callback):
            raise ConfigError(join(join(path, key), TARGET), f"{value[TARGET]} made a {type(callback).__name__}, "
                                                             f"not a torchstage Callback")
        built[key] = callback
    return list(built.values()) if isinstance(node, list) else built


# ---- running -----------------------------------------------------------------------------------
def train_from_config(config: Mapping, dry_run: bool = False, callbacks: Mapping = None):
    """``runner.train(**kwargs)`` built from ``config``; ``dry_run`` builds and prepares everything, trains nothing.

    ``callbacks``: name -> callback objects added to the config's (``torchstage tune`` adds its pruning one).

    With a ``logdir``, the merged config (seed filled in) is written to ``logdir/config.yml`` when the run
    starts, so ``torchstage run -C logdir/config.yml`` repeats it. Returns the runner.
    """
    from torchstage.runner.spec import make_spec
    config = with_defaults(config)
    runner, kwargs = build_train_call(config)
    if kwargs.get("logdir") is not None:
        kwargs["callbacks"] = _with_config_saver(kwargs.get("callbacks"), dump_config(config))
    if callbacks:
        given = kwargs.get("callbacks")
        kwargs["callbacks"] = ({**given, **callbacks} if isinstance(given, Mapping)
                               else [*(given or []), *callbacks.values()])
    try:
        spec = make_spec(runner, kwargs)  # the checks train() makes, reported as config errors
    except (TypeError, ValueError) as exc:  # "stages['ft']: datasets['batch_size'] ..." -> "stages.ft: datasets.batch_size"
        raise ConfigError("", re.sub(r"(?<=\w)\[(['\"])([^'\"\]]*)\1\]", r".\2", str(exc))) from exc
    if dry_run:
        from torchstage.runner.setup import prepare
        prepare(runner, spec)
        return runner
    return runner.train(**kwargs)


def with_defaults(config: Mapping) -> dict:
    """A copy of ``config`` with ``seed`` filled in, so a saved config does not depend on a default."""
    return {**config, "seed": config.get("seed", TrainSpec().seed)}


def _with_config_saver(callbacks, text: str):
    from torchstage.callbacks.config_saver import ConfigSaver
    saver = ConfigSaver(text)
    if callbacks is None:
        return {saver.name: saver}
    if isinstance(callbacks, Mapping):
        return {saver.name: saver, **callbacks}  # a user's `config: null` still removes it
    return [saver, *callbacks]
