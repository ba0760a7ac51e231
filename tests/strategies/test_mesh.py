"""HSDP and tensor parallel + FSDP on 4 gloo processes: DDP's weights, data split by the data-parallel coordinate,
samples counted once, and resume after kill -9 bitwise on the same mesh and sample-exact across mesh shapes."""
import json
import os
import shutil
import sys
from collections import Counter

import pytest
import torch

from tests import script_server
from tests.helpers import script_env
from tests.resume_helpers import EXACT_KEYS, ROOT, differences
from torchstage.files.checkpoint_read import load_checkpoint

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

SCRIPT = os.path.join(ROOT, "tests", "strategies", "scripts", "mesh_run.py")
SAMPLES = 96  # 6 train batches of 4 per rank and epoch on 4 data-parallel ranks, 12 on 2


def launch(logdir, resume=None, timeout=400, **env):
    args = [sys.executable, SCRIPT, str(logdir)] + ([str(resume)] if resume else [])
    proc = script_server.run(args, env=script_env(**env), cwd=ROOT, timeout=timeout, merge=True)
    return {"code": proc.returncode, "out": proc.stdout, "logdir": str(logdir)}


def reports(run) -> dict:
    found = {}
    for name in sorted(os.listdir(run["logdir"])):
        if name.startswith("report-rank"):
            with open(os.path.join(run["logdir"], name)) as f:
                found[int(name[len("report-rank"):-len(".json")])] = json.load(f)
    return found


def seen(logdir) -> dict:
    """rank -> the train batches it recorded, in order: {step, epoch, indices}."""
    found = {}
    for name in os.listdir(logdir):
        if name.startswith("seen-rank"):
            with open(os.path.join(logdir, name)) as f:
                found[int(name[len("seen-rank"):-len(".jsonl")])] = [json.loads(line) for line in f]
    return found


def final(run):
    return load_checkpoint(os.path.join(run["logdir"], "checkpoints", "last.pth"))


RUNS = {  # every run: 2 epochs of AdamW and StepLR, gradients clipped to norm 0.5, the same data and seed
    "ddp4": {"STRATEGY": "ddp", "PERIOD": 2, "CLIP": 0.5},
    "hsdp": {"STRATEGY": "hsdp", "PERIOD": 2, "CLIP": 0.5},  # FSDP(replicate=2, shard=2)
    "tp-dp": {"STRATEGY": "tp-dp", "PERIOD": 2, "CLIP": 0.5},  # ModelParallel(tensor=2, data_shard=2)
    "ddp2": {"STRATEGY": "ddp", "NPROC": 2, "PERIOD": 2, "CLIP": 0.5},  # tp-dp's data-parallel ranks, each batch 4
    # ModelParallel(tensor=2) alone on 2 processes (one data-parallel rank, batch 8) and DDP on 2 (batch 4 each): the
    # same global batches when the order is not shuffled (DistributedSampler deals i, i + 2...; one loader reads 8)
    "tp": {"STRATEGY": "tp", "NPROC": 2, "BATCH": 8, "SHUFFLE": 0, "CLIP": 0.5},
    "ddp2-ordered": {"STRATEGY": "ddp", "NPROC": 2, "SHUFFLE": 0, "CLIP": 0.5},
}


class Runs(dict):
    """The reference runs, each started the first time a test asks for it: ``launch(logdir, **runs[name])``
    (this file's, or another script's launcher and runs)."""

    def __init__(self, base, launcher=None, runs=None):
        super().__init__()
        self.base, self.launcher, self.runs = base, launcher, runs

    def __missing__(self, name):
        run = (self.launcher or launch)(self.base / name, **(self.runs or RUNS)[name])
        assert run["code"] == 0, run["out"][-3000:]
        self[name] = run
        return run


@pytest.fixture(scope="session")
def mesh_runs(tmp_path_factory):
    """The reference runs, shared with test_mesh_features.py."""
    return Runs(tmp_path_factory.mktemp("mesh"))


