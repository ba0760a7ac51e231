"""Dense peaks by GPU name and precision, FLOPs counted on a real step."""
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
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    assert device_peak_flops(torch.device("cuda", 0), dtype) == peak


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
