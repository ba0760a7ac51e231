"""Honest resume: what the user passes now against what the checkpoint recorded, applied with a log line
or refused naming the checkpoint, the parameter and both values."""
import logging

import torch

from torchstage.files.checkpoint_format import CheckpointError, clean_state_dict
from torchstage.launch import membership
from torchstage.launch.resolve import restart_attempt, same_job
from torchstage.one_or_many import named
from torchstage.runner import global_batch
from torchstage.runner.state import data_layout

logger = logging.getLogger("torchstage")


def check_before_load(runner, checkpoint: dict, path: str) -> list:
    """Refuse a checkpoint this run cannot continue (another world size, unless the checkpoint is a sharded
    directory that reshards; parameter shapes; a changed learning rate under ``resume_lr='refuse'``); return the
    learning rates given now, to apply after loading if asked."""
    world = checkpoint.get("meta", {}).get("world_size", len(checkpoint["rng"]))
    if runner.engine.is_main:
        _report_nodes(runner, path, checkpoint.get("meta", {}).get("nodes"), world, checkpoint.get("meta", {}))
    if runner.engine.is_main:
        before = checkpoint.get("meta", {}).get("global_batch") or {
            "per_process": None, "data_parallel": data_layout(checkpoint)[0], "world_size": world}
        global_batch.report_resume(path, before, global_batch.record(runner))
    for name, model in named(runner.unwrapped_model, "model").items():
        _check_shapes(path, name, model, checkpoint["models"].get(name))
    _check_optimizer_kinds(runner, checkpoint, path)
    given = _hyperparameters(runner.optimizer)
    saved = {name: [_group_hyperparameters(group) for group in state["param_groups"]]
             for name, state in checkpoint["optimizers"].items()}
    policy = runner.spec.resume_lr
    for (name, index), values in given.items():
        old_groups = saved.get(name, [])
        old_values = old_groups[index] if index < len(old_groups) else {}
        for key, value in values.items():
            old = old_values.get(key)
            if key not in old_values or old == value:
                continue
            if key == "lr" and policy == "refuse" and _scheduled_without_initial_lr(runner, name):
                continue
            what = f"optimizer {name!r} param group {index}: {key} is {value} now but {old} in the checkpoint"
            if policy == "refuse":
                raise CheckpointError(f"cannot resume from {path}: {what}. Pass the checkpoint's {key}, or "
                                      f"resume_lr='new' to continue with {value}, or resume_lr='checkpoint' to keep "
                                      f"{old} (resume_lr decides for every optimizer hyperparameter)")
            if runner.engine.is_main:
                logger.warning("resume from %s: %s; using %s (resume_lr=%r)", path, what,
                               value if policy == "new" else old, policy)
    return given if policy == "new" else {}


def _report_nodes(runner, path: str, before, world: int, checkpoint_job: dict) -> None:
    """The nodes lost or joined since the checkpoint was written (an elastic job that lost one, or that one came back
    to), by host, agent and ranks, with this job's restart attempt; nothing when the same nodes go on. A checkpoint of
    another job (a plain resume by a new command) is compared by host only: its agents are new anyway."""
    now = runner.engine.nodes
    job = checkpoint_job.get("job") or {}
    said = membership.changes(before, now, by_agent=same_job(job) is True) if before and now else []
    if not said:
        return
    attempt = restart_attempt()
    logger.warning("resume from %s%s: the world that wrote it had %d node(s) and %d process(es), this one has %d and "
                   "%d: %s", path, f" (restart attempt {attempt} of this job)" if attempt else "", len(before), world,
                   len(now), runner.engine.world_size, "; ".join(said))


