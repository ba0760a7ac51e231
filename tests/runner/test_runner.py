"""The loop: exact event order, cancel exceptions per level, on_exception, the chain by name."""
import pytest
import torch

from torchstage import (Callback, CallbackOrder, CancelBatch, CancelEpoch, CancelLoader, CancelRun, CancelStage,
                        Runner)
from torchstage.callbacks.base import EVENTS

LEVELS = ("experiment", "stage", "epoch", "loader", "batch")


class Recorder(Callback):
    order = CallbackOrder.External

    def __init__(self, cancel=None):
        self.events, self.cancel = [], cancel or {}

    def _record(self, event, runner):
        where = {"stage": getattr(runner, "stage_key", None), "epoch": getattr(runner, "epoch", None),
                 "loader": getattr(runner, "loader_key", None), "batch": getattr(runner, "batch_step", None)}
        self.events.append((event, where["stage"], where["epoch"], where["loader"], where["batch"]))
        for (cancel_event, condition), exc in self.cancel.items():
            if cancel_event == event and condition(runner):
                raise exc


for _event in EVENTS:
    setattr(Recorder, _event, lambda self, runner, _e=_event: self._record(_e, runner))


class CountingRunner(Runner):
    produces = ("seen",)

    def __init__(self):
        super().__init__()
        self.handled = []

    def handle_batch(self, batch):
        self.handled.append((self.stage_key, self.epoch, self.loader_key, self.batch_step))
        self.batch_metrics["seen"] = torch.tensor(1.0)


def run(cancel=None, stages=True, num_batches=2):
    data = [torch.zeros(1, 1)] * num_batches
    loaders = {"train": data, "valid": data}
    recorder = Recorder(cancel)
    runner = CountingRunner()
    stage_spec = {"first": {"num_epochs": 2}, "second": {"num_epochs": 2}} if stages else None
    runner.train(model=torch.nn.Linear(1, 1), loaders=loaders, callbacks=[recorder], stages=stage_spec,
                 num_epochs=2, valid_metric="seen")
    return runner, recorder.events


def expected_events():
    out = [("on_experiment_start", "first", 0, None, None)]
    for stage in ("first", "second"):
        out.append(("on_stage_start", stage, 0, None if stage == "first" else "valid", None if stage == "first" else 2))
        for epoch in (1, 2):
            loader_before = None if (stage, epoch) == ("first", 1) else "valid"
            batch_before = None if (stage, epoch) == ("first", 1) else 2
            out.append(("on_epoch_start", stage, epoch, loader_before, batch_before))
            for loader in ("train", "valid"):
                out.append(("on_loader_start", stage, epoch, loader,
                            None if (stage, epoch, loader) == ("first", 1, "train") else 2))
                for batch in (1, 2):
                    out.append(("on_batch_start", stage, epoch, loader, batch))
                    out.append(("on_batch_end", stage, epoch, loader, batch))
                out.append(("on_loader_end", stage, epoch, loader, 2))
            out.append(("on_epoch_end", stage, epoch, "valid", 2))
        out.append(("on_stage_end", stage, 2, "valid", 2))
    out.append(("on_experiment_end", "second", 2, "valid", 2))
    return out


def test_event_sequence_two_stages_two_epochs_two_loaders_two_batches():
    runner, events = run()
    assert events == expected_events()
    assert len(events) == 2 + 2 * (2 + 2 * (2 + 2 * (2 + 2 * 2)))
    assert len(runner.handled) == 16
    assert runner.global_epoch_step == 4 and runner.global_batch_step == 8


def test_cancel_batch_skips_handle_batch_but_fires_batch_end():
    runner, events = run(cancel={("on_batch_start", lambda r: r.batch_step == 1): CancelBatch()}, stages=False)
    assert len(runner.handled) == 2 * 2  # batch 2 of each loader, 2 epochs
    assert sum(e[0] == "on_batch_end" for e in events) == 8


def test_cancel_loader_ends_loader_and_fires_loader_end():
    runner, events = run(cancel={("on_batch_end", lambda r: r.batch_step == 1): CancelLoader()}, stages=False)
    assert [e[4] for e in events if e[0] == "on_batch_end"] == [1, 1, 1, 1]
    assert sum(e[0] == "on_loader_end" for e in events) == 4


def test_cancel_epoch_skips_remaining_loaders():
    runner, events = run(cancel={("on_loader_end", lambda r: r.loader_key == "train"): CancelEpoch()}, stages=False)
    assert [e[3] for e in events if e[0] == "on_loader_start"] == ["train", "train"]
    assert sum(e[0] == "on_epoch_end" for e in events) == 2


def test_cancel_stage_moves_to_next_stage():
    runner, events = run(cancel={("on_epoch_end", lambda r: r.stage_key == "first"): CancelStage()})
    assert [(e[1], e[2]) for e in events if e[0] == "on_epoch_start"] == [("first", 1), ("second", 1), ("second", 2)]
    assert [e[1] for e in events if e[0] == "on_stage_end"] == ["first", "second"]


def test_cancel_run_stops_everything_and_fires_experiment_end():
    runner, events = run(cancel={("on_batch_end", lambda r: r.global_batch_step == 3): CancelRun()})
    assert events[-1][0] == "on_experiment_end"
    assert sum(e[0] == "on_stage_end" for e in events) == 0
    assert len(runner.handled) == 5  # 2 train + 2 valid in epoch 1, then train batch 1 of epoch 2


