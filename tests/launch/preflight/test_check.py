"""The pre-flight check across real worlds: torchrun, mpirun and torchstage's own launcher; alike ranks agree (exit 0),
a rank that shares its core with a busy process at a lower priority is named (exit 1); ``train(preflight=True)``
trains after a check that agrees and stops every rank before training, with the table, after one that does not.

Every rank is pinned to CPU 0 (``PIN=0``): ranks that share one core get even turns on it, where ranks spread over
cores with other work get uneven ones (see docs/slow-ranks.md). Ranks meant to be alike also run at a raised
priority (``EVEN``: ``NICE=-10``), so that other work on the machine (which the kernel moves onto their core whenever
they wait in a collective) cannot take some of their turns and not others'. The slowed rank is niced in its own
session (``NICE_RANK<k>``) and a busy process shares the core, so it gets a fraction of the others' time; the two
others are compared with the median of a fast and a slow rank, which other work cannot bring them 20 % under.
"""
import json
import subprocess
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, busy_core, script_env
from tests.launch.test_mpi_launch import launcher

SCRIPTS = ROOT / "tests" / "launch" / "preflight" / "scripts"
EVEN = {"PIN": 0, "NICE": -10}  # every rank on one core, above whatever else runs here (see slow_down.py)
pytestmark = [pytest.mark.distributed, pytest.mark.alone, pytest.mark.timeout(300)]  # compares speeds


def run(command, timeout=200, **env):
    return script_server.run(command, env=script_env(**env), cwd=ROOT, timeout=timeout)


@pytest.fixture
def busy_core_0():
    """A busy process on CPU 0 in a session of its own (a neighbour's job), stopped by its pid after the test."""
    with busy_core(0) as proc:
        yield proc


def torchrun(nproc, *options, **env):
    return run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                str(SCRIPTS / "slowed_preflight.py"), *options], **env)


def test_alike_ranks_under_torchrun_agree_and_exit_0():
    result = torchrun(3, "--json", **EVEN)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("{")]  # rank 0 prints, alone
    report = json.loads(line)
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2] and report["outliers"] == [] and report["exit_code"] == 0
    for rank in report["ranks"]:
        assert len(rank["matmul"]) == len(rank["memory"]) == 5 and min(rank["matmul"]) > 0
        assert sorted(map(int, rank["links"])) == sorted({0, 1, 2} - {rank["rank"]})  # it met both others
    assert report["all_reduce_gbps"] > 0 and report["exclude"] == []


def test_a_rank_sharing_its_core_with_a_busy_process_is_named_and_exits_1(busy_core_0):
    result = torchrun(3, PIN=0, NICE_RANK2=5)
    out = result.stdout
    assert result.returncode != 0, out
    assert out.splitlines()[0].startswith("node ") and out.count("node ") == 1  # one host, one table
    assert "rank 2 on " in out and "rank 0 on " not in out and "rank 1 on " not in out, out
    assert "outliers (20% or more below the median of the other ranks, marked *):" in out
    assert "--exclude" not in out and "slow host" not in out  # the only host is not slower than itself
    assert "every rank runs on " in out


def test_the_command_under_its_own_launcher_ends_with_its_result_not_a_stopped_run(busy_core_0):
    """``torchstage preflight --nprocs`` trains nothing: its last line is the check's result, not "the run stopped
    gracefully ... before training" nor "not restarted"; the only host is not named slow."""
    result = run([sys.executable, str(SCRIPTS / "slowed_preflight.py"), "--nprocs", "3"], PIN=0, NICE_RANK2=5)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert out.rstrip().splitlines()[-1] == "torchstage preflight: the check found slow rank 2 on " \
        f"{out.split('node ', 1)[1].split(' ', 1)[0]}; exit code 1", out[-3000:]
    assert "stopped gracefully" not in out and "before training" not in out and "restart" not in out
    assert "slow host" not in out


def test_alike_ranks_under_mpirun_agree():
    result = run([*launcher("openmpi"), "2", sys.executable, str(SCRIPTS / "slowed_preflight.py")], **EVEN)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all 2 ranks agree" in result.stdout and result.stdout.count("node ") == 1


def test_the_local_launcher_starts_the_ranks_and_prints_one_table():
    result = run(["taskset", "-c", "0", sys.executable, "-m", "torchstage", "preflight", "--nprocs", "2",
                  "--repeats", "3"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[rank0]: all 2 ranks agree" in result.stdout and "[rank1]" not in result.stdout
    assert "processes per CPU: they take turns on the cores" in result.stdout  # 2 ranks on one CPU


def test_a_world_that_cannot_form_exits_2_with_one_line():
    from tests.helpers import free_port
    result = run([sys.executable, "-m", "torchstage", "preflight", "--timeout", "3"], RANK=0, WORLD_SIZE=2,
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())  # rank 1 never comes
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("torchstage preflight: error: cannot run the check: ") and \
        result.stderr.count("\n") == 1, result.stderr
    result = run([sys.executable, "-m", "torchstage", "preflight"], RANK=0, WORLD_SIZE=2)
    assert result.returncode == 2 and "MASTER_ADDR/MASTER_PORT are not" in result.stderr


def test_bad_options_and_a_single_process():
    result = run([sys.executable, "-m", "torchstage", "preflight", "--threshold", "1.5"])
    assert result.returncode == 2 and "--threshold must be a share between 0 and 1, got 1.5" in result.stderr
    result = run([sys.executable, "-m", "torchstage", "preflight", "--repeats", "1", "--seconds", "0.05"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("one process: nothing to compare (start it under srun, torchrun or "
                                           "mpirun, or with --nprocs N)")


def test_train_with_preflight_trains_when_the_ranks_agree(tmp_path):
    result = run([sys.executable, str(SCRIPTS / "preflight_train.py"), tmp_path], TORCHSTAGE_NPROC=2, **EVEN)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {p.name for p in tmp_path.glob("trained-rank*")} == {"trained-rank0", "trained-rank1"}
    assert (tmp_path / "checkpoints" / "last.pth").exists()


def test_train_with_preflight_stops_every_rank_before_training_when_one_is_slow(tmp_path, busy_core_0):
    result = run([sys.executable, str(SCRIPTS / "preflight_train.py"), tmp_path], TORCHSTAGE_NPROC=3, PIN=0,
                 NICE_RANK1=5)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "pre-flight check:" in output and "rank 1 on " in output and "rank 0 on " not in output, output[-3000:]
    assert "the run stopped gracefully (the pre-flight check found slow rank 1 on " in output
    assert "before training; exit code 1" in output
    assert "Traceback" not in output  # an outcome, not a crash
    assert not list(tmp_path.glob("trained-rank*")) and not (tmp_path / "checkpoints").exists()


def test_preflight_must_be_a_bool():
    from tests.helpers import tiny_run
    with pytest.raises(TypeError, match=r"preflight must be True \(check every rank's matmul, memory and link speed "
                                        r"before the first epoch, and stop if one is slow\) or False, got 'yes'"):
        tiny_run(preflight="yes")
