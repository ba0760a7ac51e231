"""The runnable example of docs/checkpoints.md: stop mid-epoch, resume, end with the best weights."""
import os
import sys

from tests import script_server
from tests.resume_helpers import ROOT, child_env

EXAMPLE = os.path.join(ROOT, "scripts", "examples", "checkpoints_resume.py")


def test_example_stops_resumes_and_loads_the_best(tmp_path):
    logdir = str(tmp_path / "demo")
    run = [sys.executable, EXAMPLE, logdir]
    stopped = script_server.run(run + ["--stop-at-batch", "12"], env=child_env(), timeout=120)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "graceful stop (demo stop at batch 12)" in stopped.stdout
    finished = script_server.run(run, env=child_env(), timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "[main] epoch 1/4" not in finished.stdout and "[main] epoch 4/4" in finished.stdout
    assert "the model holds the best weights: True" in finished.stdout
    files = os.listdir(os.path.join(logdir, "checkpoints"))
    assert len([f for f in files if f.startswith("epoch-")]) == 2  # topk=2
    assert {"best.pth", "last.pth", "metrics.json"} <= set(files)
