"""Rollbacks past bad batches: a run over data with a NaN sample and a spiking sample rolls back past every batch
holding one and ends bitwise equal to a run whose loaders never gave those batches; killed right after a rollback
and resumed, it ends as the uninterrupted one; bounded by max_rollbacks; refused where it cannot work."""
import json
import os
import re
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests import script_server
from tests.resume_helpers import ROOT, child_env, differences
from torchstage import (Callback, LossSpikeError, NonFiniteLossCallback, NonFiniteLossError, SingleDevice,
                        SupervisedRunner, load_checkpoint)

SCRIPT = os.path.join(ROOT, "tests", "callbacks", "training", "scripts", "rollback_run.py")
NAN_ID, SPIKE_ID = 21, 45  # the script's poisoned samples
#: The parts of two final checkpoints that must be bitwise equal (the loader metric ``rollbacks`` aside).
SAME = ("models", "optimizers", "schedulers", "loop", "rng")


def rollback_run(logdir, mode="rollback", **env):
    proc = script_server.run([sys.executable, SCRIPT, str(logdir), mode], env=child_env(**env), timeout=240, merge=True)
    return proc.returncode, proc.stdout


def last(logdir):
    return load_checkpoint(str(logdir / "checkpoints" / "last.pth"))


def skip_list(checkpoint) -> list:
    return checkpoint["callbacks"]["rollback"]["skipped"]


def metrics_without_rollbacks(checkpoint) -> dict:
    return {loader: {k: v for k, v in values.items() if k != "rollbacks"}
            for loader, values in checkpoint["metrics"].items()}


@pytest.fixture(scope="module")
def whole_runs(tmp_path_factory):
    """``nproc -> (logdir, exit code, output)`` of the rollback run with checkpoints every 2 batches, run once for
    the comparison with the reference and for the one with a run killed and resumed."""
    done = {}

    def run(nproc: int):
        if nproc not in done:
            logdir = tmp_path_factory.mktemp(f"whole-{nproc}")
            done[nproc] = (logdir, *rollback_run(logdir, NPROC=nproc, PERIOD=2))
        return done[nproc]
    return run


def check_against_reference(tmp_path, nproc: int, whole=None, **env):
    """The rollback run (``whole``: one run already, else run here): exit 0, finite weights, every rollback logged
    and every skipped batch holding a poisoned sample; the same run whose loaders leave out the skipped batches
    ends with the same bits."""
    logdir, code, out = whole or (tmp_path / "rollback", *rollback_run(tmp_path / "rollback", NPROC=nproc, **env))
    assert code == 0, out[-4000:]
    final = last(logdir)
    assert all(torch.isfinite(t).all() for t in final["models"]["model"].values())
    skipped = skip_list(final)
    lines = [line for line in out.splitlines() if "rollback " in line and " of at most 10: " in line]
    assert len(lines) == len(skipped) == final["callbacks"]["rollback"]["rollbacks"] == 6, out[-4000:]
    for line, entry in zip(lines, skipped):  # which loss, which batch, which samples, back to which step
        ranks = [s.tolist() for s in entry["samples"]]
        assert len(ranks) == nproc and any(NAN_ID in s or SPIKE_ID in s for s in ranks), (line, ranks)
        kind = "non-finite loss: 'loss' was nan" if any(NAN_ID in s for s in ranks) else "loss spike: 'loss' was "
        assert kind in line and f"ordinal {entry['ordinal']} of the pass" in line, line
        assert re.search(r"back to global batch \d+ \(", line) and f"(global batch {entry['global_batch']})" in line
        shown = "; ".join(", ".join(map(str, s)) + (f" on rank {r}" if nproc > 1 else "") for r, s in enumerate(ranks))
        assert f"samples {shown})" in line, line
    for epoch in (1, 2, 3):  # each poisoned sample once an epoch, each in a batch that was left out
        held = [i for e in skipped if e["epoch"] == epoch for s in e["samples"] for i in s.tolist()]
        assert NAN_ID in held and SPIKE_ID in held, (epoch, skipped)
    assert [row.split(",")[3] for row in open(logdir / "logs" / "train.csv").read().split()[1:]] == \
        ["2.0", "2.0", "2.0"]  # counted in the loggers, per epoch
    drops = json.dumps([[e["epoch"], e["ordinal"]] for e in skipped])
    code, ref_out = rollback_run(tmp_path / "reference", "reference", NPROC=nproc, REFERENCE_DROPS=drops, **env)
    assert code == 0, ref_out[-4000:]  # it stops at any bad loss: no poisoned batch was left in it
    reference = last(tmp_path / "reference")
    assert [d for key in SAME for d in differences(final[key], reference[key], key)] == []
    assert metrics_without_rollbacks(final) == reference["metrics"]