@pytest.fixture
def runs(mesh_runs):
    return mesh_runs


def assert_close_models(a, b, atol=1e-5):
    for key, tensor in b["models"]["model"].items():
        torch.testing.assert_close(a["models"]["model"][key], tensor, atol=atol, rtol=0, msg=key)


@pytest.mark.parametrize("mesh, reference", [("hsdp", "ddp4"), ("tp", "ddp2-ordered"), ("tp-dp", "ddp2")])
def test_a_mesh_trains_as_ddp_with_the_same_global_batch(runs, mesh, reference):
    a, b = final(runs[mesh]), final(runs[reference])
    assert_close_models(a, b)
    assert a["metrics"]["valid"]["loss"] == pytest.approx(b["metrics"]["valid"]["loss"], abs=1e-6)
    layout = {"hsdp": {"replicate": 2, "shard": 2, "tensor": 1}, "tp": {"replicate": 1, "shard": 1, "tensor": 2},
              "tp-dp": {"replicate": 1, "shard": 2, "tensor": 2}}[mesh]
    assert a["meta"]["mesh"] == layout and a["meta"]["sharded"] is True
    assert a["meta"]["data_parallel"] == layout["replicate"] * layout["shard"]
    assert a["meta"]["tensor_parallel"] == layout["tensor"]
    every = reports(runs[mesh])
    assert len(every) == a["meta"]["world_size"] and {r["param_type"] for r in every.values()} == {"DTensor"}
    # every rank holds the same numbers, each sample counted once (16 valid samples, 96 train)
    for report in every.values():
        assert report["history"][-1]["metrics"] == every[0]["history"][-1]["metrics"]
        assert report["history"][-1]["metrics"]["valid"]["samples"] == 16
        assert report["history"][-1]["metrics"]["train"]["samples"] == SAMPLES
    announced = {"hsdp": "world: 4 processes on 1 node (torchstage's launcher, gloo backend), strategy FSDP, mesh "
                         "replicate 2 x shard 2",
                 "tp": "strategy ModelParallel, mesh shard 1 x tensor 2, data-parallel 1 x tensor-parallel 2",
                 "tp-dp": "strategy ModelParallel, mesh shard 2 x tensor 2, data-parallel 2 x tensor-parallel 2"}
    assert announced[mesh] in runs[mesh]["out"]


