"""``torchstage report`` from real 1- and 2-process runs of scripts/observability.py: the table equals the logs."""
import csv
import json
import os
import re

import pytest

from tests.helpers import ROOT, run, straggler_logdir
from torchstage.cli import main

SCRIPT = ROOT / "scripts" / "observability.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("scaling")
    for nproc in (1, 2):
        result = run([SCRIPT, base / f"ws{nproc}", "--nproc", nproc, "--epochs", 2], nproc=nproc, timeout=400)
        assert result.returncode == 0, result.stdout + result.stderr
    return base


def rows_of(path):
    return list(csv.DictReader(open(path)))


def expected(logdir):
    """Epoch 2 (epoch 1 is warm-up and left out): epoch time over both loaders, train throughput and data wait."""
    train = [r for r in rows_of(logdir / "logs" / "train.csv") if r["global_epoch"] == "2"][0]
    valid = [r for r in rows_of(logdir / "logs" / "valid.csv") if r["global_epoch"] == "2"][0]
    return {"epoch_time": float(train["time_s"]) + float(valid["time_s"]),
            "throughput": float(train["samples_per_s"]), "data_wait": float(train["data_wait"])}


@pytest.mark.distributed
def test_table_matches_the_logs(runs, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(runs / "ws2"), str(runs / "ws1"), "-o", str(out)]) == 0
    # the 2-process run also gets its ranks side by side (the straggler detector's figures)
    assert capsys.readouterr().out == f"wrote {out / 'report.md'}\nwrote {out / 'report.png'}\n" \
                                      f"wrote {out / 'ranks-ws2.png'}\n"
    assert "## Ranks of `" in (out / "report.md").read_text() and "No straggler was named." in \
        (out / "report.md").read_text()
    scaling = (out / "report.md").read_text().split("## Ranks of")[0]  # the ranks' tables follow
    lines = [line for line in scaling.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[1:]]
    assert [row["world size"] for row in table] == ["1", "2"]
    one, two = expected(runs / "ws1"), expected(runs / "ws2")
    for row, figures in zip(table, (one, two)):
        assert float(row["epoch time (s)"]) == pytest.approx(figures["epoch_time"], abs=5e-4)
        assert float(row["train samples/s"]) == pytest.approx(figures["throughput"], abs=0.05)
        assert float(row["data wait"].rstrip("%")) == pytest.approx(100 * figures["data_wait"], abs=0.05)
        assert row["epochs averaged"] == "1"
    speedup = one["epoch_time"] / two["epoch_time"]
    assert float(table[1]["speedup"]) == pytest.approx(speedup, abs=5e-3)
    assert float(table[1]["efficiency"].rstrip("%")) == pytest.approx(100 * speedup / 2, abs=0.5)
    assert (table[0]["speedup"], table[0]["efficiency"]) == ("1.00", "100%")
    from matplotlib.image import imread
    assert imread(out / "report.png").shape[:2] == (700, 1300)


@pytest.mark.distributed
def test_the_example_writes_every_view(runs):
    logdir = runs / "ws2"
    assert json.load(open(logdir / "logs" / "hparams.json"))["world_size"] == 2
    assert (logdir / "model_summary.txt").read_text().startswith("model:\n")
    for rank in (0, 1):
        traces = [n for n in os.listdir(logdir / "profiler" / f"rank-{rank}") if n.endswith(".pt.trace.json")]
        assert len(traces) == 1
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{logdir}/mlflow.db")
    (only,) = client.search_runs([client.get_experiment_by_name("observability").experiment_id])
    assert only.info.run_name == "ws2" and only.data.tags["world_size"] == "2"
    assert {a.path for a in client.list_artifacts(only.info.run_id, "profiler")} >= {"profiler/top_ops.txt"}


def test_a_run_without_monitor_figures_exits_1(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.csv").write_text("stage,epoch,global_epoch,loss\nmain,1,1,0.5\n")
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "out")]) == 1
    assert "has no throughput figures in logs/train.csv; run it with train(monitor=True)" in capsys.readouterr().err


def _fake_run(folder, world_size, threads, epoch_time):
    """A logdir with the figures ``torchstage report`` reads: two epochs of monitor rows and hparams.json."""
    (folder / "logs").mkdir(parents=True)
    rows = "".join(f"main,{e},{e},{epoch_time},{1000 / epoch_time},0.01,0\n" for e in (1, 2))
    (folder / "logs" / "train.csv").write_text("stage,epoch,global_epoch,time_s,samples_per_s,data_wait,"
                                               "peak_memory_mb\n" + rows)
    (folder / "logs" / "hparams.json").write_text(json.dumps({"world_size": world_size,
                                                              "threads_per_process": threads}))
    return str(folder)


def test_runs_with_other_threads_per_process_are_reported_as_unlike(tmp_path, capsys):
    """One process with 2 threads against 2 processes with 1 each: the report says what differs."""
    one, two = _fake_run(tmp_path / "ws1", 1, 2, 2.0), _fake_run(tmp_path / "ws2", 2, 1, 1.05)
    assert main(["report", one, two, "-o", str(tmp_path / "out")]) == 0
    caveat = ("the runs differ in torch threads per process (world size 1: 2, world size 2: 1), so speedup and "
              "efficiency compare unlike runs; run each with the same OMP_NUM_THREADS")
    assert caveat in capsys.readouterr().err
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"**Not like with like:** {caveat}" in text and " threads/process |" in text
    same = _fake_run(tmp_path / "ws1b", 1, 1, 2.0)
    assert main(["report", same, two, "-o", str(tmp_path / "out2")]) == 0
    assert "unlike" not in capsys.readouterr().err and "Not like with like" not in (tmp_path / "out2" / "report.md").read_text()


def test_the_ranks_of_a_run_side_by_side_with_its_episode_and_its_cost(tmp_path, capsys):
    run = straggler_logdir(tmp_path / "slow")
    assert main(["report", run, "-o", str(tmp_path / "out")]) == 0  # no monitor figures: the ranks alone
    assert capsys.readouterr().out == f"wrote {tmp_path / 'out' / 'report.md'}\nwrote {tmp_path / 'out' / 'ranks-slow.png'}\n"
    text = (tmp_path / "out" / "report.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if re.match(r"\| \d \|", line)}
    # median over 5 epochs; worst epoch: 20 ms over the median of the others in a 32 ms step (median of 31, 31, 33)
    assert rows["2"] == "| 2 | node2 | 0 | 10.00 | 1.00 | 2.00 | 2 (compute, 65% of the step) | 1 | 4.0 |"
    assert rows["0"].startswith("| 0 | node1 | 0 | 10.00 | 1.00 | 2.00 | - | 0 | 0.0 |")
    assert "- rank 2 (host node2, local rank 0) slow in compute from " in text
    assert "(stage 'main', epoch 2, global batch 100) to " in text and "(epoch 4, global batch 300), recovered" in text
    # 200 batches slow by 20 ms: every rank waited 4 s
    assert "at worst 62% of the job's time; about 4.0 s of it lost over 26.0 s" in text
    from matplotlib.image import imread
    assert imread(tmp_path / "out" / "ranks-slow.png").shape[:2] == (450, 1200)
