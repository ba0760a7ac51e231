"""A runner's own on_* methods run as Catalyst 22 runs them: start methods before the callbacks (after the loop's
bookkeeping), end methods after them and before the loggers; on every loader; under evaluate_loader too."""
import csv
import logging

import torchstage as dl
from tests.conftest import regression_loaders
from tests.helpers import tiny_run


class Recorder(dl.Callback):
    def __init__(self, tag, order):
        super().__init__(order)
        self.tag, self.events = tag, None

    def on_loader_start(self, runner):
        runner.events.append((self.tag, "on_loader_start", runner.loader_key))

    def on_batch_start(self, runner):
        runner.events.append((self.tag, "on_batch_start", runner.loader_key))

    def on_loader_end(self, runner):
        runner.events.append((self.tag, "on_loader_end", runner.loader_key,
                              dict(runner.loader_metrics).get("custom")))

    def on_exception(self, runner):
        runner.events.append((self.tag, "on_exception"))


class HookedRunner(dl.SupervisedRunner):
    """Catalyst 22's shape: each override calls super() and keeps its own state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.events = []

    def on_experiment_start(self, runner):
        super().on_experiment_start(runner)
        self.events.append(("runner", "on_experiment_start"))

    def on_epoch_start(self, runner):
        super().on_epoch_start(runner)
        self.events.append(("runner", "on_epoch_start", runner.epoch_step))

    def on_loader_start(self, runner):
        super().on_loader_start(runner)
        self.seen = 0
        self.events.append(("runner", "on_loader_start", runner.loader_key, self.model.training))

    def on_batch_start(self, runner):
        super().on_batch_start(runner)
        self.events.append(("runner", "on_batch_start", runner.loader_key))

    def on_batch_end(self, runner):
        self.seen += len(self.batch["features"])
        super().on_batch_end(runner)

    def on_loader_end(self, runner):
        self.loader_metrics["custom"] = float(self.seen)
        self.loader_metrics["loss"] = 42.0  # what the runner writes wins over the averaged batch loss
        self.events.append(("runner", "on_loader_end", runner.loader_key, self.loader_metrics.get("custom")))
        super().on_loader_end(runner)


def train(runner, tmp_path=None, **kwargs):
    return tiny_run(runner=runner, num_epochs=2, logdir=tmp_path, **kwargs)


def test_runner_event_methods_run_around_the_callbacks_and_their_metrics_reach_the_loggers(tmp_path, caplog):
    runner = HookedRunner()
    metric, logging_phase = Recorder("metric", dl.CallbackOrder.Metric), Recorder("logger", dl.CallbackOrder.Logging)
    with caplog.at_level(logging.INFO, logger="torchstage"):
        train(runner, tmp_path, callbacks=[metric, logging_phase])
    events = runner.events
    assert events[0] == ("runner", "on_experiment_start")
    assert [e[2] for e in events if e[1] == "on_epoch_start"] == [1, 2]  # the loop's count is already advanced
    first_valid = events.index(("runner", "on_loader_start", "valid", False))  # eval mode already set
    assert events[first_valid:first_valid + 3] == [("runner", "on_loader_start", "valid", False),
                                                   ("metric", "on_loader_start", "valid"),
                                                   ("logger", "on_loader_start", "valid")]
    # valid batches too (the runner is no train-only callback), the runner first
    assert events[first_valid + 3:first_valid + 5] == [("runner", "on_batch_start", "valid"),
                                                       ("metric", "on_batch_start", "valid")]
    end = events.index(("metric", "on_loader_end", "valid", None))
    assert events[end:end + 3] == [("metric", "on_loader_end", "valid", None),
                                   ("runner", "on_loader_end", "valid", 64.0),
                                   ("logger", "on_loader_end", "valid", 64.0)]
    assert runner.epoch_metrics["valid"] == {"custom": 64.0, "loss": 42.0}
    with open(tmp_path / "logs" / "valid.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(float(r["custom"]), float(r["loss"])) for r in rows] == [(64.0, 42.0), (64.0, 42.0)]
    assert "runner.batch_step in a runner with its own on_* methods" in caplog.text  # torchstage's meaning, said


def test_runner_on_exception_runs_after_the_callbacks():
    class Failing(HookedRunner):
        def handle_batch(self, batch):
            raise RuntimeError("boom")

        def on_exception(self, runner):
            self.events.append(("runner", "on_exception"))

    runner = Failing()
    try:
        train(runner, callbacks=[Recorder("metric", dl.CallbackOrder.Metric)])
    except RuntimeError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("the failing step did not raise")
    assert runner.events[-2:] == [("metric", "on_exception"), ("runner", "on_exception")]


def test_runner_event_methods_run_under_evaluate_loader():
    runner = HookedRunner()
    train(runner)
    runner.events.clear()
    metrics = runner.evaluate_loader(regression_loaders()["valid"])
    assert metrics["custom"] == 64.0 and ("runner", "on_loader_start", "valid", False) in runner.events


def test_a_runner_without_overrides_has_no_extra_handlers():
    runner = dl.SupervisedRunner()
    train(runner)
    assert all(getattr(handler, "__self__", None) is not runner for handlers in runner._handlers.values()
               for handler in handlers)
