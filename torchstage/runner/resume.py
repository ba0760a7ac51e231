"""Putting a loaded checkpoint back into a prepared runner: weights, optimizers, callbacks, RNG, position."""
from torchstage.checkpoint import CheckpointError


def restore(runner, checkpoint: dict) -> None:
    """Continue where ``checkpoint`` stopped; the next event is the first one the old run did not reach."""
    loop = checkpoint["loop"]
    names = [stage.name for stage in runner.spec.stage_specs]
    if loop["stage"] not in names:
        raise CheckpointError(f"checkpoint was written in stage {loop['stage']!r}, which this run does not have "
                              f"(stages: {names})")
    if not loop["epoch_done"]:
        raise CheckpointError("checkpoint was written in the middle of an epoch; resuming mid-epoch "
                              "needs the batch-period checkpoints of a later torchstage")
    index = names.index(loop["stage"])
    runner.enter_stage(index)
    runner.load_state_dict(checkpoint)
    for key in ("global_epoch_step", "global_batch_step", "global_sample_step"):
        setattr(runner, key, loop[key])
    runner.epoch_metrics = checkpoint.get("metrics", {})
    runner.epoch = loop["epoch"]
    if runner.epoch >= runner.num_epochs and index + 1 < len(names):
        runner.enter_stage(index + 1)
