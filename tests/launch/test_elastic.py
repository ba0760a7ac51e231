"""An elastic torchrun job (``--nnodes=1:2``, two agents on this host) loses a node mid-epoch: the surviving
agent restarts its workers, which continue the run on half the processes, each sample of the interrupted epoch
trained once, naming the lost node; when the node's command starts again the world grows back at the next
re-rendezvous. The script is unchanged between attempts (it names no resume)."""
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from torch import nn

from tests.helpers import free_port
from tests.resume_helpers import ROOT, child_env
from torchstage import load_checkpoint, load_model_weights

pytestmark = [pytest.mark.distributed, pytest.mark.waits]  # rendezvous keep-alives of 1-3 s

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


def _phases(logdir) -> list:
    """Each world's rows (``rows-PHASE-RANK.jsonl``), worlds in the order they trained: ``[(phase, rows)]``."""
    phases = {}
    for name in os.listdir(logdir) if os.path.isdir(logdir) else ():
        if name.startswith("rows-"):
            phase = name[len("rows-"):].rsplit("-", 1)[0]
            phases.setdefault(phase, []).extend(json.loads(line) for line in open(os.path.join(logdir, name))
                                                if line.endswith("\n"))
    return sorted(phases.items(), key=lambda item: min(row["batch"] for row in item[1]))


def _trained(logdir) -> dict:
    """Global epoch -> the sample ids its train batches were made of, over every world: a world's batches after the
    checkpoint the next world resumed from (its first batch less one) were lost with it and trained again."""
    phases, ids = _phases(logdir), collections.defaultdict(list)
    for index, (_, rows) in enumerate(phases):
        end = min(row["batch"] for row in phases[index + 1][1]) if index + 1 < len(phases) else float("inf")
        for row in rows:
            if row["batch"] < end:
                ids[row["epoch"]] += row["ids"]
    return ids


def _kill_tree(proc) -> None:
    for pid in _descendants(proc.pid):  # the node is lost: its agent and its workers
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for(condition, what: str, seconds: float = 150) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.1)


@pytest.mark.timeout(500)
def test_a_node_lost_mid_epoch_goes_on_with_the_nodes_left_and_grows_back_when_it_returns(tmp_path):
    """Two agents of one job; the second (its agent and workers) is killed mid-epoch 2, the first goes on with its 2
    processes, naming the lost node; the second's command started again joins at the next re-rendezvous and the run
    ends with 4 processes. Every epoch trains each sample once; one logdir, one MLflow run, one restart count."""
    from mlflow import MlflowClient  # the MLflow extra
    logdir = tmp_path / "run"
    # torch's shared rendezvous store hands a returning node no master address: grow-back needs it off (docs)
    env = child_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, EPOCHS=4, MLFLOW=1)
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=elastic-test",
            "--max-restarts=2", "--rdzv-conf=last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3",
            "--monitor-interval=0.5", SCRIPT, str(logdir)]
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("first", "third")}  # not pipes: read at the end
    first = subprocess.Popen(args, env=env, stdout=logs["first"], stderr=subprocess.STDOUT, start_new_session=True)
    time.sleep(1)
    second = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    third = None
    try:  # the world of 4 trains in epoch 2, past its first checkpoint there: the node is lost
        _wait_for(lambda: any(row["batch"] >= 9 for row in _rows(logdir, 0)), "epoch 2 with 4 processes")
        _kill_tree(second)
        _wait_for(lambda: any(phase.split("-")[1].startswith("2x") for phase, _ in _phases(logdir)),
                  "the 2 processes left training")
        third = subprocess.Popen(args, env=env, stdout=logs["third"], stderr=subprocess.STDOUT,
                                 start_new_session=True)  # the lost node's command again
        first.wait(timeout=300)
        third.wait(timeout=120)
    finally:
        for proc in (first, second, third):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    out, third_out = (open(tmp_path / f"{name}.log").read() for name in ("first", "third"))
    assert first.returncode == 0, out[-3000:]
    assert third.returncode == 0, third_out[-3000:]
    both = out + third_out
    # the survivor's log names the lost node (host, agent, ranks) and the attempt
    lost = re.search(r"\(restart attempt 1 of this job\): the world that wrote it had 2 node\(s\) and 4 "
                     rf"process\(es\), this one has 1 and 2: lost node \S+ \(agent pid {second.pid}\) with ranks "
                     r"(\d)-(\d) of 4", out)
    assert lost, out[-4000:]
    assert "written by 4 process(es), resumed by 2; the global batch size is 8 now (4 per process), 16 before" in out
    assert re.search(r"had 1 node\(s\) and 2 process\(es\), this one has 2 and 4: joined node \S+ \(agent pid "
                     rf"{third.pid}\) with ranks \d-\d of 4", both), both[-4000:]
    assert "written by 2 process(es), resumed by 4" in both
    assert "already holds a run" not in both and "Traceback" not in third_out
    # the final checkpoint: the world grown back, the last epoch done, loadable
    final = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))
    assert (final["meta"]["world_size"], final["loop"]["global_epoch_step"], final["loop"]["epoch_done"]) == (4, 4,
                                                                                                            True)
    assert [len(node["ranks"]) for node in final["meta"]["nodes"]] == [2, 2]
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    load_model_weights(model, str(logdir / "checkpoints" / "last.pth"))
    # each epoch trained each sample once, over the worlds of 4, 2 and 4 processes
    phases = [phase.split("-")[1].split("x")[0] for phase, _ in _phases(logdir)]
    assert phases == ["4", "2", "4"], phases
    trained = _trained(logdir)
    assert sorted(trained) == [1, 2, 3, 4]
    for epoch, ids in trained.items():
        assert sorted(collections.Counter(ids).items()) == [(i, 1) for i in range(96)], epoch
    # one logdir, one lock, one MLflow run, one restart count: the job's
    assert not (logdir / ".torchstage.lock").exists()
    rows = (logdir / "logs" / "train.csv").read_text().splitlines()
    assert [row.split(",")[:3] for row in rows[1:]] == [["main", str(e), str(e)] for e in (1, 2, 3, 4)]
    assert [row.split(",")[-1] for row in (logdir / "logs" / "run.csv").read_text().splitlines()[1:]] == ["1", "1"]
    client = MlflowClient(tracking_uri=f"sqlite:///{logdir}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("torchstage").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert sorted({m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")}) == [1, 2, 3, 4]


