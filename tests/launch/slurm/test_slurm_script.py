"""sbatch script generation, YAML options, the `torchstage slurm` subcommand, a real sbatch --wait."""
import argparse
import re
import sys
import time

import pytest

from tests.helpers import ROOT
from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401
from torchstage.commands.slurm import add_parser as add_slurm_parser
from torchstage.commands.slurm import run_slurm_command
from torchstage.launch.slurm.sbatch import (SbatchOptions, SlurmScriptError, build_sbatch_script, load_sbatch_options,
                                     options_from_dict)


def parse(argv):
    parser = argparse.ArgumentParser(prog="torchstage")
    add_slurm_parser(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["slurm", *argv])


def test_script_directives_and_srun_line():
    text = build_sbatch_script(SbatchOptions(
        ["python", "train.py", "--lr", "0.1 x"], job_name="exp1", nodes=2, ntasks_per_node=4, gpus_per_node=4,
        cpus_per_task=8, partition="gpu", account="proj", time="1-02:00:00", output="logs/%x-%j.out",
        modules=["cuda/12.1", "nccl"], setup="source venv/bin/activate", signal="USR1@120", requeue=True))
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for d in ["--job-name=exp1", "--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--cpus-per-task=8",
              "--partition=gpu", "--account=proj", "--time=1-02:00:00", "--output=logs/%x-%j.out",
              "--signal=USR1@120", "--requeue", "--open-mode=append"]:
        assert f"#SBATCH {d}" in lines
    assert lines.index("module load cuda/12.1") < lines.index("source venv/bin/activate") < len(lines) - 1
    assert lines[-1] == "srun --kill-on-bad-exit=1 --cpus-per-task=8 python train.py --lr '0.1 x'"
    assert max(i for i, x in enumerate(lines) if x.startswith("#SBATCH")) < lines.index("set -eo pipefail")


def test_minimal_script_has_no_optional_directives():
    text = build_sbatch_script(SbatchOptions("python train.py"))
    assert re.findall(r"#SBATCH --([\w-]+)", text) == ["job-name", "nodes", "ntasks-per-node"]
    assert text.endswith("srun --kill-on-bad-exit=1 python train.py\n")