def test_one_process_ends_bitwise_equal_to_the_run_without_the_bad_batches(tmp_path, whole_runs):
    check_against_reference(tmp_path, 1, whole_runs(1), PERIOD=2)


@pytest.mark.distributed
def test_two_processes_end_bitwise_equal_to_the_run_without_the_bad_batches(tmp_path, whole_runs):
    check_against_reference(tmp_path, 2, whole_runs(2), PERIOD=2)


@pytest.mark.distributed
def test_fsdp_rolls_back_its_shards_and_stays_exact(tmp_path):
    """Two processes under strategy="fsdp", one epoch: the snapshots hold each rank's shards (DTensors), put back
    in place; the run equals the FSDP run without the two bad batches of that epoch."""
    code, out = rollback_run(tmp_path / "rollback", NPROC=2, STRATEGY="fsdp", EPOCHS=1)
    assert code == 0 and out.count(" of at most 10: ") == 2, out[-3000:]
    final = last(tmp_path / "rollback")
    drops = json.dumps([[e["epoch"], e["ordinal"]] for e in skip_list(final)])
    code, out = rollback_run(tmp_path / "reference", "reference", NPROC=2, STRATEGY="fsdp", EPOCHS=1,
                             REFERENCE_DROPS=drops)
    assert code == 0, out[-3000:]
    reference = last(tmp_path / "reference")
    assert [d for key in SAME for d in differences(final[key], reference[key], key)] == []


def test_accumulation_rolls_back_to_group_boundaries_and_stays_exact(tmp_path):
    """Checks every 3 batches, groups of 2: a snapshot only where no gradient is held (6, 12...)."""
    check_against_reference(tmp_path, 1, ACCUMULATION=2, CHECK_EVERY=3)


@pytest.mark.parametrize("nproc, kill_at, before", [(1, 12, 1), pytest.param(2, 10, 2, marks=pytest.mark.distributed)])
def test_killed_right_after_a_rollback_and_resumed_it_ends_as_the_uninterrupted_run(tmp_path, whole_runs, nproc,
                                                                                   kill_at, before):
    """Checkpoints every 2 batches; SIGKILL right after a rollback and the checkpoint that records it (global batch
    12 after the one at 10 alone; 10 after the two at 7 with 2 processes); resume='last' skips those batches by the
    skip list it holds."""
    whole_logdir, code, out = whole_runs(nproc)
    assert code == 0, out[-3000:]
    code, out = rollback_run(tmp_path / "killed", NPROC=nproc, PERIOD=2, KILL_AT=kill_at)
    assert code != 0 and out.count(" of at most 10: ") == before, out[-3000:]
    at_kill = last(tmp_path / "killed")
    assert at_kill["loop"]["global_batch_step"] == kill_at and len(skip_list(at_kill)) == before
    code, out = rollback_run(tmp_path / "killed", "resume", NPROC=nproc, PERIOD=2)
    assert code == 0, out[-3000:]
    assert f"rollback {before} of" not in out and f"rollback {before + 1} of at most 10" in out, out[-3000:]
    whole, resumed = last(whole_logdir), last(tmp_path / "killed")
    assert [d for key in (*SAME, "metrics", "callbacks") for d in differences(whole[key], resumed[key], key)] == []


def test_killed_before_a_checkpoint_recorded_the_rollback_it_rolls_back_again(tmp_path):
    """Killed after the third rollback (epoch 2) with only end-of-epoch checkpoints: the resumed run replays epoch 2,
    finds the same bad batches and ends as the uninterrupted run."""
    code, out = rollback_run(tmp_path / "whole")
    assert code == 0, out[-3000:]
    code, out = rollback_run(tmp_path / "killed", KILL_AT=23)
    assert code != 0 and "rollback 3 of at most 10" in out and "rollback 4 " not in out, out[-3000:]
    assert len(skip_list(last(tmp_path / "killed"))) == 2  # epoch 1's, from its end
    code, out = rollback_run(tmp_path / "killed", "resume")
    assert code == 0 and "rollback 3 of at most 10" in out, out[-3000:]
    whole, resumed = last(tmp_path / "whole"), last(tmp_path / "killed")
    assert [d for key in (*SAME, "metrics", "callbacks") for d in differences(whole[key], resumed[key], key)] == []