@pytest.mark.timeout(400)
def test_a_node_joining_with_overwrite_continues_the_run_and_never_replaces_it(tmp_path):
    """``overwrite=True`` and a node that joins a running elastic job (no failure: torchrun restarts the workers for
    the new membership without counting a restart): the grown world continues the run from its last checkpoint,
    every epoch trained once; it does not start over from epoch 1."""
    logdir = tmp_path / "run"
    env = child_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, EPOCHS=8, OVERWRITE=1)  # epochs left when the node is in
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=elastic-join",
            "--max-restarts=2", "--rdzv-conf=last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3",
            "--monitor-interval=0.5", SCRIPT, str(logdir)]
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("first", "second")}
    first = subprocess.Popen(args, env=env, stdout=logs["first"], stderr=subprocess.STDOUT, start_new_session=True)
    second = None
    try:  # the world of 2 trains into epoch 2, past a checkpoint there: a second node joins
        _wait_for(lambda: any(row["batch"] >= 16 for row in _rows(logdir, 0)), "epoch 2 with 2 processes", 200)
        second = subprocess.Popen(args, env=env, stdout=logs["second"], stderr=subprocess.STDOUT,
                                  start_new_session=True)
        first.wait(timeout=300)
        second.wait(timeout=120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    out, second_out = (open(tmp_path / f"{name}.log").read() for name in ("first", "second"))
    assert first.returncode == 0 and second.returncode == 0, out[-3000:] + second_out[-3000:]
    phases = _phases(logdir)
    assert [phase.split("-")[1].split("x")[0] for phase, _ in phases] == ["2", "4"], [p for p, _ in phases]
    grown = min(row["batch"] for row in phases[1][1])
    assert grown > 16, grown  # the world of 4 went on from the checkpoint in epoch 2, not from batch 1
    trained = _trained(logdir)
    assert sorted(trained) == list(range(1, 9))
    for epoch, ids in trained.items():  # each sample once per epoch over both worlds
        assert sorted(collections.Counter(ids).items()) == [(i, 1) for i in range(96)], epoch
    rows = (logdir / "logs" / "train.csv").read_text().splitlines()
    assert [row.split(",")[:3] for row in rows[1:]] == [["main", str(e), str(e)] for e in range(1, 9)], rows
    assert "continuing its run" in out + second_out, (out + second_out)[-3000:]
