"""What a run does for models larger than a rank, between placing the models and the strategy's setup: activation
checkpointing handed to the strategy, the initial weights (``init_from`` read into a model built on a device now, or
handed to the strategy for a model on the meta device, which it materialises shard by shard), and ``dry_run``'s
memory plan."""
import logging
import os

import torch

from torchstage.logging_setup import ensure_console_handler
from torchstage.one_or_many import map_named, named
from torchstage.runner.spec_large_models import init_paths, open_source
from torchstage.strategies.materialize import InitialWeights, is_meta, named_tensors

logger = logging.getLogger("torchstage")


def checkpoint_activations(runner, spec) -> None:
    """Each model's blocks of ``activation_checkpointing`` under activation checkpointing, as its strategy orders it
    (now, before compile; or at setup, after tensor parallelism)."""
    strategy = runner.strategy
    classes = spec.activation_checkpointing or ()
    runner.model = map_named(lambda model: strategy.checkpoint_activations(model, classes), runner.model)


def set_initial_weights(runner, spec, resumed: bool) -> None:
    """Where each model's first values come from: a resumed checkpoint (then ``init_from`` is not read), else
    ``init_from``, read now into a model on a device, or at setup into the shards of a model on the meta device."""
    models = named(runner.unwrapped_model, "model")
    paths = {} if resumed else init_paths(spec.init_from, models)
    if resumed and spec.init_from is not None and runner.engine.is_main:
        logger.info("init_from=%r is not read: the run resumes from its checkpoint", spec.init_from)
    sources = {}
    for name, path in paths.items():
        source = open_source(path, name)
        if is_meta(models[name]):
            sources[name] = source  # read by the strategy, into each rank's shards
            continue
        targets = named_tensors(models[name], persistent_only=True)
        try:
            source.load_into({key: targets[key] for key in source.shapes() if key in targets})
        finally:
            source.close()
        if runner.engine.is_main:
            logger.info("model %r: initial weights from %s", name, path)
    runner.strategy.initial_weights = InitialWeights(spec.init_weights, sources, spec.seed)


def log_memory_plan(runner, spec):
    """``train(dry_run=True)``: log each rank's memory plan (:func:`memory_plan`) and return the runner, which holds
    it as ``runner.memory_plan``, without training."""
    ensure_console_handler()
    runner.memory_plan = memory_plan(runner, spec)
    logger.info("%s", runner.memory_plan)
    return runner


def memory_plan(runner, spec, world_size: int = None, node_size: int = None, device: str = None):
    """The :class:`~torchstage.strategies.memory_plan.MemoryPlan` of the run ``spec`` describes, from its model's
    shapes, one batch of its first stage's train data and its optimizer, on ``world_size`` processes (default: those
    it would start)."""
    from torchstage.strategies.memory_plan import plan_memory  # the estimator: a fake world of one process
    models = named(spec.model, "model")
    if len(models) != 1:
        raise ValueError(f"the memory plan is made for one model; the run has {sorted(models)}")
    stage = spec.stage_specs[0]
    batch = _first_batch(stage)
    inputs, targets = _inputs(runner, batch)
    return plan_memory(next(iter(models.values())), spec.strategy, world_size=world_size or _world_size(spec),
                       optimizer=next(iter(named(stage.optimizer, "optimizer").values()), None), inputs=inputs,
                       criterion=stage.criterion if callable(stage.criterion) else None, targets=targets,
                       amp=spec.amp, activation_checkpointing=spec.activation_checkpointing,
                       node_size=node_size or _node_size(), device=device)


def _world_size(spec) -> int:
    """The processes the run would start: ``nprocs``, the launcher's ``WORLD_SIZE``, the visible GPUs, else one."""
    if spec.nprocs:
        return int(spec.nprocs)
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    if os.environ.get("TORCHSTAGE_NPROC"):
        return int(os.environ["TORCHSTAGE_NPROC"])
    return max(1, torch.cuda.device_count()) if spec.distributed else 1


def _node_size():
    """The processes of a node the launcher says (torchrun's ``LOCAL_WORLD_SIZE``), or None."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local else None


def _first_batch(stage):
    """The first batch of the stage's first train loader (or of its ``datasets``' train dataset, collated), or
    None."""
    if stage.loaders is not None:
        return next((next(iter(loader), None) for key, loader in stage.loaders.items()
                     if str(key).startswith("train")), None)
    datasets = stage.datasets if isinstance(stage.datasets, dict) else {}
    dataset = next((d for key, d in datasets.items() if str(key).startswith("train")), None)
    if dataset is None or not hasattr(dataset, "__getitem__"):
        return None
    from torch.utils.data import default_collate
    return default_collate([dataset[i] for i in range(min(int(datasets.get("batch_size", 1)), len(dataset)))])


def _inputs(runner, batch) -> tuple:
    """``(inputs, targets)``: what the runner would call its model with on ``batch`` and the targets its criterion
    gets (a SupervisedRunner's keys, or an ``(x, y)`` batch); ``(None, None)`` when unknown."""
    if batch is None:
        return None, None
    key, target = getattr(runner, "input_key", None), getattr(runner, "target_key", None)
    if isinstance(batch, dict) and key is not None:
        inputs = batch[key] if isinstance(key, str) else {k: batch[k] for k in key}
        return inputs, batch.get(target)
    if isinstance(batch, (tuple, list)):
        return batch[0], batch[1] if len(batch) > 1 else None
    return batch, None