def test_past_max_rollbacks_the_run_stops_as_mode_stop_does_with_the_reason(tmp_path):
    code, out = rollback_run(tmp_path, MAX_ROLLBACKS=2)
    assert code != 0, out[-3000:]
    assert "rollback 2 of at most 2" in out and "rollback 3 of" not in out
    assert re.search(r"(NonFiniteLossError: non-finite loss|LossSpikeError: loss spike): .*; not rolled back: it "
                     r"would be rollback 3, over max_rollbacks=2, so the run stops here", out), out[-3000:]
    final = last(tmp_path)  # epoch 1's, written before the third bad batch of epoch 2
    assert final["loop"]["epoch"] == 1 and all(torch.isfinite(t).all() for t in final["models"]["model"].values())


def test_a_spike_alone_under_mode_stop_ends_the_run_naming_it(tmp_path):
    code, out = rollback_run(tmp_path, "reference", NAN_ID=-1)
    assert code != 0
    assert re.search(r"LossSpikeError: loss spike: 'loss' was \S+ \(above 10 x its running median \S+ over the last "
                     r"8 train losses\) at stage 'main', epoch 1, loader 'train', batch \d+ \(global batch \d+\); the "
                     r"run stops", out), out[-3000:]


def _tiny(**train):
    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    model = nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    return SupervisedRunner().train(model=model, criterion=nn.MSELoss(),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                    loaders={"train": loader}, valid_loader="train", **train)


class NoCopies(SingleDevice):
    no_snapshots = "its state lives elsewhere"


def test_a_strategy_without_snapshots_is_refused_before_training():
    with pytest.raises(ValueError, match=r"mode='rollback'\) keeps an in-memory snapshot of the models and optimizers, "
                                         r"and strategy=NoCopies\(\) cannot give one: its state lives elsewhere"):
        _tiny(strategy=NoCopies(), callbacks={"nonfinite": NonFiniteLossCallback(mode="rollback")})


def test_deepspeed_says_why_it_cannot_roll_back():
    from torchstage import DeepSpeed
    assert "ZeRO partitions" in DeepSpeed.no_snapshots


def test_the_rollback_callback_comes_with_the_mode_and_the_arguments_are_checked():
    runner = _tiny(callbacks={"nonfinite": NonFiniteLossCallback(mode="rollback", check_every=3)})
    names = list(runner.callbacks)
    # after every callback whose state the snapshots hold; only the straggler detector comes later, on purpose (the
    # snapshot's time is part of the step it times), and it keeps no state to roll back
    assert names[names.index("rollback") + 1:] == ["stragglers"] and runner.callbacks["stragglers"].state_dict() == {}
    assert runner.callbacks["rollback"].rollbacks == 0
    assert runner.epoch_metrics["train"]["rollbacks"] == 0.0
    assert "rollback" not in _tiny().callbacks  # mode="stop" keeps no snapshots
    with pytest.raises(ValueError, match="mode must be 'stop'.*'skip'.*or 'rollback'"):
        NonFiniteLossCallback(mode="undo")
    with pytest.raises(ValueError, match="max_rollbacks must be an integer >= 1, got 0"):
        NonFiniteLossCallback(mode="rollback", max_rollbacks=0)
    with pytest.raises(TypeError, match="spike must be a LossSpike"):
        NonFiniteLossCallback(spike=10)


def test_the_errors_are_floating_point_errors_with_the_origin_rank():
    for kind in (NonFiniteLossError, LossSpikeError):
        error = kind("message", origin_rank=3)
        assert isinstance(error, FloatingPointError) and error.origin_rank == 3


