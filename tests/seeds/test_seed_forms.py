"""The Catalyst distributed tutorial this project was built from, its three distributed forms run verbatim (unseeded
data; only the import line and the logdir differ) under every launcher: torchstage's own (TORCHSTAGE_NPROC=2),
torchrun, srun -N 2 (one task per node; two, four ranks, for the first form), Open MPI's mpirun and MPICH's
mpiexec. Each run forms one world, writes last.pth, and its validation loss is the one a single process computes
from that checkpoint on the same data (each sample once), which the test draws again from the seeds the run
records."""
import re
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests import script_server
from tests.helpers import ROOT, run, script_env
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401 (session fixture)
from torchstage.rng import seeded, set_seed

SCRIPTS = Path(__file__).resolve().parent / "scripts"
FORMS = {  # the seed's forms, and the first one's loaders moved into the function distributed_cmd_run runs
    "case1": SCRIPTS / "case1_distributed_true.py",
    "case2": SCRIPTS / "case2_datasets.py",
    "case3": SCRIPTS / "case3_get_datasets_fn.py",
    "loaders_in_cmd_run": SCRIPTS / "loaders_in_cmd_run.py",
}
CATALYST_README = ROOT / "scripts" / "catalyst20" / "distributed_regression.py"
NUM_SAMPLES, NUM_FEATURES, BATCH_SIZE = int(1e4), int(1e1), 32
MPI = {"mpirun": ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"], "mpiexec": ["mpiexec.mpich", "-np", "2"]}
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]


def tutorial_data(seed: int, made_by_torchstage: bool):
    """The tutorial's ``X, y`` as a rank drew them: after ``set_seed(seed)`` at module level (the seed the launcher
    gave the script), or inside ``get_datasets_fn`` under torchstage's ``seeded(seed)`` (the run's seed)."""
    if made_by_torchstage:
        with seeded(seed):
            X = torch.rand(NUM_SAMPLES, NUM_FEATURES)
            return X, torch.rand(X.shape[0])
    set_seed(seed)
    return torch.rand(NUM_SAMPLES, NUM_FEATURES), torch.rand(NUM_SAMPLES)


def valid_loss_from_checkpoint(checkpoint: dict, X, y) -> float:
    """The validation loss of the checkpoint's model as the run computes it, in this one process: each data-parallel
    rank's strided shard (no padding) in batches of 32, the per-batch MSE weighted by batch size, each sample once."""
    model = torch.nn.Linear(NUM_FEATURES, 1)
    model.load_state_dict(checkpoint["models"]["model"])
    ranks, total = checkpoint["meta"]["data_parallel"], 0.0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tutorial's [B, 1] outputs against [B] targets broadcast, as in the run
        for rank in range(ranks):
            shard = torch.arange(rank, NUM_SAMPLES, ranks)
            for batch in shard.split(BATCH_SIZE):
                total += torch.nn.functional.mse_loss(model(X[batch]), y[batch]).double().item() * len(batch)
    return total / NUM_SAMPLES


def check_run(result, logdir: Path, form: str, world_size: int) -> None:
    """One world of ``world_size`` processes trained all 8 epochs, wrote last.pth, and its validation loss is the
    single-process loss of its final model on the data the ranks drew."""
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "the ranks hold different data" not in out
    assert re.findall(r"world: (\d+) processes", out) == [str(world_size)], out[-4000:]  # one world, announced once
    checkpoint = torch.load(logdir / "checkpoints" / "last.pth", weights_only=True)
    meta = checkpoint["meta"]
    assert meta["world_size"] == world_size and checkpoint["loop"]["epoch"] == 8
    if form == "case3":
        X, y = tutorial_data(meta["hparams"]["seed"], made_by_torchstage=True)
    else:
        assert meta["script_seed"] is not None, meta  # module-level code was seeded alike on every rank
        X, y = tutorial_data(meta["script_seed"], made_by_torchstage=False)
    assert checkpoint["metrics"]["valid"]["loss"] == pytest.approx(valid_loss_from_checkpoint(checkpoint, X, y),
                                                                   rel=1e-5)


def mpi_command(name: str) -> list:
    command = MPI[name]
    if not shutil.which(command[0]):
        if script_env().get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {command[0]} is missing (apt-get install openmpi-bin mpich)")
        pytest.skip(f"{command[0]} is not installed (apt-get install openmpi-bin mpich)")
    return command


@pytest.mark.parametrize("form", sorted(FORMS))
def test_torchstage_launcher(form, tmp_path):
    check_run(run([FORMS[form], tmp_path], nproc=2, timeout=300, fresh=True), tmp_path, form, 2)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_torchrun(form, tmp_path):
    result = run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", FORMS[form], tmp_path],
                 timeout=300, fresh=True)
    check_run(result, tmp_path, form, 2)


# Every form with one task per node (the tutorial's `srun -N 2 python run.py`); two per node (four ranks, a local
# rank beside the node rank) with the first form: the layout does not depend on how the data is given.
@pytest.mark.parametrize("form, tasks_per_node", [("case1", 1), ("case2", 1), ("case3", 1), ("case1", 2)])
def test_srun_on_two_nodes(form, tasks_per_node, slurm_cluster, tmp_path):  # noqa: F811
    result = script_server.run(["srun", "-N", "2", f"--ntasks-per-node={tasks_per_node}", sys.executable,
                                FORMS[form], tmp_path], env=slurm_cluster, timeout=300)
    check_run(result, tmp_path, form, 2 * tasks_per_node)


@pytest.mark.mpi
@pytest.mark.parametrize("form, launcher", [("case1", "mpirun"), ("case2", "mpirun"), ("case3", "mpirun"),
                                            ("case1", "mpiexec")])
def test_mpi(form, launcher, tmp_path):
    result = script_server.run([*mpi_command(launcher), sys.executable, FORMS[form], tmp_path], cwd=ROOT,
                               env=script_env(), timeout=300)  # past it: every rank's stack in the failure
    check_run(result, tmp_path, form, 2)


def test_catalyst_readme_distributed_regression_runs_on_two_processes(tmp_path):
    """Catalyst 20.12's README "Linear Regression (distributed training version)", moved by its import line."""
    check_run(run([CATALYST_README, tmp_path], nproc=2, timeout=300, fresh=True), tmp_path, "case3", 2)
