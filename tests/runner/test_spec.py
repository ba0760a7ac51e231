"""Every user error is raised before training, naming the argument, the value and what is expected."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import regression_data, regression_loaders
from tests.helpers import tiny_run
from torchstage import Callback, SupervisedRunner


class NeverRuns(Callback):
    def on_experiment_start(self, runner):
        raise AssertionError("training started")


def train(**overrides):
    model = torch.nn.Linear(4, 1)  # the optimizer's, also when a test replaces the model
    return tiny_run(**{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                       "callbacks": [NeverRuns()], **overrides})


@pytest.mark.parametrize("overrides, error, message", [
    ({"loaders": [1, 2]}, TypeError, r"loaders must be a non-empty mapping of name -> iterable"),
    ({"loaders": {}}, TypeError, r"loaders must be a non-empty mapping"),
    ({"loaders": {"train": TensorDataset(torch.zeros(2, 4)), "valid": [1]}}, TypeError,
     r"loaders\['train'\] is a TensorDataset, expected an iterable of batches such as a DataLoader; pass datasets"),
    ({"loaders": {"train": DataLoader(TensorDataset(torch.zeros(0, 4))), "valid": [1]}}, ValueError,
     r"loaders\['train'\] is empty \(len 0\)"),
    ({"valid_loader": "test"}, ValueError, r"valid_loader='test' is not among the loaders \['train', 'valid'\]"),
    ({"valid_metric": "accuracy"}, ValueError,
     r"valid_metric='accuracy' is produced by no callback; the chain produces \['loss', 'lr'\]"),
    ({"num_epochs": 0}, ValueError, r"num_epochs must be an integer >= 1, got 0"),
    ({"num_epochs": 2.5}, ValueError, r"num_epochs must be an integer >= 1, got 2.5"),
    ({"criterion": None}, ValueError, r"SupervisedRunner needs criterion=\.\.\.; got criterion=None"),
    ({"optimizer": None}, ValueError, r"SupervisedRunner needs optimizer=\.\.\.; got optimizer=None"),
    ({"stages": {"warmup": {"num_epochs": 1, "lr": 3}}}, ValueError,
     r"stages\['warmup'\] has unknown key\(s\) \['lr'\]; accepted: num_epochs, loaders"),
    ({"stages": {"warmup": {"num_epochs": -1}}}, ValueError,
     r"stages\['warmup'\]\['num_epochs'\] must be an integer >= 1, got -1"),
    ({"loaders": None, "datasets": {"batch_size": 8, "train": regression_data()[0], "valid": regression_data()[0],
                                    "shufle": True}}, ValueError,
     r"datasets\['shufle'\] = True is neither a loader option .* nor a Dataset"),
    ({"loaders": None, "datasets": {"batch_size": 0, "train": regression_data()[0]}}, ValueError,
     r"datasets\['batch_size'\] must be an integer >= 1, got 0"),
    ({"loaders": None, "datasets": {"batch_size": 4, "get_datasets_fn": lambda num_features: {}, "num_feat": 3}},
     ValueError, r"datasets has unknown key\(s\) \['num_feat'\]: not a loader option .* nor an argument of"),
    ({"callbacks": [object()]}, TypeError, r"callbacks\[0\] must be a torchstage Callback, got object"),
    ({"lr": 0.1}, TypeError, r"train\(\) got unknown argument\(s\) \['lr'\]; accepted: model, criterion"),
    ({"model": "resnet"}, TypeError, r"model must be a torch.nn.Module or a dict of them, got str"),
])
def test_errors_name_argument_value_and_expectation(overrides, error, message):
    with pytest.raises(error, match=message):
        train(**overrides)


def test_existing_run_is_never_overwritten_silently(tmp_path):
    model = torch.nn.Linear(4, 1)
    common = dict(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  loaders=regression_loaders(), num_epochs=1, logdir=str(tmp_path))
    SupervisedRunner().train(**common)
    before = (tmp_path / "checkpoints" / "last.pth").read_bytes()
    with pytest.raises(FileExistsError, match=r"already holds a run .*resume='last'.*overwrite=True"):
        SupervisedRunner().train(**common, callbacks=[NeverRuns()])
    assert (tmp_path / "checkpoints" / "last.pth").read_bytes() == before
    SupervisedRunner().train(**common, overwrite=True)


def test_train_signature_lists_every_argument():
    import inspect
    params = inspect.signature(SupervisedRunner.train).parameters
    for name in ("model", "criterion", "optimizer", "scheduler", "loaders", "datasets", "callbacks", "logdir",
                 "num_epochs", "valid_loader", "valid_metric", "minimize_valid_metric", "verbose", "seed", "stages"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_train_parameters_are_declared_once_and_shown_by_help_and_the_spec():
    """help(), IDEs and type checkers see every argument with its default (train_signature's, written out: what static
    tools read), then **more (Catalyst's names); TrainSpec has a field per argument, with the same default."""
    import dataclasses
    import inspect
    import pydoc
    import torchstage
    from torchstage.runner.runner import Runner
    from torchstage.runner.spec import TrainSpec
    from torchstage.runner.train_arguments import train_signature
    fields = [(f.name, f.default) for f in dataclasses.fields(TrainSpec) if f.init]
    for train in (Runner.train, torchstage.SupervisedRunner.train):
        params = list(inspect.signature(train).parameters.values())
        assert params[0].name == "self" and params[-1].kind is inspect.Parameter.VAR_KEYWORD  # Catalyst's names
        assert [(p.name, p.default) for p in params[1:-1]] == fields
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:-1])
        shown = pydoc.render_doc(train)
        assert all(f"{p.name}: " in shown for p in params[1:-1]) and "num_epochs: int = 1" in shown
    source = inspect.getsource(train_signature)
    assert all(f"{name}:" in source for name, _ in fields)


