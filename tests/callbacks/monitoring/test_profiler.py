"""ProfilerCallback: a Chrome/TensorBoard trace per rank with the window's steps; no profiler outside it."""
import glob
import json
import logging
import os

import pytest
import torch

from tests.helpers import run, tiny_run
from torchstage import Callback, ProfilerCallback

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "profiled_run.py")


class ProfilerSpy(Callback):
    """Records, per global train batch, whether torch's profiler is recording."""

    order = 300

    def __init__(self):
        self.enabled = {}

    def on_batch_start(self, runner):
        if runner.is_train_loader:
            self.enabled[runner.global_batch_step - 1] = torch.autograd.profiler._is_profiler_enabled


def steps_in(folder):
    traces = glob.glob(os.path.join(folder, "*.pt.trace.json"))
    assert len(traces) == 1, traces
    events = json.load(open(traces[0]))["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#"))


def train(logdir, callbacks):
    tiny_run(sgd_lr=0.05, num_epochs=2, logdir=logdir, callbacks=callbacks)


def test_window_trace_table_and_no_cost_outside(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="torchstage")
    spy = ProfilerSpy()
    train(str(tmp_path), {"profiler": ProfilerCallback(begin_on_batch=2, end_after_batch=5), "spy": spy})
    assert steps_in(tmp_path / "profiler" / "rank-0") == [2, 3, 4]
    assert {i for i, on in spy.enabled.items() if on} == {2, 3, 4} and len(spy.enabled) > 5
    table = (tmp_path / "profiler" / "rank-0" / "top_ops.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
    assert any("profiler: top ops of train batches 2-4" in r.getMessage() for r in caplog.records)


def test_a_run_without_the_callback_never_profiles(tmp_path):
    spy = ProfilerSpy()
    train(str(tmp_path), {"spy": spy})
    assert spy.enabled and not any(spy.enabled.values())
    assert not (tmp_path / "profiler").exists()


@pytest.mark.distributed
def test_one_trace_per_rank(tmp_path):
    result = run([SCRIPT, tmp_path], nproc=2, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert steps_in(tmp_path / "profiler" / f"rank-{rank}") == [1, 2, 3]
    assert sorted(os.listdir(tmp_path / "profiler")) == ["rank-0", "rank-1"]


@pytest.mark.parametrize("kwargs, message", [
    ({"begin_on_batch": -1}, r"begin_on_batch must be an integer >= 0, got -1"),
    ({"begin_on_batch": 5, "end_after_batch": 5}, r"end_after_batch must be greater than begin_on_batch=5, got 5"),
    ({"ranks": "0"}, r"ranks must be None \(all ranks\) or a list of ranks >= 0, got '0'"),
])
def test_bad_arguments_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProfilerCallback(**kwargs)
