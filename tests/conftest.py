"""Shared test fixtures: small deterministic data, quiet logs, one thread per process."""
import logging
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

# The suite runs many small models and multi-process runs on 2 cores: one intra-op thread per
# process (children inherit it) avoids oversubscription that makes tiny steps 10x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


def regression_data(n=64, features=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, features, generator=g)
    y = X @ torch.arange(1.0, features + 1) / features + 0.1 * torch.rand(n, generator=g)
    return X, y.view(-1, 1)


def regression_loaders(n=64, batch_size=16, seed=0):
    X, y = regression_data(n, seed=seed)
    loader = DataLoader(TensorDataset(X, y), batch_size=batch_size)
    return {"train": loader, "valid": loader}


@pytest.fixture(autouse=True)
def _quiet_torchstage_logs():
    log = logging.getLogger("torchstage")
    level = log.level
    log.setLevel(logging.WARNING)
    yield
    log.setLevel(level)


@pytest.fixture(autouse=True)
def _fresh_once_per_process_notes(monkeypatch):
    """Each test starts with no Catalyst spelling noted yet: the notes are said once per process, and a test that
    expects one must not depend on whether an earlier test in the same worker already said it."""
    from torchstage import logging_setup
    monkeypatch.setattr(logging_setup, "_noted", set())


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; run by scripts/gpu_check.sh, skipped without CUDA")
    config.addinivalue_line("markers", "distributed: starts several processes (gloo worlds, torchrun, the launcher)")
    config.addinivalue_line("markers", "slurm: a SLURM test (tests/launch/slurm, or any test on the local cluster)")
    config.addinivalue_line("markers", "mpi: runs a real mpirun or mpiexec")
    config.addinivalue_line("markers", "alone: times what its processes do, or needs every core: scripts/test.sh runs "
                                       "these one at a time after the others, with nothing beside them")
    config.addinivalue_line("markers", "waits: waits out timeouts of seconds (a hang, a start-up, a keep-alive): "
                                       "scripts/test.sh runs these two at a time, never beside the CPU-bound others")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Every test under tests/launch/slurm, and any test that uses the cluster fixture, is a SLURM test. Under
    pytest-xdist with ``--dist loadgroup`` (scripts/test.sh) the SLURM tests run one at a time on one worker (the
    local cluster has two nodes), and each other file's tests run on one worker, so that a module-scoped reference
    run is made once, not once per worker."""
    for item in items:
        if "tests/launch/slurm/" in item.nodeid.replace("\\", "/") or "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
