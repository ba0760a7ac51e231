"""The large-models part of ``train()``'s arguments: where the initial weights come from (``init_from``, a checkpoint
or a Hugging Face folder; ``init_weights``, how a model built on the meta device is initialised), activation
checkpointing, and the memory plan instead of a run (``dry_run``). Keys that do not match the model, a meta model
under a strategy that cannot materialise it, and modules nothing can initialise are refused here, before any process
starts."""
import os

from torchstage.files.checkpoint_format import CheckpointError
from torchstage.files.pretrained import check_keys, open_weights
from torchstage.one_or_many import named
from torchstage.strategies.activation_checkpointing import check_classes
from torchstage.strategies.materialize import check_initializable, is_meta, named_tensors, refuse_meta, tied_names


def check_large_models(spec, runner) -> None:
    """``init_from`` (a path, or model name -> path), ``init_weights`` (``fn(module)``), ``activation_checkpointing``
    (block classes), ``dry_run`` (log the memory plan and return): each argument's type; the sources' keys against
    the models; a meta model's strategy and initialisation."""
    if spec.init_weights is not None and not callable(spec.init_weights):
        raise TypeError(f"init_weights must be a function fn(module) that initialises a module's own parameters "
                        f"and buffers (as model.apply(fn) calls it), got {spec.init_weights!r}")
    if not isinstance(spec.dry_run, bool):
        raise TypeError(f"dry_run must be True (print each rank's memory plan and return without training) or "
                        f"False, got {spec.dry_run!r}")
    if spec.activation_checkpointing is not None:
        spec.activation_checkpointing = check_classes(spec.activation_checkpointing, spec.model)
    models = named(spec.model, "model") if spec.model is not None else {}
    paths = init_paths(spec.init_from, models)
    for name, model in models.items():
        label = "the model" if len(models) == 1 else f"model {name!r}"
        covered = ()
        if name in paths:  # checksums verified here, before training; the ranks then read only their slices
            source = open_source(paths[name], name, verify=True)
            try:
                check_keys(source, {k: tuple(t.shape) for k, t in named_tensors(model, True).items()},
                           tied_names(model), label)
                covered = set(source.shapes())
            finally:
                source.close()
        if is_meta(model) and not spec.dry_run:  # a plan is made of any strategy, and initialises nothing
            if spec.strategy.meta_refusal is not None:
                refuse_meta(model, f"{type(spec.strategy).__name__}: {spec.strategy.meta_refusal}")
            check_initializable(model, spec.init_weights, set(covered) | set(tied_names(model)), label)


def init_paths(init_from, models: dict) -> dict:
    """Model name -> the path its initial weights come from (``init_from`` a path: the run's one model)."""
    if init_from is None:
        return {}
    if isinstance(init_from, (str, os.PathLike)):
        if len(models) > 1:
            raise ValueError(f"init_from={os.fspath(init_from)!r} is one path, but the run has models "
                             f"{sorted(models)}; give init_from as a dict of model name -> path")
        return {next(iter(models), "model"): os.fspath(init_from)}
    if isinstance(init_from, dict):
        unknown = sorted(set(init_from) - set(models))
        if unknown:
            raise ValueError(f"init_from names models {unknown} that the run does not have ({sorted(models)})")
        return {k: os.fspath(v) for k, v in init_from.items()}
    raise TypeError(f"init_from must be a path (a .pth, a checkpoint directory, a .safetensors file or a Hugging Face "
                    f"folder) or a dict of model name -> path, got {type(init_from).__name__}")


def open_source(path: str, name: str, verify: bool = False):
    """The weights source of ``path`` (``verify``: its checksums too); a source that cannot be read is a ValueError
    naming the argument."""
    try:
        return open_weights(path, name, verify)
    except CheckpointError as e:
        raise ValueError(str(e) if "init_from" in str(e) else f"init_from={path!r}: {e}") from None
