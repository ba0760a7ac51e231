"""CheckpointCallback: last/best/top-k files, batch periods, metrics.json, load_best_on_end, argument errors."""
import json
import os

import pytest
import torch

from torchstage import Batch, CheckpointCallback, Epoch, SupervisedRunner, load_checkpoint

from tests.resume_helpers import tiny_train_kwargs


def _run(tmp_path, **overrides):
    kwargs = tiny_train_kwargs(tmp_path, **overrides)
    runner = SupervisedRunner().train(**kwargs)
    folder = tmp_path / "checkpoints"
    return runner, kwargs, folder, json.loads((folder / "metrics.json").read_text())


def test_topk_keeps_the_k_best_epochs_and_best_pth(tmp_path):
    runner, _, folder, summary = _run(tmp_path, num_epochs=5, topk=2)
    values = {e["global_epoch"]: e["value"] for e in summary["history"]}
    best_two = sorted(values, key=values.get)[:2]
    assert sorted(f for f in os.listdir(folder) if f.startswith("epoch-")) == \
        sorted(f"epoch-{e:04d}.pth" for e in best_two)
    best = load_checkpoint(str(folder / "best.pth"))
    assert best["loop"]["global_epoch_step"] == best_two[0]
    assert summary["best"]["global_epoch"] == best_two[0]
    assert [e["global_epoch"] for e in summary["topk"]] == best_two
    assert load_checkpoint(str(folder / "last.pth"))["loop"]["global_epoch_step"] == 5


def test_topk_zero_writes_no_epoch_files(tmp_path):
    _, _, folder, _ = _run(tmp_path, topk=0)
    assert not [f for f in os.listdir(folder) if f.startswith("epoch-")]
    assert (folder / "best.pth").exists() and (folder / "last.pth").exists()


def test_load_best_on_end_puts_best_weights_in_the_model(tmp_path):
    # maximising the loss makes an early epoch the best one, so best.pth differs from last.pth
    runner, kwargs, folder, summary = _run(tmp_path, num_epochs=4, load_best_on_end=True,
                                           minimize_valid_metric=False)
    best = load_checkpoint(str(folder / "best.pth"))
    assert best["loop"]["global_epoch_step"] < 4 == summary["last"]["global_epoch"]
    state = kwargs["model"].state_dict()
    assert all(torch.equal(state[k], v) for k, v in best["models"]["model"].items())


def test_batch_period_writes_mid_epoch_checkpoints(tmp_path):
    seen = []

    class Spy(CheckpointCallback):
        def save_last(self, runner):
            seen.append((runner.global_batch_step, runner.epoch_done))
            return super().save_last(runner)

    _run(tmp_path, num_epochs=2, callbacks={"checkpoint": Spy(period=Batch(4))})
    assert seen == [(4, False), (8, False), (12, False), (16, False), (20, False)]


def test_epoch_period_every_two_epochs_and_at_stage_end(tmp_path):
    written = []
    original = CheckpointCallback.on_epoch_end

    class Spy(CheckpointCallback):
        def on_epoch_end(self, runner):
            before = os.path.getmtime(self.folder(runner) + "/last.pth") if os.path.exists(
                self.folder(runner) + "/last.pth") else None
            original(self, runner)
            after = os.path.getmtime(self.folder(runner) + "/last.pth") if os.path.exists(
                self.folder(runner) + "/last.pth") else None
            written.append(after is not None and after != before)

    _run(tmp_path, num_epochs=5, callbacks={"checkpoint": Spy(period=Epoch(2))})
    assert load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["loop"]["epoch"] == 5
    assert written[0] is False and written[1] is True and written[2] is False


@pytest.mark.parametrize("kwargs, message", [
    ({"topk": -1}, "topk must be an integer >= 0"),
    ({"topk": 1.0}, "topk must be an integer >= 0"),
    ({"load_best_on_end": True, "logdir": None}, "load_best_on_end=True needs a logdir"),
])
def test_argument_errors_name_the_argument(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SupervisedRunner().train(**{**tiny_train_kwargs(tmp_path), **kwargs})
