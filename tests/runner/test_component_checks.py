"""Mistakes that used to train silently (or fail late) are refused before the first batch, saying the fix."""
import pytest
import torch

from tests.conftest import regression_loaders
from tests.helpers import tiny_run
from torchstage import Callback, SupervisedRunner


class NoBatch(Callback):
    def on_batch_start(self, runner):
        raise AssertionError("a batch ran")


def train(**overrides):
    return tiny_run(**{"callbacks": [NoBatch()], **overrides})


def test_optimizer_on_another_models_parameters():
    other = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match=r"optimizer \(SGD\) holds 2 tensor\(s\), none of them a parameter of the "
                                         r"model, so training would change nothing; build it on this model: "
                                         r"SGD\(model.parameters\(\), ...\)"):
        train(optimizer=torch.optim.SGD(other.parameters(), lr=0.1))


def test_optimizer_may_also_hold_the_criterions_parameters():
    model, criterion = torch.nn.Linear(4, 1), torch.nn.PReLU()
    loss = torch.nn.MSELoss()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = criterion

        def forward(self, out, target):
            return loss(self.act(out), target)

    wrapped = Wrapped()
    runner = train(model=model, criterion=wrapped, callbacks=[],
                   optimizer=torch.optim.SGD(list(model.parameters()) + list(wrapped.parameters()), lr=0.1))
    assert runner.global_batch_step > 0


def test_scheduler_on_another_optimizer():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stray = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), lr=0.1), 1)
    with pytest.raises(ValueError, match=r"scheduler \(StepLR\) is bound to another optimizer than the run's optimizer, "
                                         r"so the lr would never change; build it on the same object: "
                                         r"StepLR\(optimizer, ...\)"):
        train(model=model, optimizer=optimizer, scheduler=stray)


def test_stage_overriding_the_optimizer_but_inheriting_the_scheduler():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    with pytest.raises(ValueError, match=r"stages\['ft'\]: scheduler \(StepLR\) is bound to another optimizer than the "
                                         r"stage's optimizer.*or pass scheduler=None in this stage"):
        train(model=model, optimizer=optimizer, scheduler=scheduler,
              stages={"warmup": {"num_epochs": 1},
                      "ft": {"num_epochs": 1, "optimizer": torch.optim.Adam(model.parameters())}})


@pytest.mark.parametrize("name, value, message", [
    ("optimizer", torch.optim.Adam, r"optimizer must be an instance such as Adam\(model.parameters\(\), lr=...\), "
                                    r"got the class torch.optim.adam.Adam"),
    ("criterion", torch.nn.MSELoss, r"criterion must be an instance such as MSELoss\(\), got the class "
                                    r"torch.nn.modules.loss.MSELoss"),
    ("scheduler", torch.optim.lr_scheduler.StepLR, r"scheduler must be an instance such as StepLR\(optimizer, ...\)"),
    ("optimizer", "adam", r"optimizer must be a torch.optim.Optimizer \(with step and zero_grad\), got str"),
])
def test_classes_instead_of_instances(name, value, message):
    with pytest.raises(TypeError, match=message):
        train(**{name: value})


def test_plateau_scheduler_against_the_direction_of_the_valid_metric():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)  # mode='min'
    with pytest.raises(ValueError, match=r"scheduler ReduceLROnPlateau\(mode='min'\) cuts the lr when "
                                         r"valid_metric='loss' stops falling, but minimize_valid_metric=False says "
                                         r"higher is better; build it with mode='max'"):
        train(model=model, optimizer=optimizer, scheduler=plateau, minimize_valid_metric=False)
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau steps on valid_metric='loss', known at epoch end, but "
                                         r"scheduler_step='batch'; use scheduler_step='epoch'"):
        train(model=model, optimizer=optimizer, scheduler=plateau, scheduler_step="batch")


def test_logdir_that_is_a_file(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"logdir='.*metrics.csv' is an existing file, not a directory; pass the "
                                         r"path of a directory"):
        train(logdir=str(path))


def test_misspelt_argument_gets_a_suggestion():
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['num_epoch'\]; accepted: .*; did you mean "
                                        r"'num_epochs' for 'num_epoch'\?"):
        train(num_epoch=3)


