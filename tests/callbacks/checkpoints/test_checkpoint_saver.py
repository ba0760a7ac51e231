"""CheckpointCallback: last/best/top-k files, periods, metrics.json, load_best_on_end, loading into a fresh model."""
import json
import os

import pytest
import torch

from tests.conftest import regression_loaders
from tests.helpers import tiny_run
from tests.resume_helpers import tiny_train_kwargs
from torchstage import (Batch, CheckpointCallback, CheckpointError, Epoch, SupervisedRunner, load_checkpoint,
                        load_model_weights)
from torchstage.files.atomic import write_atomic
from torchstage.files.checkpoint_file import serialize
from torchstage.files.checkpoint_format import FORMAT


def make_net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def train(logdir, num_epochs=4, lr=0.05, **kwargs):
    torch.manual_seed(0)
    model = make_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    runner = tiny_run(model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 2),
                      num_epochs=num_epochs, logdir=str(logdir), **kwargs)
    return runner, model


def test_last_and_best_load_into_fresh_model(tmp_path):
    runner, model = train(tmp_path)
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert last["format"] == FORMAT
    assert last["loop"]["epoch"] == 4 and last["loop"]["epoch_done"]
    assert set(last) >= {"models", "optimizers", "schedulers", "callbacks", "loop", "rng", "metrics", "meta"}
    fresh = make_net()
    load_model_weights(fresh, str(tmp_path / "checkpoints" / "last.pth"))
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    # the full state is plain data: weights_only loading of the raw file works
    raw = torch.load(tmp_path / "checkpoints" / "last.pth", weights_only=True)
    assert raw["schedulers"]["scheduler"]["last_epoch"] == 4
    assert raw["meta"]["hparams"]["num_epochs"] == 4


def test_best_follows_valid_metric_and_metrics_json(tmp_path):
    train(tmp_path, num_epochs=5, lr=0.05)
    summary = json.loads((tmp_path / "checkpoints" / "metrics.json").read_text())
    values = [entry["metrics"]["valid"]["loss"] for entry in summary["history"]]
    assert len(values) == 5
    best_epoch = min(range(5), key=values.__getitem__) + 1
    assert summary["best"]["epoch"] == best_epoch
    assert summary["best"]["value"] == pytest.approx(min(values))
    best = load_checkpoint(str(tmp_path / "checkpoints" / "best.pth"))
    assert best["loop"]["epoch"] == best_epoch
    assert best["metrics"]["valid"]["loss"] == pytest.approx(min(values))


def test_maximised_metric_picks_highest(tmp_path):
    train(tmp_path, num_epochs=3, valid_metric="loss", minimize_valid_metric=False)
    summary = json.loads((tmp_path / "checkpoints" / "metrics.json").read_text())
    values = [entry["metrics"]["valid"]["loss"] for entry in summary["history"]]
    assert summary["best"]["value"] == pytest.approx(max(values))


def test_ddp_and_compile_prefixes_are_stripped(tmp_path):
    model = make_net()
    prefixed = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    path = str(tmp_path / "wrapped.pth")
    write_atomic(path, serialize({"format": FORMAT, "models": {"model": prefixed}}))
    fresh = make_net()
    load_model_weights(fresh, path)
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


def test_foreign_files_are_refused_clearly(tmp_path):
    plain = tmp_path / "plain.pth"
    torch.save({"weights": torch.zeros(1)}, plain)
    with pytest.raises(CheckpointError, match=r"is not a torchstage checkpoint: format is None, expected 'torchstage/1'"):
        load_checkpoint(str(plain))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(str(tmp_path / "missing.pth"))


def test_resume_from_epoch_end_continues_to_same_weights(tmp_path):
    _, uninterrupted = train(tmp_path / "full", num_epochs=4)
    train(tmp_path / "part", num_epochs=2)
    runner, resumed = train(tmp_path / "part", num_epochs=4, resume="last")
    assert runner.global_epoch_step == 4
    for a, b in zip(resumed.state_dict().values(), uninterrupted.state_dict().values()):
        assert torch.equal(a, b)


def test_metrics_history_is_kept_whole_across_a_resume_also_from_a_file_written_before(tmp_path):
    """The history travels in the checkpoint as JSON lines; a file holding it as a list (written before) resumes
    to the same metrics.json as the uninterrupted run."""
    train(tmp_path / "full", num_epochs=4)
    full = json.loads((tmp_path / "full" / "checkpoints" / "metrics.json").read_text())
    for part, older in (("part", False), ("older", True)):
        train(tmp_path / part, num_epochs=2)
        last = tmp_path / part / "checkpoints" / "last.pth"
        checkpoint = load_checkpoint(str(last))
        state = checkpoint["callbacks"]["checkpoint"]
        assert [json.loads(line)["epoch"] for line in state["history_jsonl"].splitlines()] == [1, 2]
        if older:
            state["history"] = [json.loads(line) for line in state.pop("history_jsonl").splitlines()]
            write_atomic(str(last), serialize(checkpoint))
        train(tmp_path / part, num_epochs=4, resume="last")
        summary = json.loads((tmp_path / part / "checkpoints" / "metrics.json").read_text())
        assert summary["history"] == full["history"] and summary["best"] == full["best"], part


