"""The global batch a run trains with (per-process batch x data-parallel ranks x accumulation), recorded in each
checkpoint, and what a resume says when it differs from the checkpoint's own record: the right numbers, or nothing
to scale when it is the same."""
import logging

logger = logging.getLogger("torchstage")
RNG_NOTE = "each rank's random streams are derived anew (seed + data-parallel rank + 1000003 x global batch)"


def record(runner) -> dict:
    """``{"per_process", "data_parallel", "accumulation", "world_size"}`` of this run's current stage: the first train
    loader's batch size (None: unknown, a batch sampler), the data-parallel ranks and the stepping callbacks'
    accumulation (1 when nothing declares one)."""
    sizes = [getattr(loader, "batch_size", None) for name, loader in (runner.loop.loaders or {}).items()
             if str(name).startswith("train")]
    stage = runner.spec.stage_specs[runner.loop.stage_index] if runner.spec.stage_specs else None
    steps = [plan.accumulation_steps for callback in (runner.callbacks or {}).values()
             for plan in (callback.step_plans(stage) if stage is not None else ())]
    return {"per_process": next((size for size in sizes if size), None), "data_parallel": runner.engine.dp_size,
            "accumulation": max(steps, default=1), "world_size": runner.engine.world_size}


def size(batch: dict):
    """The global batch of a record (None when its per-process batch is unknown)."""
    if not batch or batch.get("per_process") is None:
        return None
    return batch["per_process"] * batch["data_parallel"] * batch.get("accumulation", 1)


def report_resume(path: str, before: dict, now: dict) -> None:
    """Log what a resume from ``path`` changes: a warning with both global batches and the linear-rule factor when
    the global batch changed, an info line when only the processes changed, nothing when nothing did."""
    world_changed = (before["world_size"], before["data_parallel"]) != (now["world_size"], now["data_parallel"])
    unit = "process" if (before["world_size"], now["world_size"]) == (before["data_parallel"], now["data_parallel"]) \
        else "data-parallel rank"
    world = ""
    if world_changed:
        world = f"written by {before['world_size']} process(es), resumed by {now['world_size']}" + (
            "" if unit == "process" else f" ({before['data_parallel']} -> {now['data_parallel']} data-parallel)")
    old, new = size(before), size(now)
    if old is None or new is None:
        if world_changed:
            logger.warning("resume from %s: %s; the checkpoint does not record its global batch: scale what depends "
                           "on it, such as the learning rate, by hand; %s", path, world, RNG_NOTE)
        return
    if old == new:
        if world_changed:
            logger.info("resume from %s: %s; the global batch size is %d as before (%s now, %s before): nothing to "
                        "scale; %s", path, world, new, _parts(now, unit), _parts(before, unit), RNG_NOTE)
        return
    detail = "" if _same_shape(before, now) else f" ({_parts(before, unit)})"
    logger.warning("resume from %s: %sthe global batch size is %d now (%s), %d before%s: scale what depends on it, "
                   "such as the learning rate (x%.3g by the linear rule, resume_lr='new' to pass it)%s", path,
                   f"{world}; " if world else "", new, _parts(now, unit, with_ranks=False), old, detail, new / old,
                   f"; {RNG_NOTE}" if world_changed else "")


def _same_shape(before: dict, now: dict) -> bool:
    """The same per-process batch and accumulation: the ranks alone changed the global batch."""
    return (before["per_process"], before.get("accumulation", 1)) == (now["per_process"], now.get("accumulation", 1))


def _parts(batch: dict, unit: str, with_ranks: bool = True) -> str:
    """``"16 per process x 2"``, ``"8 per process x 2 accumulation steps"``..."""
    text = f"{batch['per_process']} per {unit}"
    if with_ranks:
        text += f" x {batch['data_parallel']}"
    if batch.get("accumulation", 1) != 1:
        text += f" x {batch['accumulation']} accumulation steps"
    return text
