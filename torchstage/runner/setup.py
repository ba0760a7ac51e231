"""Turning a checked spec into a ready runner: engine, seed, logdir, models, loaders, chains, resume."""
import logging

import torch

from torchstage.distributed.engine import Engine
from torchstage.logdir_lock import LogdirLock
from torchstage.named import map_named
from torchstage.rng import set_seed
from torchstage.runner.amp import setup_amp
from torchstage.runner.chain import describe_chain, merge_chain
from torchstage.runner.dataset_loaders import build_loaders
from torchstage.runner.spec import check_valid_loader
from torchstage.runner.features import check_feature_chain, compile_models
from torchstage.runner.loop_state import LoopState
from torchstage.runner.resume import checkpoint_to_resume, restore

logger = logging.getLogger("torchstage")


def launch_or_run(runner, spec):
    """Run here, or as one rank of a world: given (``distributed=True``), already joined, or started by
    torchrun/srun as one of several processes (``distributed=None``, the default)."""
    from torchstage.distributed.env import launched_into_world
    from torchstage.distributed.world import in_world
    if spec.distributed or in_world() or (spec.distributed is None and launched_into_world()):
        from torchstage.runner.distributed import train_distributed
        return train_distributed(runner, spec)
    prepare(runner, spec)
    return runner.run()


def prepare(runner, spec, engine: Engine = None) -> None:
    """Everything before the first event: no training happens here, every user error is raised here."""
    from torchstage.logging_setup import ensure_console_handler
    ensure_console_handler()
    runner.spec = spec
    runner.engine = engine or runner.engine or Engine()
    runner.engine.channels_last, runner.engine.prefetch = bool(spec.channels_last), bool(spec.prefetch)
    set_seed(spec.seed + runner.engine.rank, spec.deterministic)
    runner.model = spec.model
    setup_amp(runner, spec.amp)
    for stage in spec.stage_specs:
        if isinstance(stage.criterion, torch.nn.Module):
            stage.criterion.to(runner.engine.device)
    _place_models(runner)
    compile_models(runner, spec.compile)
    runner.stage_loaders = _stage_loaders(spec, runner.engine)
    for stage, loaders in zip(spec.stage_specs, runner.stage_loaders):
        check_valid_loader(stage, loaders)
    defaults = runner.get_default_callbacks(spec)
    runner.stage_callbacks = [  # defaults, then train-level, then the stage's own callbacks, by name
        merge_chain(defaults, spec.callbacks, stage.callbacks if stage.callbacks is not spec.callbacks else None)
        for stage in spec.stage_specs]
    for stage, chain in zip(spec.stage_specs, runner.stage_callbacks):
        _check_valid_metric(runner, stage, chain)
    check_feature_chain(spec, runner.stage_callbacks)
    runner.loop = LoopState()
    runner.enter_stage(0)
    if spec.logdir is not None:  # another run writing there is named first; run() takes the lock
        LogdirLock.on_main_rank(spec.logdir, runner.engine, take=False)
    found = checkpoint_to_resume(spec, runner.engine, runner.stage_callbacks)
    if found is not None:
        restore(runner, found[1], path=found[0])
    if runner.engine.is_main:
        logger.info("callbacks of stage %r:\n%s", runner.stage_key, describe_chain(runner.callbacks))


def _stage_loaders(spec, engine) -> list:
    """Each stage's loaders; stages sharing one ``datasets`` dict share its loaders (a factory runs once)."""
    built = {}
    for stage in spec.stage_specs:
        if stage.loaders is None and id(stage.datasets) not in built:
            built[id(stage.datasets)] = build_loaders(stage.datasets, engine, seed=spec.seed)
    return [stage.loaders if stage.loaders is not None else built[id(stage.datasets)] for stage in spec.stage_specs]


def _place_models(runner) -> None:
    runner.model = map_named(runner.engine.prepare_model, runner.model)


def _check_valid_metric(runner, stage, chain) -> None:
    if runner.produces is None:
        return  # a custom handle_batch: checked when the first loader ends
    produced = set(runner.produces).union(*(cb.produces for cb in chain.values()))
    if stage.valid_metric not in produced:
        prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
        raise ValueError(f"{prefix}valid_metric={stage.valid_metric!r} is produced by no callback; the chain "
                         f"produces {sorted(produced)}. Add a metric callback that writes it, or pick one of those")


