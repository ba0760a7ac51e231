"""On the real local SLURM cluster: the elastic command line of docs/distributed.md (``srun --no-kill torchrun
--nnodes=1:2`` in a batch job of 2 nodes) loses a node's torchrun (its agent and workers, SIGKILL) and goes on with
the other node's processes, naming the lost node; ``srun --jobid ... --overlap -w <node> torchrun ...`` on that
node brings the world back to 4. One job, never requeued; every epoch trains each sample once.

Both "nodes" of the local cluster run on this host, so both agents can serve the rendezvous endpoint: the one
killed is the one that does not (on a real cluster the endpoint's node is the head, whose loss ends the job).
"""
import collections
import os
import signal
import re
import subprocess
import time

import pytest

from tests.helpers import free_port
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401 (session fixture)
from tests.launch.test_elastic import SCRIPT, _descendants, _phases, _trained, _wait_for
from torchstage import load_checkpoint

pytestmark = [pytest.mark.slurm, pytest.mark.distributed, pytest.mark.timeout(500)]
TORCHRUN = ("torchrun --nnodes=1:2 --nproc-per-node=2 --max-restarts=3 --rdzv-backend=c10d "
            "--rdzv-endpoint={head}:{port} --rdzv-id={job} "
            "--rdzv-conf=last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3 --monitor-interval=0.5 "
            f"{SCRIPT} {{logdir}}")


def _listener_inode(port: int):
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":  # LISTEN
                return fields[9]
    return None


def _agents() -> dict:
    """SLURM node -> (pid, socket inodes) of each torchrun agent running in a step of the local cluster."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{pid}/cmdline").read().split("\0")
            environ = open(f"/proc/{pid}/environ").read().split("\0")
            sockets = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                       if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
        except OSError:
            continue
        node = next((v.split("=", 1)[1] for v in environ if v.startswith("SLURMD_NODENAME=")), None)
        if node and any(part.endswith("torchrun") for part in command[:2]):
            found[node] = (int(pid), sockets)
    return found


def test_srun_no_kill_torchrun_loses_a_node_and_grows_back_in_one_job(slurm_cluster, tmp_path):  # noqa: F811
    env = {**slurm_cluster, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "EPOCHS": "12", "OMP_NUM_THREADS": "1"}
    env.pop("TORCHSTAGE_NPROC", None)
    logdir, port = tmp_path / "run", free_port()
    batch = tmp_path / "elastic.sbatch"
    batch.write_text("#!/bin/bash\nhead=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n"
                     f"srun --no-kill {TORCHRUN.format(head='$head', port=port, job='$SLURM_JOB_ID', logdir=logdir)}\n")
    job = subprocess.run(["sbatch", "--parsable", "-N", "2", "--ntasks-per-node=1", "-o", str(tmp_path / "job.out"),
                          str(batch)], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip().split(";")[0]
    joined = None
    try:
        _wait_for(lambda: any(row["batch"] >= 9 for phase, rows in _phases(logdir) if phase.startswith("0-4x")
                              for row in rows), "4 processes in epoch 2", 200)
        agents, store = _agents(), _listener_inode(port)
        lost = next(node for node, (_, sockets) in agents.items() if store not in sockets)
        for pid in _descendants(agents[lost][0]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_for(lambda: any(phase.split("-")[1].startswith("2x") for phase, _ in _phases(logdir)),
                  "the 2 processes left training", 150)
        command = ["srun", f"--jobid={job}", "--no-kill", "--overlap", "-N", "1", "-w", lost,
                   *TORCHRUN.format(head="node1", port=port, job=job, logdir=logdir).split()]
        joined = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        deadline = time.monotonic() + 120
        while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
    out = (tmp_path / "job.out").read_text()
    phases = [(phase, len(rows)) for phase, rows in _phases(logdir)]
    # The job ends with its batch script's step: a joined step whose agent is still shutting down then is ended
    # by SLURM (exit 143) after the run's last checkpoint, written by all 4 ranks together (asserted below).
    ended_with_job = joined.returncode == 143 and "Job step aborted" in joined.stderr and "epoch 12/12" in out
    assert joined.returncode == 0 or ended_with_job, (f"phases {phases}\njob:\n{out[-3000:]}\njoined:\n"
                                                      + joined.stdout[-3000:] + joined.stderr[-3000:])
    assert "ChildFailedError" not in joined.stdout + joined.stderr
    assert re.search(r"\(restart attempt 1 of this job\): the world that wrote it had 2 node\(s\) and 4 "
                     rf"process\(es\), this one has 1 and 2: lost node \S+ \(agent pid {agents[lost][0]}\) with "
                     r"ranks \d-\d of 4", out), out[-4000:]
    both = out + joined.stdout + joined.stderr
    assert "this one has 2 and 4: joined node" in both and "requeueing SLURM job" not in both
    assert [phase.split("-")[1].split("x")[0] for phase, _ in _phases(logdir)] == ["4", "2", "4"]
    for epoch, ids in _trained(logdir).items():
        assert sorted(collections.Counter(ids).items()) == [(i, 1) for i in range(96)], epoch
    final = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))
    assert (final["meta"]["world_size"], final["loop"]["global_epoch_step"], final["loop"]["epoch_done"]) == (4, 12,
                                                                                                             True)
    state = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], env=env, capture_output=True, text=True)
    assert state.stdout.split()[:1] in ([], ["COMPLETED"]), state.stdout  # (sacct may not record, locally)