def test_the_batch_logs_hold_the_run_as_it_trained(tmp_path):
    """The CSV batch rows written for batches later rolled back are cut back: each step once, in order."""
    from torchstage import Batch
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    x[37] = float("nan")
    model = nn.Linear(4, 1)
    runner = SupervisedRunner()
    runner.train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                 loaders={"train": DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)}, valid_loader="train",
                 num_epochs=2, logdir=tmp_path, log_period=Batch(1),
                 callbacks={"nonfinite": NonFiniteLossCallback(mode="rollback", check_every=5)})
    assert runner.callbacks["rollback"].rollbacks == 2  # once an epoch
    steps = [int(row.split(",")[0]) for row in (tmp_path / "logs" / "batch" / "train.csv").read_text().split()[1:]]
    assert steps == list(range(1, 31))  # 2 epochs of 15 batches trained


class InfiniteGradient(torch.autograd.Function):
    """The identity forward; the outputs of the marked samples get an infinite gradient: a finite loss whose backward
    makes the step put NaN/inf into the weights."""

    @staticmethod
    def forward(ctx, output, marker):
        ctx.save_for_backward(marker)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad):
        (marker,) = ctx.saved_tensors
        return grad.masked_fill(marker.bool().unsqueeze(-1), float("inf")), None


class MarkedLinear(nn.Module):
    """A linear model of the features but the last, which marks the samples whose gradient is infinite."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x):
        return InfiniteGradient.apply(self.linear(x[:, :-1]), x[:, -1])


def _marked_run(marked, accumulation, leave_out=(), more=None, logdir=None, **nonfinite):
    """Two epochs of 8 batches of 4 in order; ``marked``: the samples whose gradient is infinite; ``leave_out``: the
    samples the loader leaves out (a reference run, mode="stop"); ``more``: other callbacks."""
    torch.manual_seed(0)
    x, y = torch.cat([torch.randn(32, 4), torch.zeros(32, 1)], dim=1), torch.randn(32, 1)
    x[list(marked), -1] = 1.0
    kept = [i for i in range(32) if i not in leave_out]
    model = MarkedLinear()
    runner = SupervisedRunner()
    runner.train(model=model, criterion=nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                 loaders={"train": DataLoader(TensorDataset(x[kept], y[kept]), batch_size=4)}, valid_loader="train",
                 num_epochs=2, accumulation_steps=accumulation, logdir=logdir,
                 callbacks={"nonfinite": NonFiniteLossCallback(**nonfinite), **(more or {})})
    return runner, model


@pytest.mark.parametrize("accumulation, check_every", [(1, 3), (2, 4)])
def test_an_infinite_gradient_with_a_finite_loss_leaves_out_its_own_batch(accumulation, check_every):
    """Sample 9 (batch 3) has a finite loss and an infinite gradient: the weights are NaN after its step (after the
    step of its group under accumulation) and batch 4's loss is NaN. The check covers the weights and the gradients
    held, so batch 3 is the one left out, once an epoch, and the run equals one whose loader never gave it."""
    runner, model = _marked_run([9], accumulation, mode="rollback", check_every=check_every)
    skipped = runner.callbacks["rollback"].skipped
    assert [(e["epoch"], e["ordinal"], e["samples"][0].tolist()) for e in skipped] == \
        [(1, 3, [8, 9, 10, 11]), (2, 3, [8, 9, 10, 11])]
    assert "non-finite weights or gradients after the step" in skipped[0]["reason"]
    _, reference = _marked_run([], accumulation, leave_out=range(8, 12), mode="stop")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


class TrainPasses(Callback):
    """Counts the train loader's starts and ends."""

    order = 200

    def __init__(self):
        self.starts, self.ends = 0, 0

    def on_loader_start(self, runner):
        self.starts += runner.is_train_loader

    def on_loader_end(self, runner):
        self.ends += runner.is_train_loader


def test_a_pass_ended_by_a_rollback_gets_its_end_events_and_is_logged_once(tmp_path):
    """Every callback gets on_loader_end for the pass a rollback ended, as after any cancel; the loggers write one
    row per epoch, of the pass that went on."""
    passes = TrainPasses()
    runner, _ = _marked_run([9], 1, more={"passes": passes}, logdir=tmp_path, mode="rollback", check_every=3)
    assert runner.callbacks["rollback"].rollbacks == 2 and (passes.starts, passes.ends) == (4, 4)
    rows = (tmp_path / "logs" / "train.csv").read_text().split()
    assert [row.split(",")[:3] for row in rows[1:]] == [["main", "1", "1"], ["main", "2", "2"]], rows