def test_factory_datasets_may_name_any_loaders_and_valid_loader_is_checked_once_built():
    def make(num_features):
        X, y = regression_data(n=32, features=num_features)
        return {"train_fit": TensorDataset(X, y), "holdout": TensorDataset(X, y)}

    runner = train(loaders=None, callbacks=None, valid_loader="holdout",
                   datasets={"batch_size": 8, "get_datasets_fn": make, "num_features": 4})
    assert list(runner.loaders) == ["train_fit", "holdout"]
    with pytest.raises(ValueError, match=r"valid_loader='valid' is not among the loaders \['train_fit', 'holdout'\]"):
        train(loaders=None, datasets={"batch_size": 8, "get_datasets_fn": make, "num_features": 4})


def test_loaders_of_which_none_trains_are_refused_before_training_naming_the_rule():
    """``{"fit": ..., "val": ...}`` would train nothing and exit 0: refused, for loaders and for built datasets."""
    X, y = regression_data(n=32, features=4)
    loader = DataLoader(TensorDataset(X, y), batch_size=8)
    rule = r"no loader trains: the loaders are \['fit', 'val'\], and a loader trains when its name starts with 'train'"
    with pytest.raises(ValueError, match=rule):
        train(loaders={"fit": loader, "val": loader}, valid_loader="val")
    with pytest.raises(ValueError, match=rule):
        train(loaders=None, valid_loader="val", datasets={
            "batch_size": 8, "num_features": 4,
            "get_datasets_fn": lambda num_features: {"fit": TensorDataset(X, y), "val": TensorDataset(X, y)}})


def test_stages_sharing_datasets_build_them_once():
    calls = []

    def make(num_features):
        calls.append(num_features)
        X, y = regression_data(n=32, features=num_features)
        return {"train": TensorDataset(X, y), "valid": TensorDataset(X, y)}

    runner = train(loaders=None, callbacks=None, datasets={"batch_size": 8, "get_datasets_fn": make, "num_features": 4},
                   stages={"first": {"num_epochs": 1}, "second": {"num_epochs": 1}})
    assert calls == [4]
    assert runner.stage_loaders[0] is runner.stage_loaders[1]


def test_a_requeued_slurm_job_resumes_from_last_and_says_so_once(monkeypatch, tmp_path, caplog):
    from torchstage.runner.spec import make_spec
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    model = torch.nn.Linear(4, 1)
    kwargs = dict(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                  loaders=regression_loaders(), logdir=str(tmp_path))
    with caplog.at_level("INFO", logger="torchstage"):
        spec = make_spec(SupervisedRunner(), kwargs)
    assert spec.resume == "last"
    assert sum("SLURM_RESTART_COUNT=1" in record.getMessage() for record in caplog.records) == 1
