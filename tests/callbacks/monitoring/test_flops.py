"""Dense peaks by GPU name and precision, FLOPs counted on a real step."""
from types import SimpleNamespace

import pytest
import torch

from torchstage.callbacks.monitoring.flops import StepFlops, device_peak_flops


@pytest.mark.parametrize("name, dtype, tf32, peak", [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, False, 989e12),
    ("NVIDIA H100 PCIe", torch.float16, False, 756e12),
    ("NVIDIA A100-SXM4-40GB", None, True, 156e12),
    ("NVIDIA A100-SXM4-40GB", None, False, 19.5e12),
    ("NVIDIA GeForce GTX 1080", torch.bfloat16, False, None),
])
def test_peak_by_device_name_and_precision(monkeypatch, name, dtype, tf32, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    # The flag's holder, not the process's cuBLAS flag: that one is a C++ global whose Python accessors depend on
    # which API (allow_tf32 or fp32_precision) set it before, so restoring it could fail after other tests.
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(fp32_precision="tf32" if tf32 else "ieee"))
    assert device_peak_flops(torch.device("cuda", 0), dtype) == peak


@pytest.mark.parametrize("matmul, backends, tf32", [
    (SimpleNamespace(allow_tf32=True), None, True),  # a torch before fp32_precision
    (SimpleNamespace(allow_tf32=False), None, False),
    (SimpleNamespace(fp32_precision="none"), "tf32", True),  # the matmuls follow the global setting
    (SimpleNamespace(fp32_precision="none"), "ieee", False),
])
def test_tf32_is_read_from_the_api_that_set_it(monkeypatch, matmul, backends, tf32):
    """torch >= 2.9's allow_tf32 raises once fp32_precision set the precision: the peak reads what this torch has."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    holder = SimpleNamespace(cuda=SimpleNamespace(matmul=matmul))  # torch.backends, without its C++ globals
    if backends is not None:
        holder.fp32_precision = backends
    monkeypatch.setattr(torch, "backends", holder)
    assert device_peak_flops(torch.device("cuda", 0)) == (156e12 if tf32 else 19.5e12)


def test_cpu_peak_is_unknown():
    assert device_peak_flops(torch.device("cpu"), torch.bfloat16) is None


def test_counts_forward_and_backward_of_a_step():
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    x = torch.randn(5, 10)
    counter = StepFlops()
    counter.start()
    model(x).sum().backward()
    # forward 2*5*(10*20 + 20*3); backward: weight grads of both layers, input grad of the second
    assert counter.stop() == 2 * 5 * (10 * 20 + 20 * 3) + 2 * 5 * (10 * 20 + 20 * 3) + 2 * 5 * 20 * 3
