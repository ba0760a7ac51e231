"""Honest resume: a changed learning rate, num_epochs, architecture or world size is applied with a log line
or refused naming the checkpoint, the parameter and both values."""
import sys

import pytest
import torch
from torch import nn

from tests import script_server
from tests.resume_helpers import ROOT, child_env, tiny_train_kwargs
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, CancelRun, CheckpointError, Epoch, SupervisedRunner, load_checkpoint


def _train(logdir, **overrides):
    return SupervisedRunner().train(**tiny_train_kwargs(str(logdir), **overrides))


def _last(logdir):
    return str(logdir / "checkpoints" / "last.pth")


def _adam(lr):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def test_a_changed_learning_rate_is_refused_naming_checkpoint_and_both_values(tmp_path):
    _train(tmp_path, num_epochs=1)
    model, optimizer = _adam(0.05)
    with pytest.raises(CheckpointError, match=r"cannot resume from .*last\.pth: optimizer 'optimizer' param group 0: "
                                              r"lr is 0\.05 now but 0\.01 in the checkpoint"):
        _train(tmp_path, model=model, optimizer=optimizer, num_epochs=2, resume="last")


@pytest.mark.parametrize("policy, expected", [("new", 0.05), ("checkpoint", 0.01)])
def test_resume_lr_applies_the_new_or_keeps_the_saved_rate_with_a_log_line(tmp_path, caplog, policy, expected):
    _train(tmp_path, num_epochs=1)
    model, optimizer = _adam(0.05)
    caplog.set_level("WARNING", logger="torchstage")
    runner = _train(tmp_path, model=model, optimizer=optimizer, num_epochs=2, resume="last", resume_lr=policy)
    assert runner.optimizer.param_groups[0]["lr"] == expected
    assert load_checkpoint(_last(tmp_path))["optimizers"]["optimizer"]["param_groups"][0]["lr"] == expected
    assert runner.epoch_metrics["train"]["lr"] == expected  # and that is what was logged
    assert f"lr is 0.05 now but 0.01 in the checkpoint; using {expected}" in caplog.text


def test_an_unchanged_learning_rate_under_a_scheduler_resumes_silently(tmp_path):
    model, optimizer = _adam(0.01)
    _train(tmp_path, model=model, optimizer=optimizer, num_epochs=2,
           scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5))
    model, optimizer = _adam(0.01)
    runner = _train(tmp_path, model=model, optimizer=optimizer, num_epochs=3, resume="last",
                    scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5))
    assert runner.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5 ** 3)


def test_a_changed_architecture_names_the_checkpoint_the_parameter_and_both_shapes(tmp_path):
    _train(tmp_path, num_epochs=1)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.Linear(16, 1))
    with pytest.raises(CheckpointError, match=r"cannot resume from .*last\.pth: model 'model' parameter '0\.bias' "
                                              r"is shape \(16,\) now but shape \(8,\) in the checkpoint"):
        _train(tmp_path, model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), num_epochs=2,
               resume="last")


def test_a_larger_num_epochs_continues_and_says_so(tmp_path, caplog):
    _train(tmp_path, num_epochs=2)
    caplog.set_level("WARNING", logger="torchstage")
    runner = _train(tmp_path, num_epochs=3, resume="last")
    assert runner.global_epoch_step == 3
    assert "num_epochs of stage 'main' is 3 now but was 2; training to epoch 3" in caplog.text


