"""The loss: ``criterion(batch[input_key], batch[target_key])`` as a tensor in ``batch_metrics``."""
import warnings

from torchstage.callbacks.base import Callback, CallbackOrder
from torchstage.callbacks.training.loss_checks import check_loss_inputs, explain_failure, missing_key_message


class CriterionCallback(Callback):
    """Computes the loss on every batch; it stays a tensor until the optimizer callback backpropagates it.

    ``criterion(batch[input_key], batch[target_key])`` (defaults ``"logits"``, ``"targets"``) lands in
    ``batch_metrics[metric_key]`` (default ``"loss"``), times ``multiplier``.
    """

    order = CallbackOrder.Metric
    name = "criterion"

    def __init__(self, input_key: str = "logits", target_key: str = "targets", metric_key: str = "loss",
                 criterion_key: str = None, *, multiplier: float = 1.0):
        owner = type(self).__name__
        for name, value in (("input_key", input_key), ("target_key", target_key), ("metric_key", metric_key)):
            if not isinstance(value, str):
                raise TypeError(f"{owner}: {name} must be a str (a key of runner.batch), got {value!r}")
        self.input_key, self.target_key, self.metric_key = input_key, target_key, metric_key
        self.criterion_key = criterion_key
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
            raise TypeError(f"{owner}: multiplier must be a number, got {multiplier!r}")
        self.multiplier = multiplier

    @property
    def produces(self):
        return (self.metric_key,)

    def on_stage_start(self, runner):
        criterion = runner.criterion if self.criterion_key is None else runner.criterion[self.criterion_key]
        if criterion is None:
            raise ValueError(f"{type(runner).__name__} has no criterion in stage {runner.loop.stage_key!r}; pass "
                             f"criterion=... to train()")
        self._criterion, self._checked = criterion, False

    def on_batch_end(self, runner):
        batch = runner.loop.batch
        if not self._checked:
            self._check_keys(batch)
        outputs, targets = batch[self.input_key], batch[self.target_key]
        if not self._checked:  # the first batch of the stage: say clearly what does not fit
            if check_loss_inputs(self._criterion, outputs, targets, self.input_key, self.target_key):
                _silence_torch_size_warning()  # said once, by check_loss_inputs
            try:
                self._loss_now(runner, outputs, targets)
            except (RuntimeError, ValueError, IndexError, TypeError) as exc:
                raise explain_failure(self._criterion, exc, outputs, targets, self.input_key,
                                      self.target_key) from exc
            self._checked = True
        elif runner.amp_dtype is None and self.multiplier == 1:  # the common case, without a call
            runner.loop.batch_metrics[self.metric_key] = self._criterion(outputs, targets)
        else:
            self._loss_now(runner, outputs, targets)

    def _check_keys(self, batch) -> None:
        """The first batch of the stage holds both keys, or the error names them and the batch's keys."""
        for name, key in (("input_key", self.input_key), ("target_key", self.target_key)):
            if key not in batch:
                fix = ("name the target with SupervisedRunner(target_key='<its key>') (or this callback's "
                       "target_key)" if name == "target_key" else "name the model output this loss reads with "
                       "this callback's input_key (SupervisedRunner's output_key)")
                raise KeyError(missing_key_message(f"the loss ({type(self).__name__}(target_key={self.target_key!r}, "
                                                   f"input_key={self.input_key!r}))", key, batch, fix))

    def _loss_now(self, runner, outputs, targets):
        if runner.amp_dtype is None:
            loss = self._criterion(outputs, targets)
        else:
            with runner.autocast():
                loss = self._criterion(outputs, targets)
        runner.loop.batch_metrics[self.metric_key] = loss if self.multiplier == 1 else loss * self.multiplier


def _silence_torch_size_warning() -> None:
    """torch's own "Using a target size ..." warning from its loss modules would repeat what torchstage said once:
    a filter for torch.nn's loss modules only (a direct F.mse_loss call still warns), set at a stage's first batch
    (an identical filter moves to the front, never piles up) instead of a per-batch ``catch_warnings``."""
    warnings.filterwarnings("ignore", message="Using a target size", category=UserWarning,
                            module=r"torch\.nn\.modules\.loss")
