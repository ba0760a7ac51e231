"""Backward and optimizer step on train loaders: gradient accumulation, clipping, AMP loss scaling."""
import contextlib
import numbers

import torch

from torchstage.callbacks.base import Callback, CallbackOrder


class OptimizerCallback(Callback):
    """``loss.backward()``, then every ``accumulation_steps`` batches: unscale, clip, ``step()``, ``zero_grad``.

    Each loss is divided by the number of batches in its accumulation group, so the update equals one
    batch that many times larger (for mean-reduced losses and equal batch sizes). The last group of a
    loader may be shorter; with a loader of known length it is divided by its own size. Intermediate
    batches (forward and backward) run inside ``runner.engine.no_sync(model)`` when the engine has one (DDP: no
    gradient all-reduce until the last micro-batch). Clipping is by value (``grad_clip_value``) and/or
    by total norm (``grad_clip_norm``), on unscaled gradients under fp16 AMP (``runner.scaler``).
    Gradients are reset with ``zero_grad(set_to_none=True)``. One scaler shared by several optimizer
    callbacks is updated after each of their steps; a multi-optimizer AMP run should step in handle_batch.
    """

    order = CallbackOrder.Optimizer
    name = "optimizer"

    def __init__(self, metric_key: str = "loss", optimizer_key: str = None, accumulation_steps: int = 1,
                 grad_clip_norm: float = None, grad_clip_value: float = None):
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}")
        for name, value in (("grad_clip_norm", grad_clip_norm), ("grad_clip_value", grad_clip_value)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0):
                raise ValueError(f"{name} must be a number > 0 or None, got {value!r}")
        self.metric_key, self.optimizer_key = metric_key, optimizer_key
        self.accumulation_steps = accumulation_steps
        self.grad_clip_norm, self.grad_clip_value = grad_clip_norm, grad_clip_value

    def _optimizer(self, runner):
        return runner.optimizer if self.optimizer_key is None else runner.optimizer[self.optimizer_key]

    def on_stage_start(self, runner):
        self._optimizer_now = self._optimizer(runner)
        if self._optimizer_now is None:
            raise ValueError(f"stage {runner.stage_key!r} has no optimizer; pass optimizer=... to train()")

    def on_loader_start(self, runner):
        self._pending, self._group, self._no_sync = 0, self.accumulation_steps, None
        if runner.is_train_loader:
            self._length = _length(runner.loader)
            self._optimizer_now.zero_grad(set_to_none=True)

    def handles(self, event: str) -> bool:
        if event == "on_batch_start":  # only accumulation opens a no_sync context before the forward
            return self.accumulation_steps > 1
        return super().handles(event)

    def on_batch_start(self, runner):
        if not runner.is_train_loader:
            return
        if self._pending == 0 and self._length is not None:  # a group's first batch: how many it will hold
            self._group = min(self.accumulation_steps, self._length - runner.batch_step + 1)
        if self._pending + 1 < self._group:
            # DDP decides at forward time whether the backward syncs, so the context spans the batch.
            self._no_sync = _no_sync(runner)
            self._no_sync.__enter__()

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        if runner.batch_skipped:  # e.g. a non-finite loss under NonFiniteLossCallback(mode="skip")
            self._leave_no_sync()
            return
        try:
            loss = runner.batch_metrics[self.metric_key]
        except KeyError:
            raise KeyError(f"OptimizerCallback(metric_key={self.metric_key!r}) found no such loss in "
                           f"batch_metrics; it has {sorted(runner.batch_metrics)}") from None
        if self._group > 1:
            loss = loss / self._group
        if runner.scaler is not None:
            loss = runner.scaler.scale(loss)
        self._pending += 1
        try:
            loss.backward()
        finally:
            self._leave_no_sync()
        if self._pending >= self._group:
            self._step(runner)

    def _leave_no_sync(self):
        if self._no_sync is not None:
            self._no_sync.__exit__(None, None, None)
            self._no_sync = None

    def on_exception(self, runner):
        if getattr(self, "_no_sync", None) is not None:
            self._leave_no_sync()

    def on_loader_end(self, runner):
        self._leave_no_sync()
        if not runner.is_train_loader:
            return
        if self._pending:  # a loader of unknown length (or cut short) left a partial group
            self._finish_partial_group(runner)
            self._step(runner)
        runner.loader_metrics["lr"] = self._optimizer_now.param_groups[0]["lr"]

    def _finish_partial_group(self, runner):
        """Rescale to the group's real size and, under DDP, average the gradients ``no_sync`` skipped."""
        scale = self._group / self._pending
        world = runner.engine.world_size
        for p in _params(self._optimizer_now):
            if world > 1:
                runner.engine.all_reduce_(p.grad)
            if scale != 1 or world > 1:
                p.grad.mul_(scale / world)

    def _step(self, runner):
        optimizer, scaler = self._optimizer_now, runner.scaler
        if self.grad_clip_norm is not None or self.grad_clip_value is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            params = _params(optimizer)
            if self.grad_clip_value is not None:
                torch.nn.utils.clip_grad_value_(params, self.grad_clip_value)
            if self.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, self.grad_clip_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._pending = 0


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def _length(loader):
    try:
        return len(loader)
    except TypeError:
        return None


def _no_sync(runner):
    """The engine's ``no_sync(model)`` context (skip DDP's gradient all-reduce), or a no-op without one."""
    no_sync = getattr(runner.engine, "no_sync", None)
    return no_sync(runner.model) if no_sync is not None else contextlib.nullcontext()
