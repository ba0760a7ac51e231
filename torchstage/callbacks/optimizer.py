"""Backward and optimizer step on train loaders, with gradient accumulation and clipping."""
import torch

from torchstage.callbacks.base import Callback, CallbackOrder


class OptimizerCallback(Callback):
    """``loss.backward()``, then every ``accumulation_steps`` batches: clip, ``step()``, ``zero_grad``.

    The loss is divided by ``accumulation_steps`` so that the update equals one batch that many times
    larger. Clipping is by total norm (``grad_clip_norm``) and/or by value (``grad_clip_value``).
    """

    order = CallbackOrder.Optimizer
    name = "optimizer"

    def __init__(self, metric_key: str = "loss", optimizer_key: str = None, accumulation_steps: int = 1,
                 grad_clip_norm: float = None, grad_clip_value: float = None):
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}")
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
        self._pending, self._no_sync = 0, None

    def on_batch_start(self, runner):
        # An intermediate accumulation step skips gradient sync under DDP; DDP decides that at forward
        # time, so the context spans the whole batch (forward and backward).
        if runner.is_train_loader and self._pending + 1 < self.accumulation_steps and self._more_batches(runner):
            self._no_sync = runner.engine.no_sync(runner.model)
            self._no_sync.__enter__()

    def on_batch_end(self, runner):
        if not runner.is_train_loader:
            return
        loss = runner.batch_metrics[self.metric_key]
        if self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps
        try:
            loss.backward()
        finally:
            self._leave_no_sync()
        self._pending += 1
        if self._pending == self.accumulation_steps:
            self._step()

    @staticmethod
    def _more_batches(runner) -> bool:
        """False on a loader's last batch, and for loaders of unknown length (always sync there)."""
        try:
            return runner.batch_step < len(runner.loader)
        except TypeError:
            return False

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
        if self._pending:
            self._step()  # a last, partial accumulation is not thrown away
        runner.loader_metrics["lr"] = self._optimizer_now.param_groups[0]["lr"]

    def _step(self):
        optimizer = self._optimizer_now
        if self.grad_clip_norm is not None or self.grad_clip_value is not None:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if self.grad_clip_value is not None:
                torch.nn.utils.clip_grad_value_(params, self.grad_clip_value)
            if self.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, self.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._pending = 0
