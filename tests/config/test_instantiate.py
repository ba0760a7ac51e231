"""Components from ``_target_`` nodes: what gets built, and errors that name the YAML path."""
import pytest
import torch

from torchstage import ConfigError
from torchstage.config.instantiate import import_target, instantiate


def test_builds_nested_components_with_kwargs():
    loader = instantiate({"_target_": "torch.utils.data.DataLoader", "batch_size": 4,
                          "dataset": {"_target_": "torchstage.data.synthetic.synthetic_regression", "num_samples": 10}},
                         "loaders.train")
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert loader.batch_size == 4 and len(loader.dataset) == 10


def test_given_arguments_are_passed_and_plain_values_walked():
    model = torch.nn.Linear(2, 1)
    opt = instantiate({"_target_": "torch.optim.SGD", "lr": 0.5}, "optimizer", params=model.parameters())
    assert opt.param_groups[0]["lr"] == 0.5
    assert instantiate({"a": [1, {"b": None}]}, "x") == {"a": [1, {"b": None}]}


def test_nested_attribute_targets_import():
    assert import_target("torch.optim.lr_scheduler.MultiStepLR", "scheduler") is torch.optim.lr_scheduler.MultiStepLR


def test_missing_attribute_names_path_module_and_suggestion():
    with pytest.raises(ConfigError) as err:
        instantiate({"_target_": "torch.nn.Linar"}, "model")
    message = str(err.value)
    assert message.startswith("model._target_: ")
    assert "tried module 'torch.nn'" in message and "'torch.nn.Linear'" in message


def test_missing_module_names_modules_tried():
    with pytest.raises(ConfigError) as err:
        instantiate({"_target_": "no_such_pkg.models.Net"}, "stages.ft.model")
    message = str(err.value)
    assert message.startswith("stages.ft.model._target_: ")
    assert "no module named 'no_such_pkg'" in message and "'no_such_pkg.models'" in message


def test_wrong_argument_name_lists_accepted_ones():
    with pytest.raises(ConfigError) as err:
        instantiate({"_target_": "torch.nn.Linear", "in_feature": 3, "out_features": 1}, "model")
    message = str(err.value)
    assert message.startswith("model.in_feature: ")
    assert "did you mean 'in_features'" in message and "in_features, out_features, bias" in message


def test_wrong_scalar_type_against_annotation():
    with pytest.raises(ConfigError, match=r"^model\.in_features: torch\.nn\.Linear expects int .* got str 'ten'"):
        instantiate({"_target_": "torch.nn.Linear", "in_features": "ten", "out_features": 1}, "model")


def test_failing_constructor_is_reported_at_its_path():
    with pytest.raises(ConfigError, match=r"^optimizer: torch\.optim\.SGD\(\.\.\.\) failed: ValueError"):
        instantiate({"_target_": "torch.optim.SGD", "lr": -1.0}, "optimizer",
                    params=torch.nn.Linear(1, 1).parameters())


@pytest.mark.parametrize("target", ["", ".nn", "torch..nn", 3])
def test_malformed_target(target):
    with pytest.raises(ConfigError, match=r"^model\._target_: expected an import path"):
        instantiate({"_target_": target}, "model")


def test_non_callable_target():
    with pytest.raises(ConfigError, match="not a class or function"):
        instantiate({"_target_": "torchstage.__version__"}, "x")
