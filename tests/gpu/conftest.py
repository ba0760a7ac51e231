"""The GPU suite: every test here needs a CUDA device; without one they skip with the reason.

``scripts/gpu_check.sh`` runs them (``pytest -m gpu``) with the GPU benchmarks and writes a report.
"""
import pytest
import torch

NO_CUDA = "needs a CUDA GPU (torch.cuda.is_available() is False on this machine)"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason=NO_CUDA))
