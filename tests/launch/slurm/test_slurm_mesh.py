"""strategy="hsdp" under `srun -N 2 --ntasks-per-node=2` on the real local SLURM cluster: the model is sharded
within each node and replicated across the two, as the line announcing the world says."""
import json
import os
import subprocess
import sys

import pytest

from tests.resume_helpers import ROOT
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401 (session fixture)
from torchstage.files.checkpoint_read import load_checkpoint

SCRIPT = os.path.join(ROOT, "tests", "strategies", "scripts", "mesh_run.py")
pytestmark = pytest.mark.timeout(400)


def test_hsdp_shards_within_each_node_and_replicates_across_nodes(slurm_cluster, tmp_path):  # noqa: F811
    env = {**slurm_cluster, "OMP_NUM_THREADS": "1", "STRATEGY": "hsdp-name", "NPROC": "0", "EPOCHS": "1"}
    env.pop("TORCHSTAGE_NPROC", None)
    proc = subprocess.run(["srun", "-N", "2", "--ntasks-per-node=2", sys.executable, SCRIPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "world: 4 processes on 2 nodes (slurm, gloo backend), strategy HSDP, mesh replicate 2 x shard 2" in out, out
    reports = [json.load(open(tmp_path / f"report-rank{rank}.json")) for rank in range(4)]
    assert [r["node"] for r in reports] == ["node1", "node1", "node2", "node2"]
    assert [r["shard_group"] for r in reports] == [[0, 1], [0, 1], [2, 3], [2, 3]]  # shards on one node
    assert [r["replicate_group"] for r in reports] == [[0, 2], [1, 3], [0, 2], [1, 3]]  # replicas across nodes
    assert load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["meta"]["mesh"] == \
        {"replicate": 2, "shard": 2, "tensor": 1}
