"""The runner's checkpoint save: every write of the run's state goes through :func:`save_checkpoint`.

A save runs the checks registered with it first (:meth:`~torchstage.runner.shared.Shared.add_save_check`: the
non-finite loss check; a rollback under way), then the runner's own check that the state is finite, then hands the
state to the strategy, whose checkpoint IO writes the files. A check may keep the save from writing (it returns why:
a rollback is under way, and its pass ends after this batch) or end the run (it raises); no check rolls back or
unwinds the loop from inside a save. Collective: every rank saves at the same point.
"""
import logging

import torch

from torchstage.callbacks.training.nonfinite import NonFiniteStateError
from torchstage.one_or_many import named

logger = logging.getLogger("torchstage")


def save_checkpoint(runner, paths: list, before_last=None, last_good: str = "the last checkpoint") -> bool:
    """Write the run's state to each of ``paths`` in order (``before_last()`` run before the last, the commit point),
    once the registered checks let it (False: one said why not, logged, nothing written); ``last_good`` names the
    checkpoint kept when the state is not finite (:func:`check_finite_state`)."""
    for check in runner.shared.save_checks:
        why = check(runner)
        if why is not None:
            logger.debug("checkpoint %s not written: %s", paths[-1], why)
            return False
    check_finite_state(runner, last_good)
    runner.strategy.save_checkpoint(runner.state_dict(), paths, runner.file_writer, before_last=before_last)
    return True


def save_last(runner) -> list:
    """Every checkpoint writer of the chain writes ``last.pth`` at this point (a graceful stop); their paths."""
    return [write(runner) for write, _ in runner.shared.checkpoint_writers]


def first_nonfinite_state(runner):
    """``"model 'x' parameter 'w'"`` for the first model weight, buffer or optimizer state tensor of this rank
    that holds NaN or inf, else None; one host read when all are finite (sharded tensors: this rank's shard)."""
    tensors = []
    for name, model in named(runner.unwrapped_model, "model").items():
        tensors += [(f"model {name!r} tensor {key!r}", t) for key, t in model.state_dict().items()]
    for name, optimizer in named(runner.optimizer, "optimizer").items():
        index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
        for param, state in optimizer.state.items():
            tensors += [(f"optimizer {name!r} state {key!r} of parameter {index.get(id(param))}", t)
                        for key, t in state.items()]
    tensors = [(where, t.to_local() if hasattr(t, "to_local") else t) for where, t in tensors
               if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    by_device = {}  # one host read per device: Adam's step counts stay on the CPU beside CUDA weights
    for i, (_, t) in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    bad = []
    for indices in by_device.values():
        flags = torch.stack([torch.isfinite(tensors[i][1]).all() for i in indices])
        if not bool(flags.all()):
            bad.append(indices[int((~flags).nonzero()[0])])
    return tensors[min(bad)][0] if bad else None


def check_finite_state(runner, last_good: str) -> None:
    """Raise :class:`~torchstage.callbacks.training.nonfinite.NonFiniteStateError` on every rank when any rank's
    weights or optimizer state hold NaN/inf (collective: one all-reduce of a flag under several processes, then an
    all-gather of where, when one was seen); ``last_good`` names the checkpoint kept."""
    where, engine, loop = first_nonfinite_state(runner), runner.engine, runner.loop
    if engine.is_distributed:
        seen = engine.all_reduce_(torch.tensor([where is not None], dtype=torch.int32, device=engine.device), op="max")
        if not seen.item():
            return
        found = [(rank, w) for rank, w in enumerate(engine.all_gather_object(where)) if w is not None]
        where = f"{found[0][1]} on rank {found[0][0]}"
    if where is None:
        return
    raise NonFiniteStateError(
        f"non-finite weights: {where} holds NaN/inf at stage {loop.stage_key!r}, epoch {loop.epoch}, after global "
        f"batch {loop.global_batch_step}, though every train loss was finite (a gradient or an update was not); "
        f"no checkpoint was written, so {last_good} is the last finite one. Lower the learning rate, clip "
        f"gradients (grad_clip_norm=...), or find the operation with torch.autograd.set_detect_anomaly(True)")
