"""An elastic torchrun job (``--nnodes=1:2``, two agents on this host) loses a node mid-epoch: the surviving
agent restarts its workers, which continue the run on half the processes, each sample of the interrupted epoch
trained once. The script is unchanged between attempts (it names no resume)."""
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import free_port
from tests.resume_helpers import ROOT, child_env
from torchstage import load_checkpoint

pytestmark = pytest.mark.distributed

SCRIPT = os.path.join(ROOT, "tests", "launch", "scripts", "elastic_run.py")



def _descendants(pid: int) -> list:
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent = int(open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _rows(logdir, attempt) -> list:
    names = os.listdir(logdir) if os.path.isdir(logdir) else []
    return [json.loads(line) for name in names if name.startswith(f"seen-{attempt}-")
            for line in open(os.path.join(logdir, name)) if line.endswith("\n")]


@pytest.mark.timeout(400)
def test_losing_a_node_mid_epoch_goes_on_with_the_nodes_left(tmp_path):
    logdir = tmp_path / "run"
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=elastic-test",
            "--max-restarts=2", "--rdzv-conf=last_call_timeout=3", "--monitor-interval=0.5", SCRIPT, str(logdir)]
    first = subprocess.Popen(args, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    time.sleep(1)
    second = subprocess.Popen(args, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # until the world of 4 trains in epoch 2, past its first checkpoint
        while time.monotonic() < deadline and not any(row["batch"] >= 9 for row in _rows(logdir, 0)):
            time.sleep(0.1)
        for pid in _descendants(second.pid):  # the node is lost: its agent and its workers
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = first.communicate(timeout=300)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert first.returncode == 0, out[-3000:]
    assert "written by 4 process(es), resumed by 2; the global batch size is 8 now (4 per process), 16 before" in out
    assert "; restart attempt 1 of this job" in out and "already holds a run" not in out
    final = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))
    assert (final["meta"]["world_size"], final["loop"]["global_epoch_step"], final["loop"]["epoch_done"]) == (2, 3,
                                                                                                            True)
    resumed_from = [line for line in out.splitlines() if "resuming from" in line][0]
    epoch, done = map(int, re.search(r"epoch (\d+), batch (\d+)", resumed_from).groups())  # batches done in it
    if "(epoch complete)" not in resumed_from:  # lost mid-epoch: that epoch's samples each trained once
        first_batch = (epoch - 1) * 6  # 96 samples, 4 per batch, 4 ranks: 6 batches per epoch
        ids = [i for row in _rows(logdir, 0) if row["epoch"] == epoch and row["batch"] <= first_batch + done
               for i in row["ids"]]
        ids += [i for row in _rows(logdir, 1) if row["epoch"] == epoch for i in row["ids"]]
        assert sorted(collections.Counter(ids).items()) == [(i, 1) for i in range(96)]
