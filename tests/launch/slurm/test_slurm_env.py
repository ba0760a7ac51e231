"""slurm_step / slurm_world / master_addr / master_port: env-dict units, then real srun steps."""
import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401
from torchstage.launch.slurm import step as slurm
from torchstage.launch.slurm.step import (SlurmConfigError, SlurmStep, master_addr, master_port, rank0_host,
                                          slurm_step, slurm_world)
from torchstage.launch.world import World


def step_env(procid=0, nodeid=0, localid=0, ntasks=4, nodes="node[1-2]", tpn="2(x2)", **extra):
    """What a task of ``srun -N 2 --ntasks-per-node=2`` sees (measured on the local cluster)."""
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": nodes, "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
           "SLURM_NTASKS": str(ntasks), "SLURM_TASKS_PER_NODE": tpn, "SLURM_STEP_ID": "0",
           "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": str(ntasks),
           "SLURM_STEP_TASKS_PER_NODE": tpn, "SLURM_PROCID": str(procid), "SLURM_NODEID": str(nodeid),
           "SLURM_LOCALID": str(localid)}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


# ---- slurm_step ---------------------------------------------------------------------------------
def test_step_from_env():
    assert slurm_step(step_env(procid=3, nodeid=1, localid=1)) == SlurmStep(
        job_id="77", step_id="0", procid=3, localid=1, nodeid=1, ntasks=4, nodes=("node1", "node2"),
        tasks_per_node=(2, 2))


@pytest.mark.parametrize("env", [
    {},                                                                   # a laptop
    {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]"},   # salloc shell
    step_env(SLURM_STEP_ID=None, SLURM_STEP_NODELIST=None, SLURM_STEP_NUM_TASKS=None),  # sbatch script
    step_env(SLURM_STEP_ID="batch"),
])
def test_not_a_step(env):
    assert slurm_step(env) is None


def test_interactive_pty_shell_is_not_a_step():
    env = step_env(SLURM_PTY_PORT="35735")
    assert slurm_step(env, controlling_tty=True) is None
    # a step started inside that shell inherits SLURM_PTY_PORT but its tasks have no terminal
    assert slurm_step(env, controlling_tty=False).ntasks == 4


def test_step_level_wins_over_job_level():
    env = step_env(ntasks=2, nodes="node2", tpn="2", SLURM_STEP_NUM_NODES="1", SLURM_JOB_NODELIST="node[1-2]",
                   SLURM_NTASKS="4", SLURM_TASKS_PER_NODE="2(x2)", SLURM_NNODES="2")
    step = slurm_step(env)
    assert (step.ntasks, step.nodes, step.tasks_per_node) == (2, ("node2",), (2,))


def test_job_level_fallbacks():
    env = step_env(procid=2, nodeid=1, localid=0, ntasks=3, tpn="2,1", SLURM_STEP_NODELIST=None,
                   SLURM_STEP_NUM_TASKS=None, SLURM_STEP_TASKS_PER_NODE=None, SLURM_STEP_NUM_NODES=None)
    step = slurm_step(env)
    assert (step.ntasks, step.nodes, step.tasks_per_node) == (3, ("node1", "node2"), (2, 1))