def test_the_ranks_of_a_tensor_parallel_group_train_the_same_batches(runs):
    batches = seen(runs["tp-dp"]["logdir"])
    every = reports(runs["tp-dp"])
    assert [(every[r]["dp_rank"], every[r]["tp_rank"]) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    steps = {rank: [(b["step"], b["indices"]) for b in batches[rank]] for rank in range(4)}
    assert steps[0] == steps[1] and steps[2] == steps[3]  # same steps, same samples in each
    assert [{b["counts"] for b in batches[rank]} for rank in range(4)] == [{True}, {False}, {True}, {False}]
    for epoch in (1, 2):
        first, second = ([i for b in batches[r] if b["epoch"] == epoch for i in b["indices"]] for r in (0, 2))
        assert not set(first) & set(second)  # the data-parallel ranks split the epoch...
        assert sorted(first + second) == list(range(SAMPLES))  # ...and together see every sample once


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """mesh -> a logdir of its run killed (SIGKILL of one rank) at global batch 9, mid-epoch (the 3rd batch of epoch 2
    under 4 data-parallel ranks, the 9th of epoch 1 under 2), after a checkpoint at batch 8; each test resumes a
    copy."""
    base, made = tmp_path_factory.mktemp("killed"), {}

    def get(mesh):
        if mesh not in made:
            run = launch(base / mesh, KILL_AT_BATCH=9, KILL_RANK=1, **RUNS[mesh])
            assert run["code"] != 0
            last = load_checkpoint(os.path.join(run["logdir"], "checkpoints", "last.pth"))
            assert not last["loop"]["epoch_done"] and last["loop"]["global_batch_step"] == 8
            made[mesh] = run["logdir"]
        return made[mesh]
    return get


def copy_of(source, target):
    shutil.copytree(source, target, symlinks=True)
    return target


def each_once(logdir, cut: dict) -> bool:
    """True when in each of the 2 epochs the attempts recorded in ``logdir`` trained every sample once (see
    :func:`trained`)."""
    return all(trained(logdir, epoch, cut) == Counter(range(SAMPLES)) for epoch in (1, 2))


def trained(logdir, epoch: int, cut: dict) -> Counter:
    """How often each sample of ``epoch`` was trained over the attempts recorded in ``logdir`` (by the first rank of
    each tensor-parallel group): of attempt ``a`` the batches up to global step ``cut[a]`` (its successor resumed
    from a checkpoint there), of the last attempt all of them."""
    counted = Counter()
    for batches in seen(logdir).values():
        for batch in batches:
            stop = cut.get(batch["attempt"])
            if batch["counts"] and batch["epoch"] == epoch and (stop is None or batch["step"] <= stop):
                counted.update(batch["indices"])
    return counted


@pytest.mark.parametrize("mesh", ["hsdp", "tp-dp"])
def test_a_killed_mesh_run_resumes_bitwise_on_the_same_mesh(runs, killed, tmp_path, mesh):
    logdir = copy_of(killed(mesh), tmp_path / "run")
    resumed = launch(logdir, "last", ATTEMPT=1, **RUNS[mesh])
    assert resumed["code"] == 0, resumed["out"][-3000:]
    a, b = final(runs[mesh]), final(resumed)
    assert [d for key in EXACT_KEYS if key != "callbacks" for d in differences(a[key], b[key], key)] == []
    assert each_once(logdir, {0: 8})


def test_hsdp_resumes_as_fsdp_then_as_ddp_each_sample_once(runs, killed, tmp_path):
    logdir = copy_of(killed("hsdp"), tmp_path / "run")
    fsdp = launch(logdir, "last", ATTEMPT=1, STRATEGY="fsdp", PERIOD=1, CLIP=0.5, KILL_AT_BATCH=11, KILL_RANK=2)
    assert fsdp["code"] != 0 and final(fsdp)["meta"]["mesh"] == {"replicate": 1, "shard": 4, "tensor": 1}
    assert final(fsdp)["loop"]["global_batch_step"] == 11  # checkpointed every batch: the one before the kill too
    ddp = launch(logdir, "last", ATTEMPT=2, STRATEGY="ddp", PERIOD=2, CLIP=0.5)
    assert ddp["code"] == 0, ddp["out"][-3000:]
    assert_close_models(final(ddp), final(runs["hsdp"]))
    assert each_once(logdir, {0: 8, 1: 11})


def test_tensor_parallel_resumes_without_it_each_sample_once(runs, killed, tmp_path):
    logdir = copy_of(killed("tp-dp"), tmp_path / "run")
    ddp = launch(logdir, "last", ATTEMPT=1, STRATEGY="ddp", NPROC=2, PERIOD=2, CLIP=0.5)
    assert ddp["code"] == 0, ddp["out"][-3000:]
    assert_close_models(final(ddp), final(runs["tp-dp"]))
    assert each_once(logdir, {0: 8})


def test_hsdp_resumes_on_half_the_world_each_sample_once(runs, killed, tmp_path):
    # 2x2 -> 2x1: two processes, each batch 8, keep the global batch of 16
    logdir = copy_of(killed("hsdp"), tmp_path / "run")
    half = launch(logdir, "last", ATTEMPT=1, STRATEGY="hsdp-half", NPROC=2, BATCH=8, PERIOD=2, CLIP=0.5)
    assert half["code"] == 0, half["out"][-3000:]
    assert final(half)["meta"]["mesh"] == {"replicate": 2, "shard": 1, "tensor": 1}
    assert "written by 4 process(es), resumed by 2" in half["out"]
    assert_close_models(final(half), final(runs["hsdp"]))
    assert each_once(logdir, {0: 8})
