"""The warning for DataLoader workers forked each epoch beside torch.distributed's threads on a CPython with
the fork deadlock of gh-112275 (its figures: docs/distributed.md)."""
import logging
import re
import subprocess
import sys

import pytest

import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import ROOT, run
from torchstage import Engine
from torchstage.data.fork_check import fork_deadlock_risk, forks_workers_each_epoch, warn_forked_workers

DATA = TensorDataset(torch.arange(8).float())
AFFECTED, FIXED = (3, 11, 7), (3, 11, 10)


def test_the_affected_cpython_releases():
    assert [fork_deadlock_risk(v) for v in [(3, 9, 19), (3, 9, 20), (3, 10, 14), (3, 10, 15), AFFECTED, FIXED,
                                            (3, 12, 0), (3, 13, 1)]] == [True, False, True, False, True, False,
                                                                         False, False]


def test_only_workers_forked_at_every_pass_are_at_risk():
    assert forks_workers_each_epoch(DataLoader(DATA, num_workers=1, multiprocessing_context="fork"))
    assert not forks_workers_each_epoch(DataLoader(DATA))  # no worker
    assert not forks_workers_each_epoch(DataLoader(DATA, num_workers=1, persistent_workers=True,
                                                   multiprocessing_context="fork"))
    assert not forks_workers_each_epoch(DataLoader(DATA, num_workers=1, multiprocessing_context="forkserver"))
    assert not forks_workers_each_epoch([1, 2])  # not a DataLoader


def test_the_main_rank_warns_naming_the_loaders_and_the_ways_out(caplog):
    loaders = {"train": DataLoader(DATA, num_workers=1, multiprocessing_context="fork"), "valid": DataLoader(DATA)}
    with caplog.at_level(logging.WARNING, logger="torchstage"):
        assert warn_forked_workers(loaders, Engine(device="cpu", rank=0, world_size=2), AFFECTED)
    assert "Python 3.11.7 can hang a DataLoader worker" in caplog.text and "['train']" in caplog.text
    assert "gh-112275" in caplog.text and "persistent_workers=True" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchstage"):
        assert warn_forked_workers(loaders, Engine(device="cpu", rank=1, world_size=2), AFFECTED)  # at risk, quiet
        assert not warn_forked_workers(loaders, Engine(device="cpu", rank=0, world_size=2), FIXED)
        assert not warn_forked_workers(loaders, Engine(device="cpu", rank=0, world_size=1), AFFECTED)  # no threads
    assert caplog.text == ""


def test_reading_the_default_start_method_leaves_it_unset():
    code = ("import multiprocessing, torch.utils.data as d\n"
            "from torchstage.data.fork_check import forks_workers_each_epoch\n"
            "forks_workers_each_epoch(d.DataLoader(list(range(4)), num_workers=1))\n"
            "print(multiprocessing.get_start_method(allow_none=True))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None"]  # a user may still call multiprocessing.set_start_method() after a run


def test_a_rebuilt_loader_keeps_its_workers_for_the_run_on_an_affected_cpython(monkeypatch, caplog):
    """torchstage rebuilds a user's DataLoader to shard it; on an affected CPython a loader that would fork its
    workers at every epoch (the tutorial's num_workers=1) keeps them for the run, said once on the main rank, and
    the same samples reach the rank; TORCHSTAGE_PERSISTENT_WORKERS=0 keeps the loader's own choice."""
    from torchstage.data import fork_check
    from torchstage.data.loaders import distribute_loader
    loader = DataLoader(DATA, batch_size=2, num_workers=1, multiprocessing_context="fork")
    engine = Engine(device="cpu", rank=0, world_size=2)
    monkeypatch.setattr(fork_check, "fork_deadlock_risk", lambda version=None: True)
    with caplog.at_level(logging.WARNING, logger="torchstage"):
        kept = distribute_loader(loader, engine, is_train=False)
    assert kept.persistent_workers and "keeps its workers for the run (persistent_workers=True)" in caplog.text
    assert [batch[0].tolist() for batch in kept] == [[0.0, 2.0], [4.0, 6.0]]  # rank 0's strided shard
    assert [batch[0].tolist() for batch in kept] == [[0.0, 2.0], [4.0, 6.0]]  # again, from the same workers
    monkeypatch.setenv("TORCHSTAGE_PERSISTENT_WORKERS", "0")
    assert not distribute_loader(loader, engine, is_train=False).persistent_workers
    monkeypatch.delenv("TORCHSTAGE_PERSISTENT_WORKERS")
    monkeypatch.setattr(fork_check, "fork_deadlock_risk", lambda version=None: False)
    assert not distribute_loader(loader, engine, is_train=False).persistent_workers


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_worker_stuck_in_its_fork_is_started_again_and_the_run_ends_as_an_unhindered_one(tmp_path):
    """Rank 1's first DataLoader worker never returns from fork() (as CPython gh-112275 leaves one): it is killed
    after TORCHSTAGE_WORKER_START_SECONDS and the pass's workers started again from the same random state, so
    the run ends with the weights of a run without the stuck fork, instead of waiting for a batch forever."""
    script = ROOT / "tests" / "data" / "scripts" / "stuck_worker_run.py"
    plain = run([script, tmp_path / "plain"], nproc=2, timeout=240)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    marker = tmp_path / "stuck"
    hindered = run([script, tmp_path / "hindered"], nproc=2, timeout=240, STUCK_MARKER=marker,
                   TORCHSTAGE_WORKER_START_SECONDS=3)
    out = hindered.stdout + hindered.stderr
    assert hindered.returncode == 0, out[-3000:]
    assert marker.exists()  # the fork was held
    assert re.search(r"DataLoader worker\(s\) \[0\] \(pid\(s\) \[\d+\]\) did not reach their first line within 3 s "
                     r"of their fork .*started again \(start 2 of at most 3\)", out), out[-3000:]
    weights = re.findall(r"weights \[.*\]", plain.stdout)
    assert len(weights) == 1 and weights == re.findall(r"weights \[.*\]", hindered.stdout), out[-3000:]
