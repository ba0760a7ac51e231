"""What a run relies on keeps working under HSDP and tensor parallel + FSDP (4 gloo processes): a restart after a
rank dies, monitor=True and torchstage report, the non-finite loss check, the hang watchdog, the checkpoint tools.
Each under one mesh, the two meshes sharing the work (both were run under each when this was built; the 4-process
launches are the suite's price): the restart under tensor parallel, whose sample counts differ from its ranks'."""
import csv
import os
import sys

import pytest
import torch

from tests import script_server
from tests.helpers import ROOT, script_env
from tests.resume_helpers import EXACT_KEYS, differences
from tests.strategies.test_mesh import RUNS, final, launch, mesh_runs, reports  # noqa: F401 (a session fixture)
from torchstage.files.checkpoint_read import load_checkpoint

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


@pytest.mark.parametrize("mesh", ["tp-dp"])
def test_a_rank_that_dies_is_restarted_and_monitor_and_report_see_the_mesh(mesh_runs, tmp_path, mesh):
    # killed in the second epoch (its 3rd batch: 6 batches an epoch under hsdp's 4 data-parallel ranks, 12 under 2)
    fail_at = {"hsdp": 9, "tp-dp": 15}[mesh]  # (hsdp: the same, checked when built)
    run = launch(tmp_path / "run", FAIL_ONCE_AT_BATCH=fail_at, KILL_RANK=1, MAX_RESTARTS=1, MONITOR=1, **RUNS[mesh])
    out = run["out"]
    assert run["code"] == 0, out[-3000:]
    assert "attempt 1 of 2 failed (rank 1 killed by signal 9" in out, out
    assert "the run finished on attempt 2 of 2" in out
    checkpoint = final(run)
    steps = 2 * 96 // (4 * checkpoint["meta"]["data_parallel"])  # 2 epochs of batches of 4 per data-parallel rank
    assert checkpoint["meta"]["restart_attempt"] == 1 and checkpoint["loop"]["global_batch_step"] == steps
    # the restarted run goes on from its checkpoint of the batch before and ends as the run never interrupted
    assert [d for key in EXACT_KEYS if key not in ("callbacks", "metrics")
            for d in differences(final(mesh_runs[mesh])[key], checkpoint[key], key)] == []
    # throughput counts each sample once: 96 train samples an epoch, whatever the tensor-parallel degree
    rows = list(csv.DictReader(open(tmp_path / "run" / "logs" / "train.csv")))
    assert {float(row["samples"]) for row in rows} == {96.0}
    first = rows[0]  # (the second epoch's figures count what the restarted attempt trained of it)
    assert float(first["samples_per_s"]) == pytest.approx(96 / float(first["time_s"]), rel=1e-3)
    report = script_server.run([sys.executable, "-m", "torchstage", "report", str(tmp_path / "run"), "-o",
                             str(tmp_path / "report")], env=script_env(), cwd=ROOT)
    assert report.returncode == 0, report.stderr
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| 4 |" in table  # the world size of the run


@pytest.mark.parametrize("mesh", ["hsdp"])
def test_a_nan_loss_stops_every_rank_and_no_checkpoint_holds_it(tmp_path, mesh):
    run = launch(tmp_path / "run", NAN_AT_BATCH=3, **RUNS[mesh])
    out = run["out"]
    assert run["code"] != 0
    assert ("NonFiniteLossError: non-finite loss: 'loss' was nan on rank 0 at stage 'main', epoch 1, loader 'train', "
            "batch 3 (global batch 3)") in out, out[-3000:]
    last = load_checkpoint(os.path.join(run["logdir"], "checkpoints", "last.pth"))
    assert last["loop"]["global_batch_step"] == 2
    assert all(torch.isfinite(t).all() for t in last["models"]["model"].values())


@pytest.mark.parametrize("mesh", ["tp-dp"])
def test_a_hung_rank_is_named_by_the_watchdog(tmp_path, mesh):
    run = launch(tmp_path / "run", HANG_AT_BATCH=3, KILL_RANK=1, HANG_TIMEOUT=3, **RUNS[mesh])
    out = run["out"]
    assert run["code"] == 124, out[-3000:]
    assert "[rank1]: torchstage: rank 1 made no progress for 3 s (hang_timeout=3)" in out, out[-3000:]
    assert "torchstage: hang detected on rank 1; ending the job with exit code 124." in out
    assert "Stopped outside any collective (what the others wait for): rank 1." in out


def test_checkpoint_tools_read_a_tensor_parallel_checkpoint(mesh_runs, tmp_path):
    run = mesh_runs["tp-dp"]
    last = os.path.join(run["logdir"], "checkpoints", "last.pth")

    def tool(*args):
        return script_server.run([sys.executable, "-m", "torchstage", "checkpoint", *args], env=script_env(), cwd=ROOT)
    inspected = tool("inspect", last)
    assert inspected.returncode == 0, inspected.stderr
    assert "mesh replicate 1 x shard 2 x tensor 2" in inspected.stdout, inspected.stdout
    consolidated = tool("consolidate", last, str(tmp_path / "plain.pth"))
    assert consolidated.returncode == 0, consolidated.stderr
    plain = torch.load(tmp_path / "plain.pth", weights_only=True)
    whole = load_checkpoint(last)["models"]["model"]
    assert plain["models"]["model"].keys() == whole.keys()
    assert all(torch.equal(plain["models"]["model"][k], v) for k, v in whole.items())
    assert plain["models"]["model"]["block.q.weight"].shape == (16, 16)  # whole tensors, not a rank's part
    from torchstage import load_model_weights
    sys.path.insert(0, os.path.join(ROOT, "tests", "strategies", "scripts"))
    try:
        from mesh_run import Net
    finally:
        sys.path.pop(0)
    model = Net()
    load_model_weights(model, last)
    assert torch.equal(model.block.up.weight, whole["block.up.weight"])
    up = whole["block.up.weight"].double().sum().item()
    assert reports(run)[3]["weights"]["block.up.weight"] == pytest.approx(up)  # what rank 3 held, gathered


def test_the_parallelism_example_trains_a_language_model_with_tensor_parallel(tmp_path):
    from tests.helpers import run as run_script
    result = run_script(["scripts/parallelism_example.py", tmp_path / "logs", "tp"], nproc=4, timeout=400)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    for rank, (dp, tp) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        line = next(line for line in out.splitlines() if f"rank {rank}/4 (" in line)
        assert f"(data-parallel {dp}/2, tensor-parallel {tp}/2) holds " in line
        local, total = (int(n.replace(",", "")) for n in line.split(" holds ")[1].split(" parameters")[0].split(" of "))
        assert local < total / 3  # the blocks split 2 ways by tensor parallelism, then sharded 2 ways by FSDP
        assert float(line.rsplit("valid loss ", 1)[1]) < 0.1  # it learned to count (a random guess: ln 64 = 4.2)
    assert "sequential all_reduce" not in out  # no DTensor advice for the norm of the clipped gradients
