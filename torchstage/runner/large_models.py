"""What a run does for models larger than a rank, between placing the models and the strategy's setup: activation
checkpointing handed to the strategy, the initial weights (``init_from`` read into a model built on a device now, or
handed to the strategy for a model on the meta device, which it materialises shard by shard), and ``dry_run``'s
memory plan."""
import logging
import os

import torch

from torchstage.one_or_many import map_named, named
from torchstage.runner.spec_large_models import init_paths, open_source
from torchstage.strategies.materialize import InitialWeights, is_meta, named_tensors

logger = logging.getLogger("torchstage")


def checkpoint_activations(runner, spec) -> None:
    """Each model's blocks of ``activation_checkpointing`` under activation checkpointing, as its strategy orders it
    (now, before compile; or at setup, after tensor parallelism)."""
    strategy = runner.engine.strategy
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
    runner.engine.strategy.initial_weights = InitialWeights(spec.init_weights, sources, spec.seed)


def log_memory_plan(runner, spec):
    """``train(dry_run=True)``: log each rank's memory plan for the run's strategy and world, from the model as given
    (its shapes; built on the meta device or not), and return the runner without training."""
    from torchstage.strategies.memory_plan import plan_memory  # the estimator: a fake world of one process
    model = named(spec.model, "model")
    if len(model) != 1:
        raise ValueError("dry_run=True plans one model; the run has " + ", ".join(sorted(model)))
    stage = spec.stage_specs[0]
    batch = _first_batch(stage)
    plan = plan_memory(next(iter(model.values())), spec.strategy, world_size=_world_size(spec), optimizer=stage.optimizer,
                       inputs=_inputs(runner, batch), amp=spec.amp, activation_checkpointing=spec.activation_checkpointing,
                       node_size=_node_size(spec))
    logger.warning("%s", plan)
    runner.memory_plan = plan
    return runner


def _world_size(spec) -> int:
    """The processes the run would start: ``nprocs``, the launcher's ``WORLD_SIZE``, the visible GPUs, else one."""
    if spec.nprocs:
        return int(spec.nprocs)
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    if os.environ.get("TORCHSTAGE_NPROC"):
        return int(os.environ["TORCHSTAGE_NPROC"])
    return max(1, torch.cuda.device_count()) if spec.distributed else 1


def _node_size(spec):
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local else None


def _first_batch(stage):
    """The first batch of the stage's first train loader (user loaders only), or None."""
    loaders = stage.loaders or {}
    for key, loader in loaders.items():
        if str(key).startswith("train"):
            return next(iter(loader), None)
    return None


def _inputs(runner, batch):
    """What the runner would call its model with on ``batch``: the input of a ``(x, y)`` batch, or the input key(s)
    of a dict batch (a SupervisedRunner's); None when unknown."""
    if batch is None:
        return None
    key = getattr(runner, "input_key", None)
    if isinstance(batch, dict) and key is not None:
        return batch[key] if isinstance(key, str) else {k: batch[k] for k in key}
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch
