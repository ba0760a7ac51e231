"""The config API in-process: merging, --set, key/type checks with YAML paths, and what gets built."""
import dataclasses
from pathlib import Path

import pytest
import torch

import torchstage
from torchstage import ConfigError, load_config
from torchstage.config import schema
from torchstage.config.schema import check_config
from torchstage.config.train_call import build_train_call
from torchstage.config.yaml_files import apply_override, merge
from torchstage.runner.spec import TrainSpec

LINEAR = {"_target_": "torch.nn.Linear", "in_features": 10, "out_features": 1}
DATA = {"batch_size": 16, "train": {"_target_": "torchstage.data.synthetic.synthetic_regression", "num_samples": 64},
        "valid": {"_target_": "torchstage.data.synthetic.synthetic_regression", "num_samples": 32, "seed": 1}}


def base(**extra):
    return {"model": dict(LINEAR), "criterion": {"_target_": "torch.nn.MSELoss"},
            "optimizer": {"_target_": "torch.optim.Adam", "lr": 1e-3}, "datasets": DATA, **extra}


def error_of(config) -> str:
    with pytest.raises(ConfigError) as err:
        torchstage.train_from_config(config, dry_run=True)
    return str(err.value)


# ---- files, merge, --set -----------------------------------------------------------------------
def test_later_files_win_and_a_new_target_replaces_the_node(tmp_path):
    (tmp_path / "a.yml").write_text("num_epochs: 2\nmodel: {_target_: torch.nn.Linear, in_features: 3, out_features: 1}\n"
                                    "optimizer: {_target_: torch.optim.SGD, lr: 0.1, momentum: 0.9}\n")
    (tmp_path / "b.yml").write_text("num_epochs: 5\nmodel: {out_features: 2}\n"
                                    "optimizer: {_target_: torch.optim.Adam, lr: 1e-3}\n")
    config = load_config([tmp_path / "a.yml", tmp_path / "b.yml"], ["model.bias=false", "seed=7"])
    assert config["num_epochs"] == 5 and config["seed"] == 7
    assert config["model"] == {"_target_": "torch.nn.Linear", "in_features": 3, "out_features": 2, "bias": False}
    assert config["optimizer"] == {"_target_": "torch.optim.Adam", "lr": 0.001}  # no SGD momentum left over


def test_merge_replaces_lists_and_does_not_alias():
    first = {"scheduler": {"milestones": [3, 6]}}
    merged = merge(first, {"scheduler": {"milestones": [1]}})
    assert merged == {"scheduler": {"milestones": [1]}} and first["scheduler"]["milestones"] == [3, 6]


@pytest.mark.parametrize("text, expected", [
    ("optimizer.lr=1e-4", 1e-4), ("optimizer.lr=0.5", 0.5), ("optimizer.lr=3", 3), ("optimizer.lr=null", None),
    ("optimizer.lr=[3, 6]", [3, 6]), ("optimizer.lr=fast", "fast"), ("optimizer.lr='3'", "3"),
])
def test_set_values_are_yaml_scalars(text, expected):
    config = {"optimizer": {"lr": 1}}
    apply_override(config, text)
    assert config["optimizer"]["lr"] == expected and type(config["optimizer"]["lr"]) is type(expected)


def test_set_creates_keys_and_indexes_lists():
    config = {"callbacks": [{"_target_": "x", "patience": 1}]}
    apply_override(config, "stages.ft.num_epochs=2")
    apply_override(config, "callbacks.0.patience=4")
    assert config["stages"] == {"ft": {"num_epochs": 2}} and config["callbacks"][0]["patience"] == 4


@pytest.mark.parametrize("text, message", [
    ("num_epochs", "expected KEY.PATH=VALUE"), ("=3", "expected KEY.PATH=VALUE"),
    ("a..b=3", "expected KEY.PATH=VALUE"), ("num_epochs=[1,", "invalid YAML"),
    ("num_epochs.x=1", "num_epochs is int 8, not a mapping: cannot set num_epochs.x"),
    ("callbacks.5=1", "'5' is not an index of the list at callbacks (length 0)"),
])
def test_malformed_set_is_an_error_naming_it(text, message):
    with pytest.raises(ConfigError) as err:
        apply_override({"num_epochs": 8, "callbacks": []}, text)
    assert str(err.value).startswith(f"--set {text!r}: ") and message in str(err.value)


def test_yaml_files_errors_name_the_file(tmp_path):
    (tmp_path / "bad.yml").write_text("model: [1,\n")
    (tmp_path / "list.yml").write_text("- 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yml: invalid YAML"):
        load_config([tmp_path / "bad.yml"])
    with pytest.raises(ConfigError, match=r"list\.yml: a config file must hold a mapping"):
        load_config([tmp_path / "list.yml"])
    with pytest.raises(ConfigError, match=r"missing\.yml: cannot read config file"):
        load_config([tmp_path / "missing.yml"])


# ---- keys and types ------------------------------------------------------------------------------
@pytest.mark.parametrize("config, path, message", [
    ({"modle": LINEAR}, "modle", "unknown top-level key 'modle' (did you mean 'model'?)"),
    ({"stages": {"ft": {"optimzer": {}}}}, "stages.ft.optimzer", "unknown stage key 'optimzer' (did you mean 'optimizer'?)"),
    ({"stages": {"ft": {"logdir": "x"}}}, "stages.ft.logdir", "unknown stage key 'logdir'"),
    ({"num_epochs": "3"}, "num_epochs", "expected int, got str '3'"),
    ({"num_epochs": 2.5}, "num_epochs", "expected int, got float 2.5"),
    ({"verbose": 1}, "verbose", "expected bool, got int 1"),
    ({"seed": True}, "seed", "expected int, got bool True"),
    ({"logdir": 3}, "logdir", "expected str or null, got int 3"),
    ({"stages": {"ft": {"minimize_valid_metric": "yes"}}}, "stages.ft.minimize_valid_metric", "expected bool"),
    ({"stages": [1]}, "stages", "expected a mapping of stage name -> settings"),
    ({"stages": {"ft": 3}}, "stages.ft", "expected a mapping of stage settings"),
])
def test_key_and_type_errors_name_the_yaml_path(config, path, message):
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_accepted_keys_follow_trainspec_fields(monkeypatch):
    @dataclasses.dataclass
    class Extended(TrainSpec):
        amp: bool = False
    monkeypatch.setattr(schema, "TrainSpec", Extended)
    check_config({"amp": True, "runner": {}})
    with pytest.raises(ConfigError, match=r"^amp: expected bool, got str 'yes'"):
        check_config({"amp": "yes"})
    assert set(schema.train_keys()) == {f.name for f in dataclasses.fields(Extended) if f.init} | {"runner"}


@pytest.mark.parametrize("change, path, message", [
    ({"model": {"target": "torch.nn.Linear"}}, "model.target", "the import path key is spelled '_target_'"),
    ({"model": {"_target_": "torch.optim.Adam", "params": [torch.zeros(1)]}}, "model._target_", "not a torch.nn.Module"),
    ({"optimizer": {"_target_": "torch.nn.Linear", "in_features": 1, "out_features": 1}}, "optimizer",
     "has no argument 'params'"),
    ({"optimizer": {"_target_": "torch.optim.Adam", "params": "model"}}, "optimizer.params", "leave params out"),
    ({"scheduler": {"_target_": "torch.optim.lr_scheduler.StepLR", "step": 2}}, "scheduler.step",
     "did you mean 'step_size'"),
    ({"datasets": {"batch_size": 4, "bach": 2, "train": DATA["train"]}}, "datasets.bach", "neither a loader option"),
    ({"datasets": {"batch_size": 4, "train": {"_target_": "torch.nn.Identity"}}}, "datasets.train",
     "made a Identity, not a Dataset"),
    ({"callbacks": [{"_target_": "torch.nn.Identity"}]}, "callbacks.0._target_", "not a torchstage Callback"),
    ({"callbacks": {"csv": {"_target_": "torchstage.CSVLogger", "log_dir": "x"}}}, "callbacks.csv.log_dir",
     "accepts: logdir"),
    ({"runner": {"input_keys": "x"}}, "runner.input_keys", "did you mean 'input_key'"),
    ({"runner": {"_target_": "torch.nn.Identity"}}, "runner._target_", "not a torchstage Runner"),
    ({"stages": {"ft": {"criterion": {"_target_": "torch.nn.MSELos"}}}}, "stages.ft.criterion._target_",
     "did you mean 'torch.nn.MSELoss'"),
])
def test_component_errors_name_the_yaml_path(change, path, message):
    text = error_of(base(**change))
    assert text.startswith(f"{path}: ") and message in text


def test_train_argument_errors_become_config_errors_with_dotted_paths():
    text = error_of(base(valid_loader="test"))
    assert text.startswith("valid_loader='test' is not among the loaders ['train', 'valid']")
    text = error_of(base(stages={"ft": {"num_epochs": 1, "datasets": {**DATA, "batch_size": 0}}}))
    assert text == "stages.ft: datasets.batch_size must be an integer >= 1, got 0"


# ---- what gets built ----------------------------------------------------------------------------
def test_seeded_before_building_so_init_matches_a_seeded_script():
    runner, kwargs = build_train_call(base(seed=3))
    torchstage.set_seed(3)
    expected = torch.nn.Linear(10, 1)
    assert torch.equal(kwargs["model"].weight, expected.weight) and torch.equal(kwargs["model"].bias, expected.bias)
    assert isinstance(runner, torchstage.SupervisedRunner)


def test_optimizer_gets_model_parameters_and_scheduler_the_optimizer():
    _, kwargs = build_train_call(base(scheduler={"_target_": "torch.optim.lr_scheduler.MultiStepLR",
                                                 "milestones": [3, 6]}))
    params = kwargs["optimizer"].param_groups[0]["params"]
    assert params[0] is kwargs["model"].weight and params[1] is kwargs["model"].bias
    assert kwargs["scheduler"].optimizer is kwargs["optimizer"] and kwargs["scheduler"].milestones == {3: 1, 6: 1}


