"""sync_metric_states on 3 real gloo processes: exact on uneven shards, and no hang when a rank saw no sample
(torchmetrics' own gather pads by shape and breaks on a rank whose list state is empty)."""
import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, free_port, script_env

pytestmark = pytest.mark.distributed

WORKER = """
import json, os, sys, warnings
import torch, torch.distributed as dist, torchmetrics
from torchstage import Engine
from torchstage.metrics.torchmetrics_sync import sync_metric_states
rank, world = int(sys.argv[1]), 3
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=rank, world_size=world)
engine = Engine(device="cpu", rank=rank, world_size=world)
g = torch.Generator().manual_seed(0)
probs, target = torch.rand(101, 4, generator=g).softmax(1), torch.randint(0, 4, (101,), generator=g)
shards = {0: slice(0, 70), 1: slice(70, 101), 2: slice(0, 0)}  # rank 2 reads nothing
out = {}
for name, make in {"auroc": lambda: torchmetrics.classification.MulticlassAUROC(4, thresholds=None),
                   "f1": lambda: torchmetrics.classification.MulticlassF1Score(4, average="macro"),
                   "mse": lambda: torchmetrics.MeanSquaredError()}.items():
    metric = make()
    x, y = probs[shards[rank]], target[shards[rank]]
    if len(y):
        metric.update(x, y) if name != "mse" else metric.update(x[:, 0], y.float())
    sync_metric_states(metric, engine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out[name] = float(metric.compute())
    whole = make()
    whole.update(probs, target) if name != "mse" else whole.update(probs[:, 0], target.float())
    out[name + "_single"] = float(whole.compute())
print(json.dumps(out))
dist.destroy_process_group()
"""



@pytest.mark.timeout(180)
def test_uneven_and_empty_shards_sync_exactly(tmp_path):
    port = free_port()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(port)], cwd=ROOT, env=script_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        for name in ("auroc", "f1", "mse"):
            assert result[name] == pytest.approx(result[name + "_single"], abs=1e-6), name
    assert results[0] == results[1] == results[2]