def test_exception_fires_on_exception_and_propagates():
    class Boom(Callback):
        def on_batch_end(self, runner):
            if runner.epoch == 2:
                raise RuntimeError("boom at epoch 2")

    seen = []

    class Watch(Callback):
        def on_exception(self, runner):
            seen.append(repr(runner.exception))

    with pytest.raises(RuntimeError, match="boom at epoch 2"):
        CountingRunner().train(model=torch.nn.Linear(1, 1), loaders={"train": [torch.zeros(1)], "valid": [torch.zeros(1)]},
                               callbacks=[Boom(), Watch()], num_epochs=3, valid_metric="seen")
    assert seen == ["RuntimeError('boom at epoch 2')"]


def test_a_run_failing_in_an_evaluation_loader_leaves_grad_mode_as_it_found_it():
    class Boom(Callback):
        def on_batch_end(self, runner):
            if runner.loader_key == "valid":
                raise RuntimeError("boom in valid")

    assert torch.is_grad_enabled()
    with pytest.raises(RuntimeError, match="boom in valid"):
        CountingRunner().train(model=torch.nn.Linear(1, 1), loaders={"train": [torch.zeros(1)], "valid": [torch.zeros(1)]},
                               callbacks=[Boom()], num_epochs=1, valid_metric="seen")
    assert torch.is_grad_enabled()  # the valid loader had turned it off; user code after train() needs it on


def test_scope_decides_which_callbacks_a_single_process_calls():
    """Distributed-scope callbacks (the hang watchdog, the even-batches check) cost a single process nothing."""
    from torchstage import CallbackScope

    calls = {scope: [] for scope in CallbackScope}

    class Seen(Callback):
        def __init__(self, scope):
            super().__init__(scope=scope)

        def on_batch_end(self, runner):
            calls[self.scope].append(runner.batch_step)

    runner = CountingRunner().train(model=torch.nn.Linear(1, 1), loaders={"train": [torch.zeros(1)] * 3},
                                    callbacks={scope.name: Seen(scope) for scope in CallbackScope},
                                    valid_loader="train", valid_metric="seen", num_epochs=1)
    assert calls == {CallbackScope.All: [1, 2, 3], CallbackScope.Main: [1, 2, 3], CallbackScope.Distributed: []}
    handlers = [handler.__self__ for event in EVENTS for handler in runner._handlers[event]]
    assert runner.callbacks["watchdog"] not in handlers and runner.callbacks["even_batches"] not in handlers


def test_train_batches_only_callbacks_are_left_out_of_other_loaders_batches():
    calls = {}

    class Seen(Callback):
        def __init__(self, name, train_only):
            super().__init__()
            self.name, self.train_batches_only = name, train_only

        def on_batch_start(self, runner):
            calls.setdefault((self.name, "start"), []).append(runner.loader_key)

        def on_batch_end(self, runner):
            calls.setdefault((self.name, "end"), []).append(runner.loader_key)

    loaders = {"train": [torch.zeros(1)] * 2, "valid": [torch.zeros(1)] * 3}
    runner = CountingRunner().train(model=torch.nn.Linear(1, 1), loaders=loaders, num_epochs=1, valid_metric="seen",
                                    callbacks={"every": Seen("every", False), "train_only": Seen("train_only", True)})
    assert calls[("every", "start")] == calls[("every", "end")] == ["train"] * 2 + ["valid"] * 3
    assert calls[("train_only", "start")] == calls[("train_only", "end")] == ["train"] * 2
    # the default chain's optimizer, non-finite and stop callbacks act on train batches only
    from torchstage import NonFiniteLossCallback, OptimizerCallback, StopCallback
    assert OptimizerCallback.train_batches_only and NonFiniteLossCallback.train_batches_only
    assert StopCallback.train_batches_only
    assert runner.epoch_metrics["valid"]["seen"] == 1.0


def test_chain_lists_defaults_in_order_and_user_callbacks_replace_by_name(tmp_path):
    from torchstage import CheckpointCallback, SupervisedRunner
    from tests.conftest import regression_loaders

    class Mine(Callback):
        order = CallbackOrder.Metric + 1

    model = torch.nn.Linear(4, 1)
    custom_checkpoint = CheckpointCallback()
    runner = SupervisedRunner().train(
        model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loaders=regression_loaders(), logdir=str(tmp_path), num_epochs=1,
        callbacks={"checkpoint": custom_checkpoint, "tensorboard": None, "mine": Mine()})
    names = list(runner.callbacks)
    assert names == ["loop", "watchdog", "even_batches", "criterion", "mine", "nonfinite", "averaging", "optimizer",
                     "checkpoint", "csv", "console", "model_summary", "stop", "stragglers"]
    assert runner.callbacks["checkpoint"] is custom_checkpoint
    orders = [int(cb.order) for cb in runner.callbacks.values()]
    assert orders == sorted(orders)
    assert not (tmp_path / "tensorboard").exists()


def test_list_callbacks_named_by_class_repeats_get_suffix():
    from torchstage.runner.chain import merge_chain

    class ExtraCallback(Callback):
        pass

    chain = merge_chain({"a": ExtraCallback()}, [ExtraCallback(), ExtraCallback()])
    assert list(chain) == ["a", "extra", "extra_2"]
