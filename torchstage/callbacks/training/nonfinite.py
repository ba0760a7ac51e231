"""Non-finite losses: stop the run at the first NaN/inf train loss (default), or skip such batches.

``mode="stop"`` keeps each train loss (detached, on its device: no host sync) and reads them, stacked, every
``check_every`` train batches, at the end of each train loader and before any mid-epoch checkpoint, so no
checkpoint ever holds weights trained on a non-finite loss; the error names the first such batch.
``mode="skip"`` must know before the backward whether to step, so it reads the loss every train batch
(one host sync per batch, as AMP's grad scaler does); a skipped batch sets ``runner.batch_skipped``, so
it is left out of the averages, the backward and the step; skipped batches are counted in the loader
metric ``nonfinite_skipped``.
"""
import logging
import math

import torch

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.one_or_many import named

logger = logging.getLogger("torchstage")
#: The all-reduced first step of a non-finite loss when no rank has seen one.
NONE_SEEN = 2 ** 62


class NonFiniteLossError(FloatingPointError):
    """A train loss was NaN or infinite; the message says where, which loss and (several processes) on which rank,
    also kept as ``origin_rank`` for the launcher's summary."""

    def __init__(self, message: str, origin_rank: int = None):
        super().__init__(message)
        self.origin_rank = origin_rank


class NonFiniteStateError(FloatingPointError):
    """A checkpoint would have held NaN or infinite weights or optimizer state: it was not written."""


