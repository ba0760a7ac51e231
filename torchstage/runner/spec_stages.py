"""The data and stages part of ``train()``'s arguments: the model, what each stage runs (loaders or datasets,
criterion, optimizer, scheduler, callbacks, epochs, the validation choice) and the ``stages`` that override them."""
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch

from torchstage.data.datasets import FACTORY, dataset_loader_names
from torchstage.runner.chain import check_callbacks
from torchstage.runner.errors import RunnerException


@dataclass
class StageSpec:
    """One stage: its epochs, data, criterion, optimizer, scheduler and extra callbacks."""

    name: str
    num_epochs: int
    loaders: Optional[Mapping] = None
    datasets: Optional[dict] = None
    criterion: Any = None
    optimizer: Any = None
    scheduler: Any = None
    callbacks: Any = None
    valid_loader: str = "valid"
    valid_metric: str = "loss"
    minimize_valid_metric: bool = True


#: What a stage may set (each inherited from the top-level train() arguments when omitted).
STAGE_KEYS = tuple(f.name for f in dataclasses.fields(StageSpec) if f.name != "name")
#: Name prefixes of loaders that only evaluate; a run whose loaders all have one trains nothing, on purpose.
EVALUATION_PREFIXES = ("val", "test", "eval", "infer", "predict")


def check_data(spec, runner) -> None:
    """The model, then each stage resolved (what it inherits filled in: ``spec.stage_specs``) and checked: epochs,
    loaders or datasets and their names, callbacks. What a stage needs of the runner and the strategy, and its
    criterion, optimizer and scheduler against the model, are rules between parts
    (:mod:`torchstage.runner.spec_rules`)."""
    _check_model(spec.model)
    spec.stage_specs = _resolve_stages(spec)
    for stage in spec.stage_specs:
        _check_stage(stage)


def check_built_loaders(stage: StageSpec, loaders) -> None:
    """The loader names of a stage whose ``datasets`` come from a ``get_datasets_fn``, known once it has run (the
    others were checked with the spec)."""
    if stage.loaders is None and FACTORY in stage.datasets:
        check_loader_names(stage, loaders)


def check_loader_names(stage: StageSpec, names) -> None:
    """A loader trains when its name starts with ``train``: loaders of which none trains are refused unless every
    one is named as an evaluation loader (``valid``, ``test``...: a pass that trains nothing, on purpose). And
    ``valid_loader`` must name one of the loaders."""
    prefix = _prefix(stage)
    names = list(names)
    unclear = [name for name in names if not str(name).startswith(("train", *EVALUATION_PREFIXES))]
    if unclear and not any(str(name).startswith("train") for name in names):
        raise ValueError(f"{prefix}no loader trains: the loaders are {names}, and a loader trains when its name "
                         f"starts with 'train' ('train', 'train_extra'...; the others only evaluate), so "
                         f"{unclear[0]!r} would train nothing. Name the training loader 'train' (loaders={{'train': "
                         f"..., 'valid': ...}}), or evaluate without training with runner.evaluate_loader(loader)")
    if stage.valid_loader not in names:
        raise ValueError(f"{prefix}valid_loader={stage.valid_loader!r} is not among the loaders {names}; "
                         f"pass valid_loader=<one of them>")


def _prefix(stage: StageSpec) -> str:
    return "" if stage.name == "main" else f"stages[{stage.name!r}]: "


def _resolve_stages(spec) -> list:
    top = {key: getattr(spec, key) for key in STAGE_KEYS}
    if spec.stages is None:
        return [StageSpec(name="main", **top)]
    if not isinstance(spec.stages, Mapping) or not spec.stages:
        raise TypeError(f"stages must be a non-empty mapping {{name: {{num_epochs, loaders, ...}}}}, "
                        f"got {type(spec.stages).__name__}")
    stages = []
    for name, overrides in spec.stages.items():
        if not isinstance(overrides, Mapping):
            raise TypeError(f"stages[{name!r}] must be a mapping of stage settings, got {type(overrides).__name__}")
        unknown = sorted(set(overrides) - set(STAGE_KEYS))
        if unknown:
            raise ValueError(f"stages[{name!r}] has unknown key(s) {unknown}; accepted: {', '.join(STAGE_KEYS)}")
        values = {**top, **overrides}
        if "loaders" in overrides:
            values["datasets"] = overrides.get("datasets")
        if "datasets" in overrides:
            values["loaders"] = overrides.get("loaders")
        stages.append(StageSpec(name=str(name), **values))
    return stages


def _check_stage(stage: StageSpec) -> None:
    where = "num_epochs" if stage.name == "main" else f"stages[{stage.name!r}]['num_epochs']"
    if isinstance(stage.num_epochs, bool) or not isinstance(stage.num_epochs, int) or stage.num_epochs < 1:
        raise ValueError(f"{where} must be an integer >= 1, got {stage.num_epochs!r}")
    prefix = _prefix(stage)
    if stage.loaders is not None and stage.datasets is not None:
        raise ValueError(f"{prefix}give either loaders or datasets, not both")
    if stage.loaders is None and stage.datasets is None:
        raise ValueError(f"{prefix}loaders is required: a mapping such as {{'train': DataLoader, 'valid': "
                         f"DataLoader}} (or pass datasets={{'batch_size': .., 'train': .., 'valid': ..}})")
    if stage.loaders is not None:
        names = _check_loaders(stage.loaders, prefix)
    else:
        names = dataset_loader_names(stage.datasets, prefix)
    if names is not None:  # None: a get_datasets_fn, checked once it has run (still before training)
        check_loader_names(stage, names)
    check_callbacks(stage.callbacks, prefix)


def trains(stage: StageSpec) -> bool:
    """Whether ``stage`` may train: a loader of it starts with ``train``, or its loaders are known only once a
    ``get_datasets_fn`` ran."""
    names = list(stage.loaders) if stage.loaders is not None else dataset_loader_names(stage.datasets, "")
    return names is None or any(str(name).startswith("train") for name in names)


def _check_loaders(loaders, prefix: str) -> list:
    if not isinstance(loaders, Mapping) or not loaders:
        raise TypeError(f"{prefix}loaders must be a non-empty mapping of name -> iterable of batches "
                        f"(e.g. {{'train': DataLoader, 'valid': DataLoader}}), got {loaders!r:.80}")
    for name, loader in loaders.items():
        if not isinstance(name, str):
            raise TypeError(f"{prefix}loaders keys must be strings, got {name!r}")
        if not hasattr(loader, "__iter__") or isinstance(loader, (str, bytes, torch.Tensor)):
            hint = "; pass datasets={...} to have torchstage build loaders" if hasattr(loader, "__getitem__") else ""
            raise TypeError(f"{prefix}loaders[{name!r}] is a {type(loader).__name__}, expected an iterable "
                            f"of batches such as a DataLoader{hint}")
        try:
            size = len(loader)
        except TypeError:
            continue
        if size == 0:
            raise RunnerException(f"{prefix}loaders[{name!r}] is empty (len 0): it would yield no batch")
    return list(loaders)


def _check_model(model) -> None:
    models = model.values() if isinstance(model, Mapping) else [model]
    if model is None or (isinstance(model, Mapping) and not model):
        raise ValueError("model is required: a torch.nn.Module or a dict of name -> torch.nn.Module")
    for m in models:
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or a dict of them, got {type(m).__name__}")
