"""Catalyst 22's ``utils.trace_model``, ``quantize_model``, ``prune_model`` and ``onnx_export`` (the README's
post-processing steps) on torchstage: real torch.jit / torch.ao.quantization / torch.nn.utils.prune / torch.onnx."""
import logging
import sys

import numpy as np
import pytest
import torch
from torch import nn

import torchstage as utils


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(8, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

    def features(self, x):
        return self.body(x)


def model_and_batch():
    torch.manual_seed(0)
    return TwoHeads(), torch.rand(5, 8)


def test_trace_model_traces_forward_or_another_method_of_the_plain_module(caplog):
    model, batch = model_and_batch()
    with caplog.at_level(logging.INFO, logger="torchstage"):
        traced = utils.trace_model(model=model, batch=batch)
    assert isinstance(traced, torch.jit.ScriptModule)
    other = torch.rand(7, 8)
    assert torch.equal(traced(other), model(other))
    wrapped = nn.DataParallel(model)  # a wrapper with .module, as DDP: the plain module is traced
    assert torch.equal(utils.trace_model(wrapped, batch, method_name="features")(other), model.features(other))
    with pytest.raises(ValueError, match=r"method_name='predict': TwoHeads has no such method"):
        utils.trace_model(model, batch, method_name="predict")


def test_quantize_model_quantizes_linear_weights_to_int8():
    model, batch = model_and_batch()
    quantized = utils.quantize_model(model=model)
    assert isinstance(quantized.body, torch.ao.nn.quantized.dynamic.Linear)
    assert quantized.body.weight().dtype == torch.qint8
    assert type(model.body) is nn.Linear  # a quantized copy; the model itself is unchanged
    assert (quantized(batch) - model(batch)).abs().max() < 0.05
    with pytest.raises(ValueError, match=r"quantize_model\(dtype='int4'\): expected 'qint8' or 'quint8'"):
        utils.quantize_model(model, dtype="int4")


def test_prune_model_zeroes_the_given_share_of_each_layer():
    model, _ = model_and_batch()
    utils.prune_model(model=model, pruning_fn="l1_unstructured", amount=0.8)
    for layer in (model.body, model.head):
        assert (layer.weight == 0).float().mean().item() == pytest.approx(0.8, abs=0.03)
        assert hasattr(layer, "weight_mask")
    model, _ = model_and_batch()
    utils.prune_model(model, "ln_structured", amount=2, layers_to_prune=["body"], dim=0, l_norm=2)
    assert int((model.body.weight.abs().sum(1) == 0).sum()) == 2 and not hasattr(model.head, "weight_mask")
    with pytest.raises(ValueError, match=r"pruning_fn='ln_structured'\) needs dim=... and l_norm=..."):
        utils.prune_model(model, "ln_structured", amount=1)
    with pytest.raises(ValueError, match=r"layers_to_prune \['tail'\] are not modules of the model"):
        utils.prune_model(model, "l1_unstructured", amount=0.5, layers_to_prune=["tail"])
    with pytest.raises(ValueError, match=r"no module of the model has \['kernel'\]"):
        utils.prune_model(model, "l1_unstructured", amount=0.5, keys_to_prune=["kernel"])


def test_onnx_export_writes_a_model_that_computes_the_same(tmp_path):
    onnx = pytest.importorskip("onnx")  # the onnx extra, installed by .ci/run
    from onnx.reference import ReferenceEvaluator
    model, batch = model_and_batch()
    path = tmp_path / "model.onnx"
    loaded = utils.onnx_export(model=model, batch=batch, file=str(path), return_model=True, input_names=["x"])
    assert isinstance(loaded, onnx.ModelProto) and loaded.opset_import[0].version == 9  # Catalyst's default opset
    onnx.checker.check_model(loaded)
    out = ReferenceEvaluator(str(path)).run(None, {"x": batch.numpy()})[0]
    np.testing.assert_allclose(out, model(batch).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert utils.onnx_export(model, batch, str(tmp_path / "features.onnx"), method_name="features") is None
    assert (tmp_path / "features.onnx").stat().st_size > 0


def test_onnx_export_without_onnx_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if the package were not installed
    model, batch = model_and_batch()
    with pytest.raises(ImportError, match=r"needs the onnx package.*pip install 'torchstage\[onnx\]'"):
        utils.onnx_export(model, batch, str(tmp_path / "model.onnx"))
    assert not (tmp_path / "model.onnx").exists()
