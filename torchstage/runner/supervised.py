"""SupervisedRunner: ``model(batch[input_key]) -> batch[output_key]``, with criterion and optimizer callbacks."""
import torch

from torchstage.callbacks.training.optimizer import OptimizerCallback
from torchstage.callbacks.training.output_losses import OutputLossesCallback, as_terms
from torchstage.callbacks.training.loss_checks import input_dtype_error, missing_key_message
from torchstage.runner.runner import Runner


class SupervisedRunner(Runner):
    """The runner for ``(input, target)`` tasks.

    A tuple/list batch maps to ``{input_key: batch[0], target_key: batch[1]}``; a dict batch is used as
    is. ``input_key`` may be a list of keys, passed to the model as keyword arguments. A model returning
    a tensor fills ``output_key``; one returning a dict adds its keys; a tuple needs a list ``output_key``.
    """

    requires = ("criterion", "optimizer")
    _plain = False

    def __init__(self, model=None, engine=None, input_key="features", output_key="logits",
                 target_key="targets", loss_key="loss", device=None):
        super().__init__(model=model, engine=engine, device=device)
        self.input_key, self.output_key = input_key, output_key
        self.target_key, self.loss_key = target_key, loss_key
        #: one input and one output name and the stock forward: (x, y) batches take the short path
        self._plain = isinstance(input_key, str) and isinstance(output_key, str) and \
            type(self).forward is SupervisedRunner.forward

    @property
    def produces(self) -> tuple:
        """The metrics ``handle_batch`` writes itself: the loss under a pipeline (its schedule computes it)."""
        return (self.loss_key,) if self.strategy.pipelined else ()

    def step_callbacks(self, spec, optimizer_options: dict) -> dict:
        """The loss (one term per name of a dict criterion), then backward and optimizer step; a run without a
        criterion or an optimizer (evaluation loaders only, as Catalyst 22 allowed) leaves that one out."""
        names = {}
        for stage in spec.stage_specs:
            if isinstance(stage.criterion, dict):
                where = "criterion" if stage.name == "main" else f"stages[{stage.name!r}]['criterion']"
                names.update(as_terms(stage.criterion, where))
        chain = {}
        if getattr(spec.strategy, "pipelined", False):
            self._check_pipeline(spec, names)
        elif any(stage.criterion is not None for stage in spec.stage_specs):
            chain["criterion"] = self.loss_callback(names=list(names))
        # a strategy whose configuration names an optimizer (DeepSpeed's) builds it at setup for stages given none
        if any(stage.optimizer is not None for stage in spec.stage_specs) or \
                getattr(spec.strategy, "supplies_optimizer", False):
            chain["optimizer"] = OptimizerCallback(metric_key=self.loss_key, **optimizer_options)
        return chain

    def _check_pipeline(self, spec, names) -> None:
        """Under a pipeline the schedule computes the loss on the last stage (no criterion callback): one criterion,
        one input and one output; ValueError, before training, for what it cannot run."""
        if names:
            raise ValueError(f"strategy={spec.strategy!r} computes the loss inside its pipeline schedule: give one "
                             f"criterion, not a dict of them ({sorted(names)})")
        if not (isinstance(self.input_key, str) and isinstance(self.output_key, str)):
            raise ValueError(f"strategy={spec.strategy!r} runs one input through its stages to one output: give "
                             f"{type(self).__name__} a single input_key and output_key, got input_key="
                             f"{self.input_key!r}, output_key={self.output_key!r}")

    def loss_callback(self, names=()) -> OutputLossesCallback:
        """The callback computing ``loss`` (one term per name for a dict criterion), for train and evaluate."""
        output_key = self.output_key if isinstance(self.output_key, str) else self.output_key[0]
        return OutputLossesCallback(input_key=output_key, target_key=self.target_key, metric_key=self.loss_key,
                                    names=names)

    def handle_batch(self, batch) -> None:
        if self.strategy.pipelined:
            return self.pipeline_batch(batch)
        if self.amp_dtype is None and self._plain and type(batch) in (tuple, list) and len(batch) == 2:
            x, y = batch  # the common (x, y) batch without amp: no dict round trip
            try:
                output = self.model(x)
            except (RuntimeError, ValueError) as exc:
                error = input_dtype_error(self.model, {self.input_key: x}, exc)
                if error is None:
                    raise
                raise error from exc
            if type(output) is torch.Tensor:
                self.loop.batch = {self.input_key: x, self.target_key: y, self.output_key: output}
            else:
                self.loop.batch = {self.input_key: x, self.target_key: y, **self._named(output)}
            return
        batch = self.loop.batch = self._as_dict(batch)
        if self.amp_dtype is None:  # no context to enter per batch without amp
            batch.update(self.forward(batch))
            return
        with self.autocast():
            batch.update(self.forward(batch))

    def pipeline_batch(self, batch) -> None:
        """One batch through the strategy's pipeline schedule: forward and, on train loaders, backward together; the
        outputs where the samples are counted (the last stage), the batch's loss on every rank."""
        batch = self.loop.batch = self._as_dict(batch)
        with self.autocast():
            outputs, loss = self.strategy.pipeline_step(self.model, self._input(batch, self.input_key),
                                                        batch.get(self.target_key), self.criterion,
                                                        self.loop.is_train_loader)
        batch[self.output_key] = outputs
        self.loop.batch_metrics[self.loss_key] = loss

    def predict_batch(self, batch) -> dict:
        """The model's named outputs for one batch (without inputs and targets)."""
        with self.autocast():
            return self.forward(self._as_dict(batch))

    def forward(self, batch: dict, **kwargs) -> dict:
        """Run the model on ``batch``'s inputs and name its outputs (an input torch refuses for its dtype is
        named, with the fix)."""
        try:
            if isinstance(self.input_key, str):
                output = self.model(self._input(batch, self.input_key), **kwargs)
            else:
                output = self.model(**{key: self._input(batch, key) for key in self.input_key}, **kwargs)
        except (RuntimeError, ValueError) as exc:
            keys = [self.input_key] if isinstance(self.input_key, str) else self.input_key
            error = input_dtype_error(self.model, {key: batch[key] for key in keys}, exc)
            if error is None:
                raise
            raise error from exc
        return self._named(output)

    def _input(self, batch: dict, key):
        try:
            return batch[key]
        except KeyError:
            raise KeyError(missing_key_message(
                f"{type(self).__name__}(input_key={self.input_key!r})", key, batch,
                f"name the dataset's keys with {type(self).__name__}(input_key='<input key>', "
                f"target_key='<target key>')")) from None

    def _named(self, output) -> dict:
        """The model's ``output`` under ``output_key`` (a dict as is, a tuple by the list of names)."""
        if isinstance(output, torch.Tensor):
            return {self.output_key if isinstance(self.output_key, str) else self.output_key[0]: output}
        if isinstance(output, dict):
            return output
        if isinstance(output, (tuple, list)):
            keys = [self.output_key] if isinstance(self.output_key, str) else self.output_key
            if len(keys) != len(output):
                raise ValueError(f"the model returned {len(output)} outputs but output_key names {len(keys)}: "
                                 f"{keys}; pass output_key=[one name per output]")
            return dict(zip(keys, output))
        return {self.output_key if isinstance(self.output_key, str) else self.output_key[0]: output}

    def _as_dict(self, batch) -> dict:
        if type(batch) in (tuple, list) and len(batch) == 2 and isinstance(self.input_key, str):
            return {self.input_key: batch[0], self.target_key: batch[1]}  # the common (x, y) batch
        if isinstance(batch, dict):
            return dict(batch)
        if isinstance(batch, (tuple, list)):
            inputs = [self.input_key] if isinstance(self.input_key, str) else list(self.input_key)
            keys = inputs + [self.target_key]
            if len(batch) not in (len(inputs), len(keys)):
                raise ValueError(f"a batch of {len(batch)} items cannot map to input_key={self.input_key!r} "
                                 f"and target_key={self.target_key!r}; yield dict batches or set the keys")
            return dict(zip(keys, batch))
        return {self.input_key: batch}
