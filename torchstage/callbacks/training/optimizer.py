"""The schedule of backward and optimizer steps on train loaders: gradient accumulation, clipping; the strategy acts."""
from torchstage.arguments import check_int, check_positive
from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.callbacks.training.loss_checks import nonscalar_loss_error
from torchstage.one_or_many import named
from torchstage.strategies.base import StepPlan


class OptimizerCallback(Callback):
    """Every train batch the strategy backpropagates the loss; every ``accumulation_steps`` batches it clips and
    steps the optimizer (then resets its gradients).

    This callback keeps the schedule (how many batches a group holds, when to clip, when to step) and asks the
    run's strategy (``runner.strategy``) to act: its ``backward``, ``clip_gradients``,
    ``optimizer_step`` and ``no_sync`` know where the gradients live and apply the precision (the float16 grad
    scaler: clipping sees unscaled gradients). Each loss is divided by the number of batches in its accumulation
    group, so the update equals one batch that many times larger (for mean-reduced losses and equal batch sizes).
    The last group of a loader may be shorter; with a loader of known length it is divided by its own size.
    Intermediate batches (forward and backward) run inside the strategy's ``no_sync(model)`` (DDP: no gradient
    all-reduce until the last micro-batch). Clipping is by value (``grad_clip_value``) and/or by total norm
    (``grad_clip_norm``). One scaler shared by several optimizer callbacks is updated after each of their steps;
    a multi-optimizer AMP run should step in handle_batch.

    With a :class:`~torchstage.callbacks.training.backward.BackwardCallback` of the same ``metric_key`` in the
    chain (Catalyst 22's split; it registers the loss with ``runner.shared``), that callback back-propagates and
    this one only steps and resets the gradients every ``accumulation_steps`` train batches of the run, as Catalyst
    22's did (the loss is not divided, a partial group waits for the next loader, no ``no_sync``).
    """

    order = CallbackOrder.Optimizer
    name = "optimizer"
    train_batches_only = True

    def __init__(self, metric_key: str = "loss", optimizer_key: str = None, accumulation_steps: int = 1,
                 grad_clip_norm: float = None, grad_clip_value: float = None):
        check_int("accumulation_steps", accumulation_steps)
        check_positive("grad_clip_norm", grad_clip_norm)
        check_positive("grad_clip_value", grad_clip_value)
        self.metric_key, self.optimizer_key = metric_key, optimizer_key
        self.accumulation_steps = accumulation_steps
        self.grad_clip_norm, self.grad_clip_value = grad_clip_norm, grad_clip_value
        self._step_only, self._steps_counted = False, 0  # set per stage: a BackwardCallback of this loss backprops
        self._no_sync = None  # the strategy's no_sync context, open during the batches of an accumulation group

    @property
    def produces(self):
        return ("lr",)  # a train loader's metric

    def step_plans(self, stage):
        """What this callback will ask of the strategy for ``stage``'s optimizer: its accumulation and clipping."""
        optimizer = stage.optimizer if self.optimizer_key is None else \
            named(stage.optimizer, "optimizer").get(self.optimizer_key)
        return (StepPlan(optimizer, self.accumulation_steps, self.grad_clip_norm, self.grad_clip_value),)

    def _optimizer(self, runner):
        return runner.optimizer if self.optimizer_key is None else runner.optimizer[self.optimizer_key]

    def on_stage_start(self, runner):
        self._optimizer_now = self._optimizer(runner)
        if self._optimizer_now is None and any(key.startswith("train") for key in runner.loop.loaders):
            raise ValueError(f"stage {runner.loop.stage_key!r} has no optimizer; pass optimizer=... to train()")
        self._strategy = strategy = runner.strategy
        self._backward = strategy.backward  # bound once: it runs every train batch
        #: a callback of the chain back-propagates this loss (a BackwardCallback): this one only steps (Catalyst 22's)
        self._step_only = self.metric_key in runner.shared.backpropagated

    def on_loader_start(self, runner):
        self._leave_no_sync()  # a pass whose on_loader_end an error cut short may have left one open
        self._pending, self._group, self._length = 0, self.accumulation_steps, None
        if runner.loop.is_train_loader and not self._step_only:
            self._length = _length(runner.loop.loader)
            self._strategy.zero_grad(self._optimizer_now)

    def handles(self, event: str) -> bool:
        if event == "on_batch_start":  # only accumulation opens a no_sync context before the forward
            return self.accumulation_steps > 1 and not self._step_only
        return super().handles(event)

    def on_batch_start(self, runner):
        if not runner.loop.is_train_loader or self._step_only:
            return
        if self._pending == 0 and self._length is not None:  # a group's first batch: how many it will hold
            train_pass = runner.loop.train_pass  # batches a rollback left out of this pass shorten it
            length = self._length - (len(train_pass.skips) if train_pass is not None else 0)
            self._group = min(self.accumulation_steps, length - runner.loop.batch_step + 1)
        if self._pending + 1 < self._group:
            # DDP decides at forward time whether the backward syncs, so the context spans the batch.
            self._no_sync = self._strategy.no_sync(runner.model)
            self._no_sync.__enter__()

    def on_batch_end(self, runner):
        loop = runner.loop  # per batch: the loop state directly, not through the runner's properties
        if not loop.is_train_loader:
            return
        if loop.batch_skipped:  # e.g. a non-finite loss under NonFiniteLossCallback(mode="skip")
            self._leave_no_sync()
            return
        if self._step_only:
            self._steps_counted += 1
            if self._steps_counted % self.accumulation_steps == 0:
                self._step()
            return
        loss = loop.batch_metrics.get(self.metric_key)
        if loss is None:
            raise KeyError(f"OptimizerCallback(metric_key={self.metric_key!r}) found no such loss in "
                           f"batch_metrics; it has {sorted(loop.batch_metrics)}")
        if self._group > 1:
            loss = loss / self._group
        self._pending += 1
        try:
            if self._no_sync is None:
                self._backward(loss, self._optimizer_now)
            else:
                try:
                    self._backward(loss, self._optimizer_now)
                finally:
                    self._leave_no_sync()
        except RuntimeError as exc:  # torch's "grad can be implicitly created only for scalar outputs", named
            error = nonscalar_loss_error(runner.criterion, self.metric_key, loss)
            if error is None:
                raise
            raise error from exc
        if self._pending >= self._group:
            self._step()

    def _leave_no_sync(self):
        if self._no_sync is not None:
            self._no_sync.__exit__(None, None, None)
            self._no_sync = None

    def on_exception(self, runner):
        if getattr(self, "_no_sync", None) is not None:
            self._leave_no_sync()

    def on_loader_end(self, runner):
        self._leave_no_sync()
        if not runner.loop.is_train_loader:
            return
        if self._pending and not self._step_only:  # a loader of unknown length (or cut short) left a partial group
            # rescaled to the group's real size and, under DDP, averaged where no_sync skipped the all-reduce
            self._strategy.finish_partial_group(self._optimizer_now, self._group / self._pending)
            self._step()
        runner.loop.loader_metrics["lr"] = self._optimizer_now.param_groups[0]["lr"]

    def _step(self):
        self._strategy.clip_gradients(self._optimizer_now, self.grad_clip_norm, self.grad_clip_value)
        self._strategy.optimizer_step(self._optimizer_now)
        self._pending = 0


def _length(loader):
    try:
        return len(loader)
    except TypeError:
        return None
