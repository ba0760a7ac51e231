"""Turning a checked spec into a ready runner: engine, seed, logdir, models, loaders, chains, resume."""
import logging
import os

import torch

from torchstage.checkpoint import load_checkpoint
from torchstage.distributed.engine import Engine
from torchstage.rng import set_seed
from torchstage.runner.amp import setup_amp
from torchstage.runner.chain import describe_chain
from torchstage.runner.dataset_loaders import build_loaders
from torchstage.runner.spec import check_valid_loader
from torchstage.runner.features import compile_models

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
    checkpoint = _resume_checkpoint(spec, runner.engine)
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
    runner.stage_callbacks = spec.stage_chains
    for stage, chain in zip(spec.stage_specs, runner.stage_callbacks):
        _check_valid_metric(runner, stage, chain)
    runner.stage_index, runner.epoch_done, runner.train_batches_done = 0, True, 0
    runner.global_epoch_step = runner.global_batch_step = runner.global_sample_step = 0
    runner.epoch_metrics, runner.loader_metrics, runner.batch_metrics = {}, {}, {}
    runner.resume_point = runner.stop_request = runner.loader_start_rng = None
    runner.enter_stage(0)
    if checkpoint is not None:
        from torchstage.runner.resume import restore
        restore(runner, checkpoint)
    if runner.engine.is_main and spec.verbose:
        logger.info("callbacks of stage %r:\n%s", runner.stage_key, describe_chain(runner.callbacks))


def _stage_loaders(spec, engine) -> list:
    """Each stage's loaders; stages sharing one ``datasets`` dict share its loaders (a factory runs once)."""
    built = {}
    for stage in spec.stage_specs:
        if stage.loaders is None and id(stage.datasets) not in built:
            built[id(stage.datasets)] = build_loaders(stage.datasets, engine, seed=spec.seed)
    return [stage.loaders if stage.loaders is not None else built[id(stage.datasets)] for stage in spec.stage_specs]


def _place_models(runner) -> None:
    prepare_model = runner.engine.prepare_model
    if isinstance(runner.model, dict):
        runner.model = {k: prepare_model(m) for k, m in runner.model.items()}
    else:
        runner.model = prepare_model(runner.model)


def _check_valid_metric(runner, stage, chain) -> None:
    if runner.produces is None:
        return  # a custom handle_batch: checked when the first loader ends
    produced = set(runner.produces).union(*(cb.produces for cb in chain.values()))
    if stage.valid_metric not in produced:
        prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
        raise ValueError(f"{prefix}valid_metric={stage.valid_metric!r} is produced by no callback; the chain "
                         f"produces {sorted(produced)}. Add a metric callback that writes it, or pick one of those")


def _resume_checkpoint(spec, engine):
    """The checkpoint to resume from, or None; refuses to overwrite an earlier run's checkpoints."""
    last = os.path.join(spec.logdir, "checkpoints", "last.pth") if spec.logdir is not None else None
    # The main rank looks before anyone can write, and every rank acts on what it saw: a slower rank
    # must not find the last.pth that this very run has just written.
    last_exists = engine.broadcast_object(last is not None and os.path.exists(last))
    if spec.resume is None:
        if last_exists and not spec.overwrite:
            raise FileExistsError(f"logdir {str(spec.logdir)!r} already holds a run ({last}); pass resume='last' to "
                                  f"continue it, overwrite=True to replace it, or another logdir")
        return None
    if spec.resume == "last":
        if last is None:
            raise ValueError("resume='last' needs a logdir to find checkpoints/last.pth in")
        if not last_exists:
            logger.info("resume='last': no checkpoint in %s yet, starting a new run", spec.logdir)
            return None
        return _resumed(last, engine)
    return _resumed(os.fspath(spec.resume), engine)


def _resumed(path: str, engine) -> dict:
    """Load the checkpoint to resume from and say, on the main rank, where the run goes on."""
    checkpoint = load_checkpoint(path)
    loop = checkpoint.get("loop", {})
    if engine.is_main:
        logger.info("resuming from %s at stage %r, epoch %s, batch %s%s", path, loop.get("stage"), loop.get("epoch"),
                    loop.get("batch"), " (epoch complete)" if loop.get("epoch_done") else "")
    return checkpoint
