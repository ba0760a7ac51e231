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
    config.pluginmanager.register(HeavyGroupsFirst(), "torchstage-heavy-groups-first")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; run by scripts/gpu_check.sh, skipped without CUDA")
    config.addinivalue_line("markers", "distributed: starts several processes (gloo worlds, torchrun, the launcher)")
    config.addinivalue_line("markers", "slurm: a SLURM test (tests/launch/slurm, or any test on the local cluster)")
    config.addinivalue_line("markers", "mpi: runs a real mpirun or mpiexec")
    config.addinivalue_line("markers", "alone: times what its processes do, or needs every core: scripts/test.sh runs "
                                       "these one at a time after the others, with nothing beside them")
    config.addinivalue_line("markers", "waits: waits out timeouts of seconds (a hang, a start-up, a keep-alive): "
                                       "scripts/test.sh runs these three at a time, never beside the CPU-bound others")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Every test under tests/launch/slurm, and any test that uses the cluster fixture, is a SLURM test. Under
    pytest-xdist with ``--dist loadgroup`` (scripts/test.sh) the SLURM tests run one at a time on one worker (the
    local cluster has two nodes), and each other file's tests run on one worker, so that a module-scoped reference
    run is made once, not once per worker. A test marked ``waits`` (mostly idle, none sharing a module's reference
    run with another) is a group of its own: the waits part spreads them over its workers one by one."""
    for item in items:
        if "tests/launch/slurm/" in item.nodeid.replace("\\", "/") or "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.get_closest_marker("xdist_group") is None:
            waits = item.get_closest_marker("waits") is not None  # a group of its own
            item.add_marker(pytest.mark.xdist_group(item.nodeid if waits else item.nodeid.split("::")[0]))


class HeavyGroupsFirst:
    """After pytest-randomly's shuffle, the xdist groups that start the most processes (tests marked
    ``distributed``, ``slurm`` or ``mpi``) come first, each group's tests and the order of equal groups kept: a
    worker that takes a long group last would otherwise leave the other cores idle for minutes at the end (the
    SLURM group alone is about a fifth of the parallel part)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        weight = {}
        for item in items:
            group = _group(item)
            heavy = any(item.get_closest_marker(name) for name in ("distributed", "slurm", "mpi"))
            weight[group] = weight.get(group, 0) + heavy
        items.sort(key=lambda item: -weight[_group(item)])  # stable: the shuffled order within a weight stays


def _group(item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker and marker.args else item.nodeid.split("::")[0]
