"""Honest resume: what the user passes now against what the checkpoint recorded, applied with a log line
or refused naming the checkpoint, the parameter and both values."""
import logging
import os

import torch

from torchstage.files.format import CheckpointError, clean_state_dict
from torchstage.named import named

logger = logging.getLogger("torchstage")


def check_before_load(runner, checkpoint: dict, path: str) -> list:
    """Refuse a checkpoint this run cannot continue (another world size, unless the checkpoint is a sharded
    directory that reshards; parameter shapes; a changed learning rate under ``resume_lr='refuse'``); return the learning rates given now, to apply after loading if asked."""
    world = checkpoint.get("meta", {}).get("world_size", len(checkpoint["rng"]))
    if world != runner.engine.world_size and not os.path.isdir(path):  # a sharded (FSDP) checkpoint reshards
        raise CheckpointError(f"cannot resume from {path}: world size is {runner.engine.world_size} now but "
                              f"{world} in the checkpoint; resume it with {world} process(es)")
    for name, model in named(runner.unwrapped_model, "model").items():
        _check_shapes(path, name, model, checkpoint["models"].get(name))
    given = _learning_rates(runner.optimizer)
    saved = {name: [_lr(group) for group in state["param_groups"]]
             for name, state in checkpoint["optimizers"].items()}
    policy = runner.spec.resume_lr
    for (name, index), lr in given.items():
        old = saved.get(name, [])[index] if index < len(saved.get(name, [])) else None
        if old is None or old == lr or (policy == "refuse" and _scheduled_without_initial_lr(runner, name)):
            continue
        what = f"optimizer {name!r} param group {index}: lr is {lr} now but {old} in the checkpoint"
        if policy == "refuse":
            raise CheckpointError(f"cannot resume from {path}: {what}. Pass the checkpoint's lr, or "
                                  f"resume_lr='new' to continue with {lr}, or resume_lr='checkpoint' to keep {old}")
        if runner.engine.is_main:
            logger.warning("resume from %s: %s; using %s (resume_lr=%r)", path, what,
                           lr if policy == "new" else old, policy)
    return given if policy == "new" else {}


def apply_after_load(runner, given: dict) -> None:
    """``resume_lr='new'``: put the learning rates given now back over the loaded optimizer state."""
    optimizers = named(runner.optimizer, "optimizer")
    for (name, index), lr in given.items():
        group = optimizers[name].param_groups[index]
        group["lr"] = lr
        if "initial_lr" in group:
            group["initial_lr"] = lr
    for scheduler in named(runner.scheduler, "scheduler").values():
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [group.get("initial_lr", group["lr"]) for group in scheduler.optimizer.param_groups]


def report_epochs(runner, checkpoint: dict, path: str) -> None:
    """Say when ``num_epochs`` differs from the checkpoint's, or is already reached (nothing left to train)."""
    loop, meta = checkpoint["loop"], checkpoint.get("meta", {})
    recorded = dict(zip(meta.get("stage_names", []), meta.get("stage_epochs", [])))
    before = recorded.get(loop["stage"])
    if not runner.engine.is_main:
        return
    if before is not None and before != runner.num_epochs:
        logger.warning("resume from %s: num_epochs of stage %r is %d now but was %d; training to epoch %d",
                       path, loop["stage"], runner.num_epochs, before, runner.num_epochs)
    last_stage = runner.stage_index == len(runner.spec.stage_specs) - 1
    reached = loop["epoch"] >= runner.num_epochs if loop["epoch_done"] else loop["epoch"] > runner.num_epochs
    if last_stage and reached:
        logger.warning("resume from %s: stage %r already trained %d epoch(s) and num_epochs=%d is reached; "
                       "nothing to train (raise num_epochs to train more)", path, loop["stage"], loop["epoch"],
                       runner.num_epochs)


def _check_shapes(path, name, model, state) -> None:
    if state is None:
        return  # reported by the loader with the names the checkpoint has
    saved = {k: tuple(v.shape) for k, v in clean_state_dict(state).items() if isinstance(v, torch.Tensor)}
    now = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) != now.get(key):
            here = "missing" if key not in now else f"shape {now[key]}"
            there = "missing" if key not in saved else f"shape {saved[key]}"
            raise CheckpointError(f"cannot resume from {path}: model {name!r} parameter {key!r} is {here} now "
                                  f"but {there} in the checkpoint; the architecture changed")


def _lr(group: dict):
    return group.get("initial_lr", group.get("lr"))


def _learning_rates(optimizer) -> dict:
    return {(name, i): _lr(group) for name, opt in named(optimizer, "optimizer").items()
            for i, group in enumerate(opt.param_groups)}


def _scheduled_without_initial_lr(runner, name) -> bool:
    """A scheduler that keeps no initial_lr (ReduceLROnPlateau) changed the saved lr: not a user change."""
    optimizer = named(runner.optimizer, "optimizer")[name]
    return bool(named(runner.scheduler, "scheduler")) and "initial_lr" not in optimizer.param_groups[0]