def test_same_checkpoint_under_several_names_is_independent_files(tmp_path):
    train(tmp_path, num_epochs=1, topk=1)
    folder = tmp_path / "checkpoints"
    last, best, epoch = (os.stat(folder / name) for name in ("last.pth", "best.pth", "epoch-0001.pth"))
    assert len({last.st_ino, best.st_ino, epoch.st_ino}) == 3 and last.st_nlink == 1  # not hard links
    assert (folder / "last.pth").read_bytes() == (folder / "best.pth").read_bytes()
    # damage to one name (in place, as `cp other.pth last.pth` or truncate would do) leaves the others intact
    before = (folder / "best.pth").read_bytes()
    with open(folder / "last.pth", "r+b") as f:
        f.truncate(100)
    assert (folder / "best.pth").read_bytes() == before == (folder / "epoch-0001.pth").read_bytes()
    (folder / "last.pth").unlink()
    assert (folder / "best.pth").read_bytes() == before


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


@pytest.mark.parametrize("topk", [0, None])  # None: the default
def test_topk_zero_writes_no_epoch_files(tmp_path, topk):
    _, _, folder, summary = _run(tmp_path, **({} if topk is None else {"topk": topk}))
    assert sorted(os.listdir(folder)) == ["best.pth", "last.pth", "metrics.json"]
    assert summary["topk"] == [] and summary["best"]["global_epoch"] >= 1
    best = load_checkpoint(str(folder / "best.pth"))  # the best epoch is best.pth, named in metrics.json
    assert best["loop"]["global_epoch_step"] == summary["best"]["global_epoch"]


@pytest.mark.parametrize("resumed_topk", [0, 1])
def test_resuming_with_a_smaller_topk_drops_the_files_kept_beyond_it(tmp_path, resumed_topk):
    train(tmp_path, num_epochs=3, topk=2)
    folder = tmp_path / "checkpoints"
    assert len(list(folder.glob("epoch-*.pth"))) == 2
    train(tmp_path, num_epochs=4, topk=resumed_topk, resume="last")
    summary = json.loads((folder / "metrics.json").read_text())
    kept = sorted(p.name for p in folder.glob("epoch-*.pth"))
    assert kept == [entry["file"] for entry in summary["topk"]] and len(kept) == resumed_topk
    if resumed_topk:
        assert kept == [f"epoch-{summary['best']['global_epoch']:04d}.pth"]


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


def test_only_a_mid_epoch_checkpoint_keeps_the_random_state_its_loader_pass_started_from(tmp_path):
    """A mid-epoch resume replays the interrupted pass from that state; after an epoch the next passes draw
    their own, so an end-of-epoch checkpoint does not carry (and write) it."""
    rng = {}

    class Spy(CheckpointCallback):
        def save_last(self, runner):
            rng["mid-epoch"] = runner.state_dict()["rng"][0]
            return super().save_last(runner)

    _run(tmp_path, num_epochs=1, callbacks={"checkpoint": Spy(period=Batch(4))})
    assert "loader_start" in rng["mid-epoch"]
    end = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert end["loop"]["epoch_done"] and "loader_start" not in end["rng"][0] and "torch" in end["rng"][0]


def test_epoch_period_every_two_epochs_and_at_stage_end(tmp_path):
    written = []
    original = CheckpointCallback.on_epoch_end

    class Spy(CheckpointCallback):
        def on_epoch_end(self, runner):
            before = os.path.getmtime(self.folder(runner) + "/last.pth") if os.path.exists(
                self.folder(runner) + "/last.pth") else None
            original(self, runner)
            runner.file_writer.wait()  # the files of this epoch have landed
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


def test_resume_last_looks_where_a_checkpoint_callback_with_its_own_folder_writes(tmp_path):
    """A CheckpointCallback given its own logdir writes there, and resume='last' continues from that last.pth."""
    own = tmp_path / "elsewhere"
    train(tmp_path / "run", num_epochs=2, callbacks={"checkpoint": CheckpointCallback(logdir=str(own))})
    assert (own / "checkpoints" / "last.pth").exists() and not (tmp_path / "run" / "checkpoints").exists()
    runner, _ = train(tmp_path / "run", num_epochs=3, resume="last",
                      callbacks={"checkpoint": CheckpointCallback(logdir=str(own))})
    assert runner.global_epoch_step == 3 and runner.global_batch_step == 3 * len(regression_loaders()["train"])
    assert load_checkpoint(str(own / "checkpoints" / "last.pth"))["loop"]["epoch"] == 3
    with pytest.raises(FileExistsError, match="already holds a run"):  # a new run there would overwrite it
        train(tmp_path / "run", num_epochs=1, callbacks={"checkpoint": CheckpointCallback(logdir=str(own))})