def test_resume_naming_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"resume='lats' is neither 'last' \(continue the logdir's run\) nor an "
                                         r"existing checkpoint file \(did you mean 'last'\?\)"):
        train(resume="lats", logdir=str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best.pth").write_bytes(b"")
    missing = str(tmp_path / "checkpoints" / "bset.pth")
    with pytest.raises(ValueError, match=r"did you mean '.*checkpoints/best.pth'\?"):
        train(resume=missing, logdir=str(tmp_path))


def test_logdir_under_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"logdir='.*notes\.txt/run' lies under '.*notes\.txt', which is a file, not a "
                                         r"directory"):
        train(logdir=str(tmp_path / "notes.txt" / "run"))


UNWRITABLE = """
import sys
sys.path.insert(0, {root!r})
from tests.runner.test_component_checks import train
try:
    train(logdir={logdir!r})
except PermissionError as error:
    print("REFUSED", error)
"""


def test_logdir_where_nothing_can_be_written(tmp_path):
    """A read-only file system (tmpfs mounted read-only in a mount namespace of the test's own): refused before
    training, naming the logdir, instead of a raw OSError from the first write."""
    import os
    import shutil
    import subprocess
    import sys
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and util-linux's unshare to mount a read-only file system")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "ro").mkdir()
    logdir = str(tmp_path / "ro" / "run")
    script = UNWRITABLE.format(root=root, logdir=logdir)
    result = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro,size=1m tmpfs {tmp_path / 'ro'} && "
                             f"{sys.executable} -c \"$0\"", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"REFUSED logdir={logdir!r}: this process cannot write in {str(tmp_path / 'ro')!r} (permission denied, " \
           f"or a read-only file system)" in result.stdout, result.stdout + result.stderr


def _one_cycle(total_steps):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total_steps)


def test_a_per_batch_scheduler_stepped_per_epoch_is_refused():
    model, optimizer, scheduler = _one_cycle(100)
    with pytest.raises(ValueError, match=r"scheduler OneCycleLR steps once per train batch \(its cycle spans "
                                         r"total_steps=100 batches\), but scheduler_step='epoch' would step it once "
                                         r"per epoch; pass scheduler_step='batch'"):
        train(model=model, optimizer=optimizer, scheduler=scheduler)


def test_a_one_cycle_shorter_than_the_stage_is_refused_with_the_steps_it_needs():
    batches = len(regression_loaders()["train"])
    model, optimizer, scheduler = _one_cycle(2 * batches)
    with pytest.raises(ValueError, match=rf"scheduler OneCycleLR\(total_steps={2 * batches}\) is stepped once per "
                                         rf"train batch, and this stage trains 3 epoch\(s\) of {batches} train "
                                         rf"batch\(es\) = {3 * batches} steps; build it with total_steps={3 * batches} "
                                         rf"\(or epochs=3, steps_per_epoch={batches}\)"):
        train(model=model, optimizer=optimizer, scheduler=scheduler, scheduler_step="batch", num_epochs=3)
    model, optimizer, scheduler = _one_cycle(3 * batches)  # exactly long enough: trains to the end
    train(model=model, optimizer=optimizer, scheduler=scheduler, scheduler_step="batch", num_epochs=3, callbacks=[])


def test_a_model_without_parameters_is_refused_naming_it():
    other = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match=r"^model \(Sequential\) has no parameters, so optimizer \(SGD\), which holds "
                                         r"2 tensor\(s\) of something else, would train nothing; give train\(\) the "
                                         r"model whose parameters it holds"):
        SupervisedRunner().train(model=torch.nn.Sequential(torch.nn.Identity()), criterion=torch.nn.MSELoss(),
                                 optimizer=torch.optim.SGD(other.parameters(), lr=0.1), loaders=regression_loaders(),
                                 callbacks=[NoBatch()])


def _empty():
    return torch.utils.data.TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1))


def test_an_empty_dataset_in_datasets_is_refused_naming_it():
    full = torch.utils.data.TensorDataset(torch.rand(8, 4), torch.rand(8, 1))
    with pytest.raises(ValueError, match=r"^datasets\['train'\] is empty \(len 0\): it would yield no batch"):
        train(loaders=None, datasets={"batch_size": 4, "train": _empty(), "valid": full})


def test_an_empty_dataset_from_get_datasets_fn_is_refused_naming_it():
    def make_datasets():
        return {"train": _empty()}

    with pytest.raises(ValueError, match=r"^datasets\['train'\] \(made by make_datasets\(\)\) is empty \(len 0\)"):
        train(loaders=None, valid_loader="train", datasets={"batch_size": 4, "get_datasets_fn": make_datasets})