def apply_after_load(runner, given: dict) -> None:
    """``resume_lr='new'``: put the hyperparameters given now back over the loaded optimizer state."""
    optimizers = named(runner.optimizer, "optimizer")
    for (name, index), values in given.items():
        group = optimizers[name].param_groups[index]
        for key, value in values.items():
            if key == "lr":
                group["lr"] = value
                if "initial_lr" in group:
                    group["initial_lr"] = value
            else:
                group[key] = value
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
    if before is not None and before != runner.loop.num_epochs:
        logger.warning("resume from %s: num_epochs of stage %r is %d now but was %d; training to epoch %d",
                       path, loop["stage"], runner.loop.num_epochs, before, runner.loop.num_epochs)
    last_stage = runner.loop.stage_index == len(runner.spec.stage_specs) - 1
    reached = loop["epoch"] >= runner.loop.num_epochs if loop["epoch_done"] else loop["epoch"] > runner.loop.num_epochs
    if last_stage and reached:
        logger.warning("resume from %s: stage %r already trained %d epoch(s) and num_epochs=%d is reached; "
                       "nothing to train (raise num_epochs to train more)", path, loop["stage"], loop["epoch"],
                       runner.loop.num_epochs)


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


#: Param-group entries that are no hyperparameter: the parameters, and switches of the implementation only.
_NOT_HYPERPARAMETERS = frozenset({"params", "param_names", "foreach", "fused", "capturable", "differentiable",
                                  "initial_lr"})


def _group_hyperparameters(group: dict) -> dict:
    """A param group's hyperparameters as given by the user: ``lr`` at its ``initial_lr`` (a scheduler's decay is
    no change), and momentum/betas left out where a cyclic scheduler moves them (it keeps their bounds)."""
    moved = {"momentum", "betas"} if "max_momentum" in group or "base_momentum" in group else set()
    values = {key: value for key, value in group.items() if key not in _NOT_HYPERPARAMETERS | moved}
    if "lr" in values:
        values["lr"] = group.get("initial_lr", group["lr"])
    return values


def _hyperparameters(optimizer) -> dict:
    return {(name, i): _group_hyperparameters(group) for name, opt in named(optimizer, "optimizer").items()
            for i, group in enumerate(opt.param_groups)}


def _check_optimizer_kinds(runner, checkpoint: dict, path: str) -> None:
    """Another optimizer class than the checkpoint's (its state could not be put back) is refused, named."""
    kinds = checkpoint.get("meta", {}).get("optimizers", {})
    for name, optimizer in named(runner.optimizer, "optimizer").items():
        state = checkpoint["optimizers"].get(name)
        if state is None:
            continue
        now = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
        before = kinds.get(name)
        saved_keys = set(state["param_groups"][0]) - _NOT_HYPERPARAMETERS if state["param_groups"] else set()
        given_keys = set(optimizer.param_groups[0]) - _NOT_HYPERPARAMETERS
        # a checkpoint without the class (written before it was kept): another optimizer lacks keys on both sides
        # (a newer torch only adds some)
        if (before is not None and before != now) or (before is None and saved_keys - given_keys
                                                       and given_keys - saved_keys):
            was = f"{before}" if before is not None else f"an optimizer with hyperparameters {sorted(saved_keys)}"
            raise CheckpointError(
                f"cannot resume from {path}: optimizer {name!r} is {now} now but {was} in the checkpoint; its state "
                f"(momentum buffers, moments, step counts) belongs to that optimizer. Build the checkpoint's "
                f"optimizer, or start a new run (another logdir, or overwrite=True)")
        if len(state["param_groups"]) != len(optimizer.param_groups):
            raise CheckpointError(f"cannot resume from {path}: optimizer {name!r} has {len(optimizer.param_groups)} "
                                  f"param group(s) now but {len(state['param_groups'])} in the checkpoint")


def _scheduled_without_initial_lr(runner, name) -> bool:
    """A scheduler that keeps no initial_lr (ReduceLROnPlateau) changed the saved lr: not a user change."""
    optimizer = named(runner.optimizer, "optimizer")[name]
    return bool(named(runner.scheduler, "scheduler")) and "initial_lr" not in optimizer.param_groups[0]