class NonFiniteLossCallback(Callback):
    """Watches the train losses (``batch_metrics`` keys containing ``"loss"``, or ``keys``) for NaN/inf."""

    order = CallbackOrder.Metric + 5  # after the criterion, before averaging, backward and the step
    name = "nonfinite"
    train_batches_only = True

    def __init__(self, mode: str = "stop", check_every: int = 100, keys=None):
        if mode not in ("stop", "skip"):
            raise ValueError(f"mode must be 'stop' (end the run at a non-finite loss) or 'skip' (skip such "
                             f"batches), got {mode!r}")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"check_every must be an integer >= 1, got {check_every!r}")
        self.mode, self.check_every, self.keys = mode, check_every, None if keys is None else tuple(keys)
        self._first, self._skipped, self._loader_start_step = {}, 0, 0
        self._values, self._pending, self._agreed_clean = {}, 0, False

    @property
    def produces(self):
        return ("nonfinite_skipped",) if self.mode == "skip" else ()

    def _losses(self, runner) -> dict:
        metrics = runner.batch_metrics
        keys = self.keys if self.keys is not None else [k for k in metrics if "loss" in k]
        return {k: metrics[k] for k in keys if isinstance(metrics.get(k), torch.Tensor)}

    def _watches(self, key: str) -> bool:
        return key in self.keys if self.keys is not None else "loss" in key

    def on_loader_start(self, runner):
        self._values, self._pending, self._first, self._skipped = {}, 0, {}, 0
        self._loader_start_step = runner.global_batch_step

    def on_batch_end(self, runner):
        loop = runner.loop
        if not loop.is_train_loader:
            return
        if self.mode == "skip":
            self._skip_if_nonfinite(runner)
            return
        step, watched = loop.global_batch_step, self._values
        for key, loss in loop.batch_metrics.items():  # the detached losses, read at the next check
            seen = watched.get(key)
            if seen is None:  # first time since the last check: a list if this key is watched, else False
                seen = watched[key] = [] if self._watches(key) else False
            if seen is not False and isinstance(loss, torch.Tensor):
                seen.append((step, loss.detach()))
        self._pending += 1
        self._agreed_clean = False
        if self._pending == self.check_every:
            self.check(runner)

    def on_loader_end(self, runner):
        if runner.is_train_loader and self.mode == "stop":
            self.check(runner)
        if runner.is_train_loader and self.mode == "skip":
            runner.loader_metrics["nonfinite_skipped"] = float(self._skipped)

    def check(self, runner) -> None:
        """Read the losses since the last check (one host read; under several processes one all-reduce of an
        integer, skipped when no rank has had a train batch since the last clean one); raise at the first
        non-finite one."""
        if self.mode != "stop":
            return
        engine = runner.engine
        if engine.is_distributed and self._agreed_clean:  # the ranks run their train batches in step
            return
        self._scan()
        rank = engine.rank
        first = min(((step, key, rank) for key, (step, _) in self._first.items()), default=(float("inf"), "", rank))
        if engine.is_distributed:  # every rank must agree, so every rank raises at the same point
            earliest = first[0] if first[0] != float("inf") else NONE_SEEN
            earliest = int(engine.all_reduce_(torch.tensor([earliest], device=engine.device), op="min").item())
            if earliest == NONE_SEEN:
                self._agreed_clean = True
                return
            first = min(engine.all_gather_object(first))  # which loss, and on which rank: only after one was seen
        step, key, origin = first
        if step == float("inf"):
            return
        mine = self._first.get(key)
        value = mine[1] if mine is not None and mine[0] == step else None
        step = int(step)
        seen = f" on rank {origin}" if runner.engine.is_distributed else ""
        raise NonFiniteLossError(
            f"non-finite loss: {key!r} was {value if value is not None else 'nan/inf'}{seen} at stage "
            f"{runner.stage_key!r}, epoch {runner.epoch}, loader {runner.loader_key!r}, batch "
            f"{step - self._loader_start_step} (global batch {step}); the run stops so that no checkpoint holds "
            f"weights trained on it (the last checkpoint is the last finite one). Lower the learning rate, "
            f"clip gradients (grad_clip_norm=...), or skip such batches with "
            f"callbacks={{'nonfinite': NonFiniteLossCallback(mode='skip')}}", origin_rank=origin)

    def _scan(self) -> None:
        """Find, per loss, the first non-finite value kept since the last scan (one host read); start anew."""
        values, self._values, self._pending = self._values, {}, 0
        for key, seen in values.items():
            if not seen or key in self._first:
                continue
            # one host read of them all; a non-scalar loss by its sum, which NaN/inf survive
            read = torch.stack([loss if loss.dim() == 0 else loss.sum() for _, loss in seen]).tolist()
            if all(map(math.isfinite, read)):
                continue
            index = next(i for i, value in enumerate(read) if not math.isfinite(value))
            self._first[key] = (seen[index][0], read[index])

    def _skip_if_nonfinite(self, runner):
        losses = self._losses(runner)
        if not losses:
            return
        bad = torch.stack([~torch.isfinite(loss.detach()).all() for loss in losses.values()]).any()
        flag = runner.engine.all_reduce_(bad.to(torch.int32).reshape(1), op="max")
        if not flag.item():  # the one host sync per batch of mode="skip"
            return
        self._skipped += 1
        runner.batch_skipped = True  # the averaging and optimizer callbacks leave this batch out
        if runner.engine.is_main:
            logger.warning("skipped train batch %d of epoch %d (global batch %d): non-finite %s",
                           runner.batch_step, runner.epoch, runner.global_batch_step, "/".join(losses))


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
    if not tensors:
        return None
    flags = torch.stack([torch.isfinite(t).all() for _, t in tensors])
    if bool(flags.all()):
        return None
    return tensors[int((~flags).nonzero()[0])][0]


def check_finite_state(runner, last_good: str) -> None:
    """Raise :class:`NonFiniteStateError` on every rank when any rank's weights or optimizer state hold NaN/inf
    (collective: one all-reduce of a flag under several processes, then an all-gather of where, when one was
    seen); ``last_good`` names the checkpoint kept."""
    where, engine = first_nonfinite_state(runner), runner.engine
    if engine.is_distributed:
        seen = engine.all_reduce_(torch.tensor([where is not None], dtype=torch.int32, device=engine.device), op="max")
        if not seen.item():
            return
        found = [(rank, w) for rank, w in enumerate(engine.all_gather_object(where)) if w is not None]
        where = f"{found[0][1]} on rank {found[0][0]}"
    if where is None:
        return
    raise NonFiniteStateError(
        f"non-finite weights: {where} holds NaN/inf at stage {runner.stage_key!r}, epoch {runner.epoch}, after global "
        f"batch {runner.global_batch_step}, though every train loss was finite (a gradient or an update was not); "
        f"no checkpoint was written, so {last_good} is the last finite one. Lower the learning rate, clip "
        f"gradients (grad_clip_norm=...), or find the operation with torch.autograd.set_detect_anomaly(True)")
