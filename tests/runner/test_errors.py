"""A user error that train() finds before training reaches the user under their own call, without torchstage's
frames; the full trace with TORCHSTAGE_FULL_TRACEBACK=1 or the torchstage logger at DEBUG; errors of the user's own
code keep their frames."""
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from tests import script_server
from tests.conftest import regression_loaders
from tests.resume_helpers import ROOT, child_env
import torchstage
from torchstage import SupervisedRunner

PACKAGE = os.path.dirname(os.path.abspath(torchstage.__file__)) + os.sep

SCRIPT = textwrap.dedent("""\
    import torch
    from torchstage import SupervisedRunner
    from tests.conftest import regression_loaders

    model = torch.nn.Linear(4, 1)
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders=regression_loaders(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1), num_epochs=0)
""")
MESSAGE = "ValueError: num_epochs must be an integer >= 1, got 0"


def _run_script(tmp_path, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    return script_server.run([sys.executable, str(script)], env=child_env(**env), cwd=ROOT, timeout=120)


def _printed_frames(stderr: str) -> list:
    return re.findall(r'^  File "([^"]+)", line \d+', stderr, re.MULTILINE)


def _frames(exc) -> list:
    tb, files = exc.__traceback__, []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return files


def _train(**overrides):
    model = overrides.pop("model", None) or torch.nn.Linear(4, 1)
    kwargs = dict(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  loaders=regression_loaders(), num_epochs=1)
    kwargs.update(overrides)
    return SupervisedRunner().train(**kwargs)


def test_a_script_shows_its_own_call_and_the_message(tmp_path):
    done = _run_script(tmp_path)
    assert done.returncode == 1, done.stderr
    frames = _printed_frames(done.stderr)
    assert frames[0].endswith("user_script.py")
    others = [f for f in frames if not f.endswith("user_script.py")]
    assert len(others) <= 1 and all(os.path.abspath(f).startswith(PACKAGE) for f in others), done.stderr
    assert MESSAGE in done.stderr.splitlines()
    assert "TORCHSTAGE_FULL_TRACEBACK=1" in done.stderr  # how to see the rest


def test_the_full_trace_with_the_environment_variable(tmp_path):
    done = _run_script(tmp_path, TORCHSTAGE_FULL_TRACEBACK="1")
    assert done.returncode == 1, done.stderr
    frames = _printed_frames(done.stderr)
    assert any(f.endswith("spec_stages.py") for f in frames), done.stderr  # where the check raised
    assert done.stderr.rstrip().splitlines()[-1] == MESSAGE


def test_errors_found_while_preparing_the_run_are_short_too():
    def make_datasets():  # its loader names are checked in prepare(), once it has run
        return {"trian": torch.utils.data.TensorDataset(torch.rand(8, 4), torch.rand(8, 1))}

    with pytest.raises(ValueError, match="no loader trains") as err:
        _train(loaders=None, datasets={"batch_size": 4, "get_datasets_fn": make_datasets})
    ours = [f for f in _frames(err.value) if f.startswith(PACKAGE)]
    assert len(ours) == 1 and ours[0].endswith(os.path.join("runner", "runner.py"))  # Runner.train, the user's call
    assert set(_frames(err.value)) == {__file__, ours[0]}  # this test's frames and one of torchstage's


def test_the_full_trace_with_the_torchstage_logger_at_debug(monkeypatch):
    monkeypatch.setattr(logging.getLogger("torchstage"), "level", logging.DEBUG)
    with pytest.raises(ValueError, match="num_epochs must be an integer >= 1") as err:
        _train(num_epochs=0)
    assert any(f.endswith("spec_stages.py") for f in _frames(err.value))


class Failing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x):
        raise ValueError("the user's own model failed")


def test_an_error_of_the_users_model_keeps_its_frames():
    """The user's frames (and torch's, where the model runs) stay; torchstage's loop in between is hidden, as it is
    for an argument error."""
    with pytest.raises(ValueError, match="the user's own model failed") as err:
        _train(model=Failing())
    frames = _frames(err.value)
    assert frames[-1] == __file__  # raised in Failing.forward
    assert any(f.endswith(os.path.join("torch", "nn", "modules", "module.py")) for f in frames)
    assert [f for f in frames if f.startswith(PACKAGE)] == [os.path.join(PACKAGE, "runner", "runner.py")], frames
    assert any("TORCHSTAGE_FULL_TRACEBACK=1" in note for note in err.value.__notes__)


FIRST_BATCH = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torchstage import SupervisedRunner

    x, y = torch.randn(16, 4), torch.randint(0, 3, (16, 1))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = torch.nn.Linear(4, 3)
    SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(), loaders={"train": loader},
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1), valid_loader="train")
""")


def test_a_first_batch_error_hides_torchstages_frames_as_an_argument_error_does(tmp_path):
    """Before, a first-batch error printed ~30 lines of torchstage's loop; now it shows the user's call and the
    message, as train()'s argument errors do, and the full trace on request."""
    script = tmp_path / "first_batch.py"
    script.write_text(FIRST_BATCH)
    done = script_server.run([sys.executable, str(script)], env=child_env(), cwd=ROOT, timeout=120)
    assert done.returncode == 1, done.stderr
    frames = _printed_frames(done.stderr)
    assert frames[0].endswith("first_batch.py")
    ours = [f for f in frames if os.path.abspath(f).startswith(PACKAGE)]
    assert len(ours) <= 1, done.stderr  # train()'s own call, as for an argument error
    assert "class-index targets need shape [8] (one class per sample)" in done.stderr
    assert "TORCHSTAGE_FULL_TRACEBACK=1" in done.stderr
    full = script_server.run([sys.executable, str(script)], env=child_env(TORCHSTAGE_FULL_TRACEBACK="1"), cwd=ROOT,
                             timeout=120)
    assert any(f.endswith("loss_checks.py") for f in _printed_frames(full.stderr)), full.stderr


def test_an_error_of_the_users_dataset_function_keeps_its_frames():
    def make_datasets():
        raise ValueError("the user's own data failed")

    with pytest.raises(ValueError, match="the user's own data failed") as err:
        _train(loaders=None, datasets={"batch_size": 4, "get_datasets_fn": make_datasets})
    frames = _frames(err.value)
    assert frames[-1] == __file__  # raised in make_datasets; torchstage's frames between hidden, as for the model
    assert [f for f in frames if f.startswith(PACKAGE)] == [os.path.join(PACKAGE, "runner", "runner.py")], frames