@pytest.mark.parametrize("change, match", [
    ({"SLURM_STEP_NUM_TASKS": "5"}, "add up to 4, not 5"),
    ({"SLURM_STEP_NUM_NODES": "3"}, "2 node names but 3 nodes"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "3 task counts for 2 nodes"),
    ({"SLURM_PROCID": "4"}, "outside the step"),
    ({"SLURM_LOCALID": "2"}, "local id 2"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
    ({"SLURM_STEP_NODELIST": "node[2-1]"}, "SLURM_STEP_NODELIST: invalid hostlist"),
])
def test_inconsistent_step_raises(change, match):
    with pytest.raises(SlurmConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        slurm_step(step_env(**change))


# ---- slurm_world --------------------------------------------------------------------------------
def test_one_task_per_device():
    step = slurm_step(step_env(procid=3, nodeid=1, localid=1))
    for devices in (0, 1, 2):
        assert slurm_world(step, devices) == World(rank=3, world_size=4, local_rank=1, local_size=2,
                                                   node_rank=1, nnodes=2, spawn=0, source="slurm")


def test_one_task_per_node_spawns_per_device():
    step = slurm_step(step_env(procid=1, nodeid=1, ntasks=2, tpn="1(x2)"))
    world = slurm_world(step, 4)
    assert (world.spawn, world.rank, world.world_size, world.node_rank) == (4, 4, 8, 1)
    assert [slurm_world(step, 4).child(i).rank for i in range(4)] == [4, 5, 6, 7]
    assert world.child(3).local_rank == 3 and world.child(3).spawn == 0
    with pytest.raises(ValueError):
        world.child(4)


def test_uneven_cpu_layout_is_fine():
    step = slurm_step(step_env(procid=2, nodeid=1, ntasks=3, tpn="2,1"))
    assert slurm_world(step, 0) == World(rank=2, world_size=3, local_rank=0, local_size=1, node_rank=1,
                                         nnodes=2, spawn=0, source="slurm")


@pytest.mark.parametrize("tpn, ntasks, devices, match", [
    ("2(x2)", 4, 4, r"tasks per node 2,2 on 2 node\(s\).*cannot use 4 local devices.*"
                    r"--ntasks-per-node=1 .*--ntasks-per-node=4"),
    ("2,1", 3, 2, r"uneven tasks per node 2,1 .*cannot use 2 local devices"),
    ("1,2", 3, 2, r"uneven tasks per node 1,2"),
])
def test_bad_layouts_raise(tpn, ntasks, devices, match):
    step = slurm_step(step_env(ntasks=ntasks, tpn=tpn))
    with pytest.raises(SlurmConfigError, match=match):
        slurm_world(step, devices)


# ---- master address and port ---------------------------------------------------------------------
def test_rank0_host_follows_slurm_order_not_string_sort():
    step = slurm_step(step_env(nodes="gpu[9-10]", tpn="1,3"))
    assert sorted(step.nodes)[0] == "gpu10"
    assert rank0_host(step, {}) == "gpu9"
    step = slurm_step(step_env(nodes="b1,a1", tpn="1,3"))  # a --distribution=arbitrary hostfile order
    assert rank0_host(step, {}) == "b1"
    with pytest.raises(SlurmConfigError, match="arbitrary.*MASTER_ADDR"):
        rank0_host(step, {"SLURM_DISTRIBUTION": "arbitrary"})


def test_master_addr_override_and_unresolvable(monkeypatch):
    step = slurm_step(step_env(nodes="no-such-host-x[1-2]"))
    assert master_addr(step, {"MASTER_ADDR": "10.1.2.3"}) == "10.1.2.3"
    monkeypatch.setattr(slurm, "scontrol_node_addr", lambda host: None)
    with pytest.raises(SlurmConfigError, match="no-such-host-x1.*set MASTER_ADDR"):
        master_addr(step, {})


def test_master_port_rules():
    ports = [master_port(j, {}, ephemeral=(32768, 60999)) for j in range(100000, 100050)]
    assert all(15000 <= p < 30000 for p in ports)
    assert len(set(ports)) == len(ports)
    assert ports == [master_port(j, {}, ephemeral=(32768, 60999)) for j in range(100000, 100050)]
    assert master_port(str(123), {}) == master_port(123, {})
    lo, hi = slurm.ephemeral_port_range()
    assert not lo <= master_port(42, {}) <= hi
    # a wide ephemeral range covering the window: fall back to ports outside it
    wide = [master_port(j, {}, ephemeral=(10000, 60999)) for j in range(7, 12)]
    assert all(not 10000 <= p <= 60999 for p in wide) and len(set(wide)) == 5
    narrow = [master_port(j, {}, ephemeral=(20000, 25000)) for j in range(0, 15000)]
    assert not any(20000 <= p <= 25000 for p in narrow)
    assert master_port(5, {"MASTER_PORT": "29500"}) == 29500
    for bad in ("0", "70000", "abc"):
        with pytest.raises(SlurmConfigError, match="MASTER_PORT"):
            master_port(5, {"MASTER_PORT": bad})
    with pytest.raises(SlurmConfigError, match="job id"):
        master_port("12_3", {})


# ---- on the real cluster ----------------------------------------------------------------------------
PROBE = """
import json, os, sys
from torchstage.launch.slurm.step import slurm_step, slurm_world, master_addr, master_port
step = slurm_step()
devices = int(sys.argv[1]) if len(sys.argv) > 1 else 0
out = {"procid": os.environ.get("SLURM_PROCID"), "host": os.environ.get("SLURMD_NODENAME"), "step": step is not None}
if step is not None:
    try:
        out.update(vars(slurm_world(step, devices)), addr=master_addr(step), port=master_port(step.job_id),
                   job=step.job_id)
    except ValueError as e:
        out["error"] = str(e)
print("PROBE" + json.dumps(out), flush=True)
"""


def probe(env, *srun_args, devices=0, check=True):
    res = subprocess.run(["srun", *srun_args, sys.executable, "-c", PROBE, str(devices)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 or not check, res.stderr
    rows = [json.loads(line[5:]) for line in res.stdout.splitlines() if line.startswith("PROBE")]
    return sorted(rows, key=lambda r: int(r["procid"]))


def test_srun_two_tasks_per_node(slurm_cluster):
    rows = probe(slurm_cluster, "-N", "2", "--ntasks-per-node=2")
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    assert {r["world_size"] for r in rows} == {4} and {r["spawn"] for r in rows} == {0}
    assert [r["local_rank"] for r in rows] == [0, 1, 0, 1]
    assert [r["node_rank"] for r in rows] == [0, 0, 1, 1]
    assert [r["host"] for r in rows] == ["node1", "node1", "node2", "node2"]
    assert {r["addr"] for r in rows} == {socket.gethostbyname("node1")} == {"127.0.0.1"}
    assert len({r["port"] for r in rows}) == 1


def test_srun_one_task_per_node_spawns(slurm_cluster):
    rows = probe(slurm_cluster, "-N", "2", devices=2)
    assert [(r["rank"], r["world_size"], r["spawn"], r["node_rank"]) for r in rows] == [(0, 4, 2, 0), (2, 4, 2, 1)]


def test_srun_bad_layout_errors_on_every_task(slurm_cluster):
    rows = probe(slurm_cluster, "-N", "2", "-n", "3", devices=2)
    assert len(rows) == 3 and all("uneven tasks per node 2,1" in r["error"] for r in rows)


def test_srun_arbitrary_distribution_puts_rank0_elsewhere(slurm_cluster, tmp_path):
    (tmp_path / "hosts").write_text("node2\nnode1\nnode1\n")
    env = dict(slurm_cluster, SLURM_HOSTFILE=str(tmp_path / "hosts"))
    rows = probe(env, "-m", "arbitrary", "-n", "3")
    assert rows[0]["host"] == "node2"
    assert all("arbitrary" in r["error"] and "MASTER_ADDR" in r["error"] for r in rows)
    rows = probe(dict(env, MASTER_ADDR="127.0.0.1"), "-m", "arbitrary", "-n", "3")
    assert [r["rank"] for r in rows] == [0, 1, 2] and rows[0]["addr"] == "127.0.0.1"


def test_master_addr_via_scontrol_node_addr(slurm_cluster, monkeypatch):
    real = socket.gethostbyname
    monkeypatch.setattr(socket, "gethostbyname", lambda h: real(h) if h[0].isdigit() else _raise(h))
    monkeypatch.setenv("SLURM_CONF", slurm_cluster["SLURM_CONF"])
    step = slurm_step(step_env())
    assert master_addr(step, {}) == "127.0.0.1"  # node1's NodeAddr


def _raise(host):
    raise socket.gaierror(f"{host} not resolvable in this test")


def run_in_pty(argv, env, timeout=30):
    """Run ``argv`` as a session leader on a new pseudo terminal (as from a login shell); output text."""
    pid, fd = pty.fork()
    if pid == 0:  # child
        try:
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the terminal closed
                break
            if not chunk:
                break
            out += chunk
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    return out.decode(errors="replace")


def test_srun_pty_shell_is_single_process_but_nested_step_is_not(slurm_cluster):
    shell = (f"{sys.executable} -c '{PROBE}'; "
             f"srun --overlap -N 2 -n 2 {sys.executable} -c '{PROBE}'")
    assert "'" not in PROBE
    out = run_in_pty(["srun", "-N", "2", "--ntasks-per-node=2", "--pty", "bash", "-c", shell], slurm_cluster)
    rows = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("PROBE")]
    assert len(rows) == 3, out
    assert rows[0]["step"] is False  # the interactive shell: SLURM_STEP_NUM_TASKS=4, yet one process
    assert sorted(r["rank"] for r in rows[1:]) == [0, 1] and rows[1]["world_size"] == 2