@pytest.mark.parametrize("kwargs, match", [
    (dict(nodes=0), "nodes: expected a positive integer, got 0"),
    (dict(ntasks_per_node="2"), "ntasks_per_node: expected a positive integer, got '2'"),
    (dict(time="2 hours"), "time: expected one word"),
    (dict(time="2h"), "time: expected MM, HH:MM:SS"),
    (dict(time=43200), "quote it in YAML"),
    (dict(signal="B:USR1@120"), "only the batch shell.*'USR1@120'"),
    (dict(signal="usr1"), "signal: expected SIGNAL@SECONDS"),
    (dict(job_name="a\n#SBATCH --x"), "job_name"),
    (dict(modules="cuda"), "modules: expected a list"),
    (dict(command=""), "command"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(SlurmScriptError, match=match):
        SbatchOptions(**{"command": "python t.py", **kwargs})


def test_yaml_options_and_unknown_key(tmp_path):
    cfg = tmp_path / "job.yml"
    cfg.write_text("job-name: yaml-job\nnodes: 2\nmodules: [cuda]\ncommand: python train.py -C cfg.yml\n")
    opts = load_sbatch_options(str(cfg), nodes=3, time=None)
    assert (opts.job_name, opts.nodes, opts.modules, opts.time) == ("yaml-job", 3, ["cuda"], None)
    cfg.write_text("nodez: 2\ncommand: x\n")
    with pytest.raises(SlurmScriptError, match=f"{re.escape(str(cfg))}: unknown key 'nodez'"):
        load_sbatch_options(str(cfg))
    cfg.write_text("nodes: two\ncommand: x\n")
    with pytest.raises(SlurmScriptError, match="nodes: expected a positive integer, got 'two'"):
        load_sbatch_options(str(cfg))
    with pytest.raises(SlurmScriptError, match="no command"):
        options_from_dict({"nodes": 1})
    with pytest.raises(SlurmScriptError, match="cannot read"):
        load_sbatch_options(str(tmp_path / "missing.yml"))


def test_cli_prints_saves_and_reports_errors(tmp_path, capsys):
    assert run_slurm_command(parse(["--nodes", "2", "--module", "a", "--module", "b", "--", "python", "t.py"])) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in out and "module load a\nmodule load b" in out
    assert out.endswith("srun --kill-on-bad-exit=1 python t.py\n")
    cfg = tmp_path / "c.yml"
    cfg.write_text("nodes: 2\ntime: '10'\ncommand: python a.py\n")
    path = tmp_path / "job.sbatch"
    assert run_slurm_command(parse(["--config", str(cfg), "--nodes", "1", "--save", str(path)])) == 0
    text = path.read_text()
    assert "#SBATCH --nodes=1" in text and "#SBATCH --time=10" in text and "python a.py" in text
    assert capsys.readouterr().out == ""
    assert run_slurm_command(parse(["--nodes", "0", "--", "x"])) == 2
    assert "torchstage slurm: error: " in capsys.readouterr().err
    assert run_slurm_command(parse(["--nodes", "1"])) == 2
    assert "no command" in capsys.readouterr().err


def test_cli_submit_without_sbatch(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert run_slurm_command(parse(["--submit", "--", "true"])) == 2
    assert "sbatch not found" in capsys.readouterr().err


def test_submit_waits_on_real_cluster(slurm_cluster, tmp_path, monkeypatch, capsys):
    for k, v in slurm_cluster.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "job-%j.out"
    code = "import os; print('rank', os.environ['SLURM_PROCID'], os.environ['SLURMD_NODENAME'])"
    args = parse(["--job-name", "ts-test", "--nodes", "2", "--output", str(out), "--time", "1",
                  "--save", str(tmp_path / "job.sbatch"), "--submit", "--wait", "--", sys.executable, "-c", code])
    assert run_slurm_command(args) == 0
    job_id = capsys.readouterr().out.strip()
    assert job_id.isdigit()
    lines = sorted((tmp_path / f"job-{job_id}.out").read_text().split("\n"))
    assert [x for x in lines if x] == ["rank 0 node1", "rank 1 node2"]


@pytest.mark.waits  # how fast the job ends
def test_submit_from_stdin_failing_task_ends_job(slurm_cluster, tmp_path, monkeypatch, capsys):
    """No --save: the script goes to sbatch on stdin. Task 1 fails once task 0 runs, and --kill-on-bad-exit ends task
    0's sleep: the job ends within seconds of the failure (sbatch --wait polls every 8 s here), not after the sleep.

    Timed from the failure, not from the submission: how long the job waits for its nodes and its tasks take to
    start on a loaded machine is the scheduler's, not what this is about (and task 1 failing while task 0 is still
    being launched is a race of SLURM's own, whose kill then waits KillWait, 30 s, to reach it: CI once took 32 s)."""
    for k, v in slurm_cluster.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    task = ("if [ $SLURM_PROCID = 1 ]; then until [ -e running ]; do sleep 0.1; done; date +'failing at %s.%N';"
            " exit 5; fi; touch running; exec sleep 60")
    args = parse(["--nodes", "2", "--output", str(tmp_path / "fail.out"), "--submit", "--wait", "--",
                  "bash", "-c", task])
    start = time.time()
    assert run_slurm_command(args) != 0
    ended = time.time()
    assert capsys.readouterr().out.strip().isdigit()
    out = (tmp_path / "fail.out").read_text()
    assert "task 1: Exited with exit code 5" in out, out
    failed = float(re.search(r"failing at ([0-9.]+)", out)[1])
    assert start < failed < ended and ended - failed < 20, (f"submitted, task 1 failed, job ended at +0, "
                                                           f"+{failed - start:.1f}, +{ended - start:.1f} s\n{out}")


SITE = dict(nodes=2, gpus_per_node=None, gres="gpu:a100:4", partition="gpu", account="proj", qos="high",
            constraint="a100&ib", mail_type="END,FAIL", mail_user="me@example.org", sbatch=["--exclusive", "--mem=0"],
            modules=["cuda/12.1"], setup=["source venv/bin/activate", "export NCCL_DEBUG=WARN"], signal="USR1@90",
            requeue=True, cpus_per_task=4)


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_every_site_line_from_options_and_both_launcher_forms_pass_bash_n(launcher, tmp_path):
    import subprocess
    extra = {"nproc_per_node": 4} if launcher == "torchrun" else {"ntasks_per_node": 4}
    text = build_sbatch_script(SbatchOptions("python train.py --lr 0.1", launcher=launcher, **SITE, **extra))
    lines = text.splitlines()
    for d in ["--gres=gpu:a100:4", "--partition=gpu", "--account=proj", "--qos=high", "--constraint=a100&ib",
              "--mail-type=END,FAIL", "--mail-user=me@example.org", "--exclusive", "--mem=0", "--signal=USR1@90"]:
        assert f"#SBATCH {d}" in lines
    assert "source venv/bin/activate\nexport NCCL_DEBUG=WARN" in text and "module load cuda/12.1" in lines
    if launcher == "torchrun":
        assert "#SBATCH --ntasks-per-node=1" in lines
        assert lines[-1].startswith("srun --kill-on-bad-exit=1 --cpus-per-task=4 --ntasks-per-node=1 torchrun "
                                    '--nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=4 --rdzv-id="$SLURM_JOB_ID" '
                                    '--rdzv-backend=c10d --rdzv-endpoint="$head_node:$rdzv_port" --no-python ')
        assert lines[-1].endswith(" python train.py --lr 0.1")
    else:
        assert lines[-1] == "srun --kill-on-bad-exit=1 --cpus-per-task=4 python train.py --lr 0.1"
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("kwargs, match", [
    (dict(gres="gpu:4", gpus_per_node=4), "give one of them"),
    (dict(launcher="mpirun"), "launcher: expected 'srun' or 'torchrun', got 'mpirun'"),
    (dict(launcher="torchrun", ntasks_per_node=4), "ntasks_per_node=4 with launcher='torchrun'"),
    (dict(nproc_per_node=4), "nproc_per_node=4 is for launcher='torchrun'"),
    (dict(sbatch=["exclusive"]), r"sbatch: expected a list of directives such as \['--exclusive'"),
    (dict(qos="a b"), "qos: expected one word"),
])
def test_bad_site_options(kwargs, match):
    with pytest.raises(SlurmScriptError, match=match):
        SbatchOptions(**{"command": "python t.py", **kwargs})


def test_cli_site_flags_and_dry_run_print_without_submitting(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")  # a submission would fail: sbatch is not on PATH
    argv = ["--launcher", "torchrun", "--nodes", "2", "--gpus-per-node", "2", "--qos", "q", "--constraint", "c",
            "--mail-type", "FAIL", "--mail-user", "u@x", "--sbatch=--exclusive", "--setup", "a=1", "--setup", "b=2",
            "--dry-run", "--submit", "--", "python", "t.py"]
    assert run_slurm_command(parse(argv)) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --qos=q" in out and "#SBATCH --exclusive" in out and "a=1\nb=2" in out
    assert "--nproc-per-node=2" in out and out.endswith("--no-python python t.py\n")


def test_yaml_site_options(tmp_path):
    cfg = tmp_path / "job.yml"
    cfg.write_text("launcher: torchrun\nnodes: 2\nnproc-per-node: 3\nqos: long\nsbatch: [--exclusive]\n"
                   "setup: [module purge, source env.sh]\ncommand: python train.py\n")
    text = build_sbatch_script(load_sbatch_options(str(cfg)))
    assert "#SBATCH --qos=long" in text and "module purge\nsource env.sh" in text and "--nproc-per-node=3" in text


def test_docs_torchrun_job_example_builds_and_passes_bash_n(tmp_path):
    import os
    import subprocess
    path = os.path.join(ROOT, "scripts", "slurm_job_torchrun.yml")
    text = build_sbatch_script(load_sbatch_options(path))
    assert "#SBATCH --gres=gpu:4" in text and "#SBATCH --qos=normal" in text and "#SBATCH --exclusive" in text
    assert "--nproc-per-node=4" in text and "source .venv/bin/activate\nexport OMP_NUM_THREADS=8" in text
    (tmp_path / "job.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0


def test_tasks_that_split_a_nodes_gpus_unevenly_are_refused_with_both_layouts_that_work():
    with pytest.raises(SlurmScriptError, match=r"ntasks_per_node=2 with gpus_per_node=4: .*ntasks_per_node=4 "
                                               r"\(one task per GPU\) or 1"):
        SbatchOptions("python train.py", gpus_per_node=4, ntasks_per_node=2)
    args = parse(["--gpus-per-node", "4", "--ntasks-per-node", "2", "--", "python", "train.py"])
    assert run_slurm_command(args) != 0
    for tasks in (1, 4):  # one task per node (spawning per GPU) or one per GPU
        assert f"--ntasks-per-node={tasks}" in build_sbatch_script(
            SbatchOptions("python train.py", gpus_per_node=4, ntasks_per_node=tasks))


def test_requeue_without_a_signal_gets_the_warning_that_lets_the_run_checkpoint():
    lines = build_sbatch_script(SbatchOptions("python train.py", requeue=True)).splitlines()
    assert "#SBATCH --signal=USR1@120" in lines and "#SBATCH --requeue" in lines
    lines = build_sbatch_script(SbatchOptions("python train.py", requeue=True, signal="USR2@300")).splitlines()
    assert [line for line in lines if "--signal" in line] == ["#SBATCH --signal=USR2@300"]
    assert not any("--signal" in line for line in build_sbatch_script(SbatchOptions("python train.py")).splitlines())
