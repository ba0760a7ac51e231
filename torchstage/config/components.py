"""Building a config's components: runner, models, optimizers on the model's parameters, schedulers on the
optimizer, datasets and callbacks; each checked to be what ``train()`` expects, naming the YAML path."""
import itertools
from collections.abc import Mapping

import torch

from torchstage.callbacks.base import Callback
from torchstage.config.instantiate import TARGET, ConfigError, check_arguments, import_target, instantiate, is_component, join
from torchstage.data.datasets import FACTORY, LOADER_OPTIONS, _is_dataset
from torchstage.runner.runner import Runner

DEFAULT_RUNNER = "torchstage.SupervisedRunner"


def build_runner(node):
    if node is None or (isinstance(node, Mapping) and TARGET not in node):
        node = {TARGET: DEFAULT_RUNNER, **(node or {})}
    elif not is_component(node):
        raise ConfigError("runner", f"expected {{_target_: torchstage.SupervisedRunner, ...kwargs}}, got {node!r:.60}")
    runner = instantiate(node, "runner")
    if not isinstance(runner, Runner):
        raise ConfigError(join("runner", TARGET), f"{node[TARGET]} made a {type(runner).__name__}, not a "
                                                  f"torchstage Runner")
    return runner


def runner_class(node) -> type:
    """The runner class that a config's ``runner`` node names, imported and not built (the core Runner where the
    node names no Runner class: ``build_runner`` says what is wrong with it)."""
    if node is None or (isinstance(node, Mapping) and TARGET not in node):
        node = {TARGET: DEFAULT_RUNNER}
    target = node.get(TARGET) if isinstance(node, Mapping) else None
    try:
        cls = import_target(target, "runner") if isinstance(target, str) else None
    except ConfigError:
        cls = None
    return cls if isinstance(cls, type) and issubclass(cls, Runner) else Runner


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


def build_models(node):
    if node is None:
        return None

    def build(item, path):
        model = instantiate(item, path)
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(join(path, TARGET), f"{item[TARGET]} made a {type(model).__name__}, not a "
                                                  f"torch.nn.Module")
        return model
    return _components(node, "model", build)


def build_optimizers(node, path: str, model):
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


def build_schedulers(node, path: str, optimizer):
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


def build_datasets(node, path: str) -> dict:
    """``datasets:`` -> TrainSpec's datasets dict: loader options plus datasets, or ``get_datasets_fn`` + kwargs.

    ``{_target_: fn, batch_size: .., **fn_kwargs}`` becomes ``get_datasets_fn=fn`` (called in each worker, it
    returns a dict of datasets); otherwise each non-option key is a dataset component built now.
    """
    if not isinstance(node, Mapping):
        raise ConfigError(path, f"expected a mapping like {{batch_size: 32, train: {{_target_: ...}}, valid: "
                                f"{{_target_: ...}}}}, got {type(node).__name__} {node!r:.50}")
    options = {key: value for key, value in node.items() if key in LOADER_OPTIONS}
    if TARGET in node:
        kwargs = {key: value for key, value in node.items() if key not in LOADER_OPTIONS and key != TARGET}
        fn = import_target(node[TARGET], path, kwargs)
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


def build_callbacks(node, path: str):
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
