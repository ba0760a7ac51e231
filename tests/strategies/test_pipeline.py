"""Pipeline parallelism on 4 gloo processes: pipeline 2 x data 2 and pipeline 2 x tensor 2 train as DDP on the same
global batch (1F1B and the looped Interleaved1F1B), each sample counted once on the last stage, the metrics on every
rank; a killed run resumes bitwise on the same mesh and sample-exact on another pipeline depth."""
import csv
import os
import sys

import pytest
import torch

from tests import script_server
from tests.helpers import script_env
from tests.resume_helpers import EXACT_KEYS, ROOT, differences
from tests.strategies.test_mesh import Runs, assert_close_models, copy_of, each_once, final, reports, seen

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

SCRIPT = os.path.join(ROOT, "tests", "strategies", "scripts", "pipeline_run.py")

RUNS = {  # 2 epochs of AdamW and StepLR, gradients clipped to norm 0.5, 96 train samples, global batch 8
    "ddp2": {"STRATEGY": "ddp", "NPROC": 2, "PERIOD": 2, "CLIP": 0.5},
    "ddp2-ordered": {"STRATEGY": "ddp", "NPROC": 2, "SHUFFLE": 0, "CLIP": 0.5},
    "pp": {"STRATEGY": "pp", "NPROC": 2, "BATCH": 8, "SHUFFLE": 0, "CLIP": 0.5},  # Pipeline(2) alone: plain tensors
    "pp-dp": {"STRATEGY": "pp-dp", "PERIOD": 2, "CLIP": 0.5},
    # 47 samples per data-parallel rank: each epoch ends on a batch of 3, which 2 microbatches do not divide
    "pp-dp-odd": {"STRATEGY": "pp-dp", "SAMPLES": 94, "CLIP": 0.5},
    "ddp2-odd": {"STRATEGY": "ddp", "NPROC": 2, "SAMPLES": 94, "CLIP": 0.5},  # pipeline 2 x data 2, batch 4 per pipeline
    "pp-dp-looped": {"STRATEGY": "pp-dp", "SCHEDULE": "Interleaved1F1B", "CLIP": 0.5},
    # one pipeline of 2 stages x tensor 2 reads the whole global batch (in order, as DDP's ranks deal it)
    "pp-tp": {"STRATEGY": "pp-tp", "BATCH": 8, "SHUFFLE": 0, "CLIP": 0.5},
    "pp-tp-looped": {"STRATEGY": "pp-tp", "SCHEDULE": "Interleaved1F1B", "BATCH": 8, "SHUFFLE": 0, "CLIP": 0.5},
}


def launch(logdir, resume=None, timeout=400, **env):
    args = [sys.executable, SCRIPT, str(logdir)] + ([str(resume)] if resume else [])
    proc = script_server.run(args, env=script_env(**env), cwd=ROOT, timeout=timeout, merge=True)
    return {"code": proc.returncode, "out": proc.stdout, "logdir": str(logdir)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The runs, each started the first time a test asks for it."""
    return Runs(tmp_path_factory.mktemp("pipeline"), launch, RUNS)


@pytest.mark.parametrize("mesh, reference", [("pp", "ddp2-ordered"), ("pp-dp", "ddp2"), ("pp-dp-looped", "ddp2"),
                                             ("pp-tp", "ddp2-ordered"), ("pp-tp-looped", "ddp2-ordered")])
def test_a_pipeline_trains_as_ddp_with_the_same_global_batch(runs, mesh, reference):
    a, b = final(runs[mesh]), final(runs[reference])
    assert sorted(a["models"]["model"]) == sorted(b["models"]["model"])  # the original names, whatever the stages
    assert_close_models(a, b)
    assert a["metrics"]["valid"]["loss"] == pytest.approx(b["metrics"]["valid"]["loss"], abs=1e-6)
    tensor, world = 2 if mesh.startswith("pp-tp") else 1, 2 if mesh == "pp" else 4
    assert a["meta"]["mesh"] == {"pipeline": 2, "replicate": 1, "shard": world // 2 // tensor, "tensor": tensor}
    every = reports(runs[mesh])
    assert len(every) == world
    for report in every.values():  # every rank holds the last stage's numbers, each sample counted once
        assert report["history"] == every[0]["history"]
        assert report["history"][-1]["metrics"]["valid"]["samples"] == 16
        assert report["history"][-1]["metrics"]["train"]["samples"] == 96
    looped = "Interleaved1F1B, 4 stages" if "looped" in mesh else "1F1B, 2 stages"
    announced = {"pp": "strategy Pipeline, mesh pipeline 2 x shard 1, schedule 1F1B, 2 stages, 2 microbatches, "
                       "data-parallel 1 x pipeline-parallel 2",
                 "pp-dp": f"mesh pipeline 2 x shard 2, schedule {looped}, 2 microbatches, data-parallel 2 x "
                          f"pipeline-parallel 2",
                 "pp-tp": f"mesh pipeline 2 x shard 1 x tensor 2, schedule {looped}, 2 microbatches, data-parallel "
                          f"1 x pipeline-parallel 2 x tensor-parallel 2"}[mesh.replace("-looped", "")]
    assert announced in runs[mesh]["out"]


def test_a_last_batch_that_the_microbatches_do_not_divide_trains_as_ddp(runs):
    a, b = final(runs["pp-dp-odd"]), final(runs["ddp2-odd"])
    assert_close_models(a, b)
    assert a["loop"]["global_batch_step"] == 2 * 12  # 11 batches of 4 and one of 3 per epoch


def test_checkpoint_inspect_names_the_pipeline_dimension(runs):
    last = os.path.join(runs["pp-tp"]["logdir"], "checkpoints", "last.pth")
    inspected = script_server.run([sys.executable, "-m", "torchstage", "checkpoint", "inspect", last], env=script_env(),
                                  cwd=ROOT)
    assert inspected.returncode == 0, inspected.stderr
    assert "mesh pipeline 2 x replicate 1 x shard 1 x tensor 2" in inspected.stdout, inspected.stdout


def test_each_rank_holds_and_checkpoints_only_its_stages(runs):
    every = reports(runs["pp-dp"])
    held = {rank: sorted({name.split(".")[0] + ("." + name.split(".")[1] if name.startswith("blocks") else "")
                          for name in every[rank]["weights"]}) for rank in every}
    # ranks 0, 1: the first stage (embed, blocks 0-2); ranks 2, 3: the second (block 3, pool, head)
    assert held[0] == held[1] == ["blocks.0", "blocks.1", "blocks.2", "embed"]
    assert held[2] == held[3] == ["blocks.3", "head"]
    assert [every[r]["dp_rank"] for r in range(4)] == [0, 1, 0, 1]
    # the stages of one pipeline read the same batches; its last stage counts them
    batches = seen(runs["pp-dp"]["logdir"])
    steps = {rank: [(b["step"], b["indices"]) for b in batches[rank]] for rank in range(4)}
    assert steps[0] == steps[2] and steps[1] == steps[3] and steps[0] != steps[1]
    assert [{b["counts"] for b in batches[rank]} for rank in range(4)] == [{False}, {False}, {True}, {True}]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A pipeline 2 x data 2 run killed (SIGKILL of rank 1) at global batch 9, mid-epoch 1, after a checkpoint at
    batch 8."""
    run = launch(tmp_path_factory.mktemp("killed") / "pp-dp", KILL_AT_BATCH=9, KILL_RANK=1, **RUNS["pp-dp"])
    assert run["code"] != 0
    assert final(run)["loop"]["global_batch_step"] == 8 and not final(run)["loop"]["epoch_done"]
    return run["logdir"]


def test_a_killed_pipeline_resumes_bitwise_on_the_same_mesh(runs, killed, tmp_path):
    logdir = copy_of(killed, tmp_path / "run")
    resumed = launch(logdir, "last", ATTEMPT=1, **RUNS["pp-dp"])
    assert resumed["code"] == 0, resumed["out"][-3000:]
    a, b = final(runs["pp-dp"]), final(resumed)
    assert [d for key in EXACT_KEYS if key != "callbacks" for d in differences(a[key], b[key], key)] == []
    assert each_once(logdir, {0: 8})


@pytest.mark.parametrize("mesh", [{"STRATEGY": "ddp", "NPROC": 2},  # pipeline 2 x data 2 -> data 2 (no pipeline)
                                  {"STRATEGY": "ddp", "NPROC": 4, "BATCH": 2}])  # -> data 4, the same global batch
def test_a_killed_pipeline_resumes_at_another_depth_each_sample_once(runs, killed, tmp_path, mesh):
    logdir = copy_of(killed, tmp_path / "run")
    resumed = launch(logdir, "last", ATTEMPT=1, PERIOD=2, CLIP=0.5, **mesh)
    assert resumed["code"] == 0, resumed["out"][-3000:]
    assert_close_models(final(resumed), final(runs["pp-dp"]))
    assert each_once(logdir, {0: 8})


def test_a_rank_of_a_pipeline_that_dies_is_restarted_and_ends_as_the_run_never_interrupted(runs, tmp_path):
    """max_restarts under a pipeline 2 x data 2: rank 1 killed at global batch 15 (epoch 2) is restarted with its
    world from the checkpoint of batch 14, and the run ends as the uninterrupted one, bitwise."""
    run = launch(tmp_path / "run", FAIL_ONCE_AT_BATCH=15, KILL_RANK=1, MAX_RESTARTS=1, **RUNS["pp-dp"])
    assert run["code"] == 0, run["out"][-3000:]
    assert "attempt 1 of 2 failed (rank 1 killed by signal 9" in run["out"], run["out"][-3000:]
    assert "the run finished on attempt 2 of 2" in run["out"]
    checkpoint = final(run)
    assert checkpoint["meta"]["restart_attempt"] == 1 and checkpoint["loop"]["global_batch_step"] == 24
    assert [d for key in EXACT_KEYS if key not in ("callbacks", "metrics")
            for d in differences(final(runs["pp-dp"])[key], checkpoint[key], key)] == []


def test_a_pipeline_rolls_back_past_a_nan_batch_on_every_stage(tmp_path):
    """NonFiniteLossCallback(mode="rollback") under a pipeline 2 x data 2: the NaN loss of each batch holding sample
    17 (computed on the last stage, broadcast to the first) rolls every rank back once an epoch; the pass goes on
    without that global batch (its 8 samples), and the run ends with finite weights."""
    run = launch(tmp_path / "run", NAN_SAMPLE=17, ROLLBACK=2, **RUNS["pp-dp"])
    out = run["out"]
    assert run["code"] == 0, out[-3000:]
    checkpoint = final(run)
    assert all(torch.isfinite(t).all() for t in checkpoint["models"]["model"].values())
    rows = list(csv.DictReader(open(tmp_path / "run" / "logs" / "train.csv")))
    assert [(float(row["rollbacks"]), float(row["samples"])) for row in rows] == [(1.0, 88.0), (1.0, 88.0)], rows


@pytest.mark.parametrize("env, message", [
    ({"MICRO": 3}, "Pipeline(n_microbatches=3) must divide the batch of 4 samples a "
                   "pipeline trains per step (each microbatch of one size); give a divisor of 4"),
    ({"MICRO": 1}, "Pipeline(n_microbatches=1) does not fit schedule Schedule1F1B with 2 stages (Number of "
                   "microbatches (1) must be greater than or equal to the number of stages (2).)"),
    ({"ACCUM": 2}, "Pipeline: accumulation_steps=2 with a pipeline; a pipeline accumulates over its microbatches"),
    ({"STRATEGY": "pp-dp", "SCHEDULE": "InterleavedZeroBubble", "NPROC": 4},
     "ModelParallel(schedule='InterleavedZeroBubble') with 2 data-parallel ranks: its split backward and FSDP's "
     "gradient reduction give wrong gradients"),
])
def test_what_a_pipeline_cannot_run_is_refused_before_training(tmp_path, env, message):
    run = launch(tmp_path / "run", **{"STRATEGY": "pp", "NPROC": 2, **env})
    assert run["code"] != 0 and message in run["out"], run["out"][-3000:]
    assert "epoch 1/2" not in run["out"]


def test_the_pipeline_example_trains_a_language_model_in_stages(tmp_path):
    from tests.helpers import run as run_script
    result = run_script(["scripts/pipeline_example.py", tmp_path / "logs", "pp"], nproc=4, timeout=400)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    # 9 pieces in 2 stages, as even as can be: the first holds one more
    first, second = "embed, blocks.0, blocks.1, blocks.2, blocks.3", "blocks.4, blocks.5, norm, head"
    for rank, (stage, dp, held) in enumerate([(0, 0, first), (0, 1, first), (1, 0, second), (1, 1, second)]):
        line = next(line for line in out.splitlines() if f"rank {rank}/4 (" in line)
        assert f"(pipeline stage {stage}, data-parallel {dp}/2) holds {held}; valid loss " in line
        assert float(line.rsplit("valid loss ", 1)[1]) < 0.1  # it learned to count (a random guess: ln 64 = 4.2)