def test_stages_inherit_objects_and_a_new_optimizer_gets_its_own_scheduler():
    config = base(scheduler={"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 2}, stages={
        "warmup": {"num_epochs": 1},
        "ft": {"num_epochs": 2, "optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}},
        "last": {"num_epochs": 1, "optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}, "scheduler": None}})
    runner, kwargs = build_train_call(config)
    stages = kwargs["stages"]
    assert "optimizer" not in stages["warmup"]  # inherits the top-level optimizer object via train()
    ft = stages["ft"]
    assert isinstance(ft["optimizer"], torch.optim.SGD)
    assert ft["optimizer"].param_groups[0]["params"][0] is kwargs["model"].weight
    assert isinstance(ft["scheduler"], torch.optim.lr_scheduler.StepLR) and ft["scheduler"].optimizer is ft["optimizer"]
    assert stages["last"]["scheduler"] is None
    spec = torchstage.runner.spec.make_spec(runner, kwargs)
    assert [s.optimizer for s in spec.stage_specs][0] is kwargs["optimizer"]


def test_dict_of_models_needs_params_names():
    models = {"enc": dict(LINEAR), "head": {"_target_": "torch.nn.Linear", "in_features": 1, "out_features": 1}}
    config = {"model": models, "optimizer": {"_target_": "torch.optim.Adam"}}
    with pytest.raises(ConfigError, match=r"^optimizer\.params: the model is a dict \(enc, head\)"):
        build_train_call(config)
    config["optimizer"] = {"enc": {"_target_": "torch.optim.Adam", "params": "enc"},
                           "both": {"_target_": "torch.optim.SGD", "params": ["enc", "head"], "lr": 0.1}}
    config["scheduler"] = {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 1}
    with pytest.raises(ConfigError, match=r"^scheduler\.optimizer: the optimizer is a dict \(enc, both\)"):
        build_train_call(config)
    config["scheduler"]["optimizer"] = "both"
    _, kwargs = build_train_call(config)
    assert len(kwargs["optimizer"]["both"].param_groups[0]["params"]) == 4
    assert kwargs["scheduler"].optimizer is kwargs["optimizer"]["both"]


def test_datasets_target_becomes_a_factory_called_in_the_worker():
    config = base(datasets={"_target_": "torchstage.data.synthetic.synthetic_regression_splits", "batch_size": 8,
                            "num_train": 40, "num_valid": 16})
    runner = torchstage.train_from_config(config, dry_run=True)
    assert runner.spec.datasets["get_datasets_fn"] is torchstage.data.synthetic.synthetic_regression_splits
    assert {k: len(v) for k, v in runner.loaders.items()} == {"train": 5, "valid": 2}
    text = error_of(base(datasets={"_target_": "torchstage.data.synthetic.synthetic_regression_splits", "batch_size": 8,
                                   "num_samples": 3}))
    assert text.startswith("datasets.num_samples: ") and "num_train, num_valid, num_features, seed" in text


def test_callbacks_as_list_or_mapping_and_null_removes_a_default():
    runner = torchstage.train_from_config(base(callbacks={"console": None, "csv2": {"_target_": "torchstage.CSVLogger"}}),
                                   dry_run=True)
    assert "console" not in runner.callbacks and isinstance(runner.callbacks["csv2"], torchstage.CSVLogger)
    runner = torchstage.train_from_config(base(callbacks=[{"_target_": "torchstage.CSVLogger", "logdir": "x"}]), dry_run=True)
    assert runner.callbacks["csv"].logdir == "x"


@pytest.mark.parametrize("files", [["regression.yml"], ["regression.yml", "two_stages.yml"],
                                   ["regression.yml", "distributed.yml"]])
def test_shipped_example_configs_build(files):
    folder = Path(torchstage.__file__).resolve().parent.parent / "scripts" / "configs"
    config = load_config([folder / name for name in files])
    runner = torchstage.train_from_config(config, dry_run=True)
    assert runner.spec.stage_specs[-1].optimizer is not None and runner.loaders["train"] is not None


# ---- numbers written as strings -----------------------------------------------------------------
def test_quoted_numbers_become_numbers_where_the_target_expects_one(tmp_path):
    (tmp_path / "c.yml").write_text('optimizer: {_target_: torch.optim.Adam, lr: "1e-3", weight_decay: "0"}\n'
                                    'model: {_target_: torch.nn.Linear, in_features: "10", out_features: 1}\n')
    config = merge(base(), load_config(tmp_path / "c.yml"))
    runner, kwargs = build_train_call(config)
    assert kwargs["optimizer"].defaults["lr"] == 1e-3 and kwargs["optimizer"].defaults["weight_decay"] == 0.0
    assert kwargs["model"].in_features == 10 and isinstance(kwargs["model"].in_features, int)


def test_a_word_where_a_number_is_expected_names_the_yaml_path():
    message = error_of(base(optimizer={"_target_": "torch.optim.Adam", "lr": "fast"}))
    assert message == "optimizer.lr: torch.optim.Adam expects float for 'lr', got str 'fast'"
    assert error_of(base(num_epochs="3")) == "num_epochs: expected int, got str '3'"


def test_catalyst_argument_names_mean_in_a_config_what_they_mean_in_train():
    """A config goes through train()'s translation: ``fp16: true`` is ``fp16=True`` (amp 'fp16-or-full': full
    precision on CPU, as Catalyst)."""
    runner = torchstage.train_from_config(base(fp16=True, main_metric="loss", initial_seed=3), dry_run=True)
    assert runner.amp_dtype is None
    assert (runner.spec.amp, runner.spec.valid_metric, runner.spec.seed) == ("fp16-or-full", "loss", 3)
    assert "train(stage_kwargs=...) is Catalyst 20.12's" in error_of(base(stage_kwargs={}))