def test_num_epochs_already_reached_says_so_and_exits_0(tmp_path):
    _train(tmp_path, num_epochs=3)
    before = load_checkpoint(_last(tmp_path))
    script = (f"from tests.resume_helpers import tiny_train_kwargs\nfrom torchstage import SupervisedRunner\n"
              f"SupervisedRunner().train(**tiny_train_kwargs({str(tmp_path)!r}, num_epochs=2, resume='last'))\n")
    done = script_server.run([sys.executable, "-c", script], env=child_env(), cwd=ROOT, timeout=120, merge=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stage 'main' already trained 3 epoch(s) and num_epochs=2 is reached; nothing to train" in done.stdout
    after = load_checkpoint(_last(tmp_path))
    assert after["loop"] == before["loop"]
    assert all(torch.equal(a, b) for a, b in zip(after["models"]["model"].values(),
                                                 before["models"]["model"].values()))


@pytest.mark.distributed
def test_another_world_size_resumes_and_says_what_changed(tmp_path):
    """An end-of-epoch checkpoint of one process goes on with two (it was refused before): the log names both
    world sizes, the global batch size and the lr scaling to consider."""
    _train(tmp_path, num_epochs=1)
    script = (f"from tests.resume_helpers import tiny_train_kwargs\nfrom torchstage import SupervisedRunner\n"
              f"SupervisedRunner().train(**tiny_train_kwargs({str(tmp_path)!r}, num_epochs=2, resume='last'),\n"
              f"                         distributed=True, nprocs=2)\n")
    done = script_server.run([sys.executable, "-c", script], env=child_env(), cwd=ROOT, timeout=180, merge=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"resume from {_last(tmp_path)}: written by 1 process(es), resumed by 2; the global batch size is 8 now " \
           f"(4 per process), 4 before: scale what depends on it, such as the learning rate (x2 by the linear rule" \
           in done.stdout, done.stdout[-3000:]
    after = load_checkpoint(_last(tmp_path))
    assert (after["meta"]["world_size"], after["loop"]["global_epoch_step"]) == (2, 2)


def _adamw(weight_decay):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=weight_decay)


def test_a_changed_weight_decay_is_refused_like_the_learning_rate(tmp_path):
    model, optimizer = _adamw(0.0)
    _train(tmp_path, model=model, optimizer=optimizer, num_epochs=1)
    model, optimizer = _adamw(0.1)
    with pytest.raises(CheckpointError, match=r"cannot resume from .*last\.pth: optimizer 'optimizer' param group 0: "
                                              r"weight_decay is 0\.1 now but 0\.0 in the checkpoint\. Pass the "
                                              r"checkpoint's weight_decay, or resume_lr='new'"):
        _train(tmp_path, model=model, optimizer=optimizer, num_epochs=2, resume="last")


@pytest.mark.parametrize("policy, expected", [("new", 0.1), ("checkpoint", 0.0)])
def test_resume_lr_decides_for_every_hyperparameter_with_a_log_line(tmp_path, caplog, policy, expected):
    model, optimizer = _adamw(0.0)
    _train(tmp_path, model=model, optimizer=optimizer, num_epochs=1)
    model, optimizer = _adamw(0.1)
    caplog.set_level("WARNING", logger="torchstage")
    runner = _train(tmp_path, model=model, optimizer=optimizer, num_epochs=2, resume="last", resume_lr=policy)
    assert runner.optimizer.param_groups[0]["weight_decay"] == expected
    assert load_checkpoint(_last(tmp_path))["optimizers"]["optimizer"]["param_groups"][0]["weight_decay"] == expected
    assert f"weight_decay is 0.1 now but 0.0 in the checkpoint; using {expected}" in caplog.text


def _sgd():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def test_another_optimizer_class_is_refused_naming_both(tmp_path):
    _train(tmp_path, num_epochs=1)  # Adam
    model, sgd = _sgd()
    with pytest.raises(CheckpointError, match=r"optimizer 'optimizer' is torch\.optim\.sgd\.SGD now but "
                                              r"torch\.optim\.adam\.Adam in the checkpoint"):
        _train(tmp_path, model=model, optimizer=sgd, num_epochs=2, resume="last")


def test_a_checkpoint_without_the_optimizer_class_is_told_apart_by_its_hyperparameters(tmp_path):
    from torchstage.files.atomic import write_atomic
    from torchstage.files.checkpoint_file import serialize
    _train(tmp_path, num_epochs=1)  # Adam
    checkpoint = load_checkpoint(_last(tmp_path))
    del checkpoint["meta"]["optimizers"]  # as torchstage wrote it before it kept the class
    write_atomic(_last(tmp_path), serialize(checkpoint))
    model, sgd = _sgd()
    with pytest.raises(CheckpointError, match=r"optimizer 'optimizer' is torch\.optim\.sgd\.SGD now but an optimizer "
                                              r"with hyperparameters \[.*'betas'.*\] in the checkpoint"):
        _train(tmp_path, model=model, optimizer=sgd, num_epochs=2, resume="last")


class SeenIds(Callback):
    """Records, per (global epoch, global batch), the ids (first feature) of each train batch."""

    order = 1

    def __init__(self):
        self.seen = {}

    def on_batch_start(self, runner):
        if runner.is_train_loader:
            self.seen[(runner.global_epoch_step, runner.global_batch_step)] = runner.batch[0][:, 0].long().tolist()


class StopAfter(Callback):
    order = 500

    def __init__(self, batch):
        self.batch = batch

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.batch:
            raise CancelRun()


def _id_run(logdir, batch_size, callbacks, samples=40, **overrides):
    """Shuffled train samples whose first feature is their id; a mid-epoch checkpoint every 3 train batches."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.arange(samples, dtype=torch.float32)[:, None], torch.randn(samples, 5, generator=g)], 1)
    y = torch.randn(samples, 1, generator=g)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    return SupervisedRunner().train(**{**tiny_train_kwargs(
        str(logdir), model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), num_epochs=2,
        loaders={"train": DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True),
                 "valid": DataLoader(TensorDataset(x[:8], y[:8]), batch_size=4)},
        checkpoint_period=(Batch(3), Epoch(1)), callbacks=callbacks), **overrides})


@pytest.mark.parametrize("new_batch_size", [8, 3])
def test_a_changed_batch_size_mid_epoch_resumes_at_the_same_sample(tmp_path, caplog, new_batch_size):
    """Interrupted after 8 samples of epoch 2 in batches of 4, resumed in batches of 8 (or 3): the epoch sees each
    of its 40 samples exactly once."""
    first = SeenIds()
    _id_run(tmp_path, 4, [first, StopAfter(13)])  # epoch 2 is global batches 11-20; last.pth after batch 12
    assert load_checkpoint(_last(tmp_path))["loop"]["loader_sample_step"] == 8
    before = [i for (epoch, batch), ids in first.seen.items() if epoch == 2 and batch <= 12 for i in ids]
    caplog.set_level("WARNING", logger="torchstage")
    second = SeenIds()
    runner = _id_run(tmp_path, new_batch_size, [second], resume="last")
    after = [i for (epoch, _), ids in second.seen.items() if epoch == 2 for i in ids]
    assert sorted(before + after) == list(range(40)) and len(before) == 8
    assert f"was interrupted after 8 samples in batches of 4; its batches hold {new_batch_size} now, so the pass " \
           f"goes on from sample 9" in caplog.text
    assert runner.global_epoch_step == 2


def test_a_changed_dataset_size_mid_epoch_is_refused(tmp_path):
    _id_run(tmp_path, 4, [StopAfter(13)])
    with pytest.raises(CheckpointError, match=r"written in the middle of loader 'train' of stage 'main', whose "
                                              r"dataset had 40 samples; it has 44 now"):
        _id_run(tmp_path, 4, [], samples=44, resume="last")


def test_resume_last_refuses_a_logdir_whose_checkpoints_are_gone_while_its_logs_remain(tmp_path, caplog,
                                                                                       monkeypatch):
    import shutil
    _train(tmp_path, num_epochs=2)
    shutil.rmtree(tmp_path / "checkpoints")
    with pytest.raises(FileExistsError, match=r"resume='last': logdir .* holds the logs of an earlier run "
                                              r"\(logs/train\.csv, logs/valid\.csv\) but no checkpoint in .*checkpoints, "
                                              r"so there is nothing to continue.*overwrite=True to start over"):
        _train(tmp_path, num_epochs=3, resume="last")
    assert not (tmp_path / "checkpoints").exists()  # refused before anything was written
    caplog.set_level("WARNING", logger="torchstage")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted job whose first attempt left no checkpoint
    runner = _train(tmp_path, num_epochs=3, resume="last")
    assert runner.global_epoch_step == 3 and "starting the run over" in caplog.text


def test_resume_last_on_a_new_logdir_starts_a_run(tmp_path):
    assert _train(tmp_path / "new", num_epochs=1, resume="last").global_epoch_step == 1


def test_resume_auto_starts_continues_its_own_run_and_refuses_another_jobs(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("TORCHSTAGE_JOB_ID", "job-a")
    assert _train(tmp_path, num_epochs=1, resume="auto").global_epoch_step == 1  # an empty logdir: a new run
    assert load_checkpoint(_last(tmp_path))["meta"]["job"] == {"torchstage_job": "job-a"}
    assert _train(tmp_path, num_epochs=2, resume="auto").global_epoch_step == 2  # this job's run: it goes on
    monkeypatch.setenv("TORCHSTAGE_JOB_ID", "job-b")
    with pytest.raises(FileExistsError, match=r"resume='auto': logdir .* holds the run of another job \(.*last\.pth: "
                                              r"torchstage_job job-a; this is torchstage_job job-b\); pass "
                                              r"resume='last' to continue it anyway"):
        _train(tmp_path, num_epochs=3, resume="auto")
    monkeypatch.delenv("TORCHSTAGE_JOB_ID")  # no id to tell the jobs apart: the logdir's run goes on
    assert _train(tmp_path, num_epochs=3, resume="auto").global_epoch_step == 3
