"""Six faults of one rank among 4 real gloo processes (hang_timeout=30): each ends the job non-zero, fast, and the
launcher's summary names the rank, where it was and, for collectives, the collective and its call site."""
from pathlib import Path
import json
import os
import sys
import time

import pytest

from tests import script_server
from tests.helpers import ROOT, alive, run

pytestmark = [pytest.mark.distributed, pytest.mark.waits]  # how fast a fault ends the job

SCRIPTS = Path(__file__).resolve().parent / "scripts"

FAULTS = SCRIPTS / "faults.py"
SOURCE = FAULTS.read_text().splitlines()


def line_of(marker: str) -> str:
    """``faults.py:N`` of the script line holding ``marker``."""
    return f"faults.py:{next(n for n, text in enumerate(SOURCE, 1) if marker in text)}"


def faulty_run(logdir, fault, **env):
    result = run([FAULTS, logdir], nproc=4, timeout=240, FAULT=fault, HANG_TIMEOUT=15, **env)
    ended = time.time()
    out = result.stdout + result.stderr
    summary = "\n".join(line for line in out.splitlines() if not line.startswith("[rank"))  # the launcher's own
    took = ended - float((logdir / "fault-at").read_text())
    pids = [int((logdir / f"started-{rank}").read_text()) for rank in range(4)]
    deadline = time.monotonic() + 5
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, pids)), out
    return result.returncode, out, summary, took


@pytest.mark.timeout(300)
def test_an_extra_collective_on_one_rank_is_named_with_its_call_site(tmp_path):
    code, out, summary, took = faulty_run(tmp_path, "extra_collective")
    assert code != 0 and took < 90, out
    # gloo aborts the rank that received more bytes than its extra all_reduce expected: its fault handler's stack
    # names the collective and the line; the others say where they were
    assert "inside torch.distributed.all_reduce called from" in summary and line_of("# the extra all_reduce") in summary, summary
    assert "The process group aborted because the ranks ran different collectives" in summary, summary


@pytest.mark.timeout(300)
def test_an_extra_collective_of_the_gradients_shape_is_named_by_its_line(tmp_path):
    # rank 0's extra all_reduce pairs silently with the others' gradient all-reduce of the same shape; rank 0 dies
    # in gloo (SIGABRT) a collective or so later, inside its own gradient all-reduce, with its collectives written
    code, out, summary, took = faulty_run(tmp_path, "extra_same_shape", FAULT_RANK=0)
    assert code == 134 and took < 90, out
    site = line_of("# the extra all_reduce of the gradients' shape")
    assert "The first error, on rank 0 at stage 'main', epoch 1, batch " in summary, summary
    assert "aborted in C++ (std::terminate)" in summary and "died without recording" not in summary, summary
    assert "First collective the ranks called from different lines (group 'default_pg', #" in summary, summary
    assert "rank 0 in all_reduce(Float[2]) " in summary and f"(most likely rank 0's, called from " in summary, summary
    assert summary.count(site) >= 2 and "recorded collectives agree" not in summary, summary
    diagnose = script_server.run([sys.executable, "-m", "torchstage", "diagnose", str(tmp_path)], env=dict(os.environ),
                                 cwd=ROOT, timeout=60)
    assert diagnose.returncode == 1, diagnose.stdout + diagnose.stderr
    assert "collective records of 4 ranks" in diagnose.stdout and "called from different lines" in diagnose.stdout
    assert site in diagnose.stdout.split("called from different lines")[1], diagnose.stdout


@pytest.mark.timeout(300)
def test_diagnose_after_a_restart_that_finished_reports_no_failure(tmp_path):
    result = run([FAULTS, tmp_path], nproc=4, timeout=240, FAULT="extra_same_shape", FAULT_RANK=0,
                 TORCHSTAGE_MAX_RESTARTS=1)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "rank 0 finished" in out and "the run finished on attempt 2 of 2" in out, out
    diagnose = script_server.run([sys.executable, "-m", "torchstage", "diagnose", str(tmp_path)], env=dict(os.environ),
                                 cwd=ROOT, timeout=60)
    assert diagnose.returncode == 0, diagnose.stdout + diagnose.stderr
    assert "collective records of 4 ranks" in diagnose.stdout and "called from different lines" in diagnose.stdout
    assert ("The run finished afterwards (attempt 1): these records describe a failure that a restart recovered "
            "from.") in diagnose.stdout, diagnose.stdout


@pytest.mark.timeout(300)
def test_a_shape_mismatch_names_the_collective_each_rank_was_in(tmp_path):
    code, out, summary, took = faulty_run(tmp_path, "shape_mismatch")
    assert code == 124 and took < 90, out
    site = line_of("# the mismatched all_reduce")
    assert "First collective where the ranks differ (group 'default_pg', #" in summary, summary
    assert "ranks 0, 2, 3 in all_reduce(Float[1]) " in summary and "rank 1 in all_reduce(Float[3]) " in summary, summary
    assert summary.count(site) >= 2, summary


@pytest.mark.timeout(300)
def test_a_stalled_data_loader_is_named_and_diagnose_shows_who_is_behind(tmp_path):
    code, out, summary, took = faulty_run(tmp_path, "stalled_loader")
    assert code == 124 and took < 90, out
    assert ("The first error, on rank 1 at stage 'main', epoch 1, batch 3 of loader 'train' (global batch 3): hang: "
            "no progress for 15 s") in summary, summary
    assert "stopped in " in summary and f"{line_of('time.sleep(3600)')} in __getitem__" in summary, summary
    assert "which rank 1 never reached" in summary, summary
    diagnose = script_server.run([sys.executable, "-m", "torchstage", "diagnose", str(tmp_path)], env=dict(os.environ),
                                 cwd=ROOT, timeout=60)
    assert diagnose.returncode == 1, diagnose.stdout + diagnose.stderr
    assert "collective records of 4 ranks" in diagnose.stdout
    assert ("ranks 0, 2, 3 entered all_reduce(" in diagnose.stdout and "which rank 1 never reached; rank 1 last ran"
            in diagnose.stdout), diagnose.stdout


@pytest.mark.timeout(300)
def test_a_killed_rank_ends_all_within_30_s_naming_it(tmp_path):
    code, out, summary, took = faulty_run(tmp_path, "sigkill")
    assert code == 137 and took < 30, out
    assert "rank 1 was killed by signal 9; stopped the other ranks." in summary, summary
    assert "Rank 1 died without recording its collectives." in summary, summary


@pytest.mark.timeout(300)
def test_ranks_stuck_among_themselves_when_one_is_killed_record_where_they_wait_when_the_launcher_asks(tmp_path):
    # the survivors wait in a recv from one another, which rank 1's death never ends: no error of theirs would
    # ever record them; the launcher asks, their hang watchdogs answer with their collectives and their place
    code, out, summary, took = faulty_run(tmp_path, "sigkill_peers_wait")
    assert code == 137 and took < 30, out
    assert "rank 1 was killed by signal 9; stopped the other ranks." in summary, summary
    assert ("Ranks 0, 2, 3 had no error of their own; asked by the launcher, they were at stage 'main', epoch 1, "
            "loader 'train', batch 3 (after batch end); waiting in torch.distributed.recv called from ") in summary, summary
    assert f"{line_of('# the recv of the survivors')} in on_batch_end" in summary, summary
    records = {rank: json.loads((tmp_path / "flight-recorder" / f"rank-{rank}.json").read_text()) for rank in (0, 2, 3)}
    assert not (tmp_path / "flight-recorder" / "rank-1.json").exists()
    for rank, record in records.items():
        assert record["attempt"] == 0 and record["entries"], record
    diagnose = script_server.run([sys.executable, "-m", "torchstage", "diagnose", str(tmp_path)], env=dict(os.environ),
                                 cwd=ROOT, timeout=60)
    assert "collective records of 3 ranks" in diagnose.stdout, diagnose.stdout + diagnose.stderr


@pytest.mark.timeout(300)
def test_a_rank_that_exits_0_mid_epoch_is_named_with_its_line(tmp_path):
    code, out, summary, took = faulty_run(tmp_path, "exit0")
    assert code != 0 and took < 90, out
    assert ("The first error, on rank 1 at stage 'main', epoch 1, batch 3 of loader 'train' (global batch 3): left "
            f"the run: SystemExit(0) raised at ") in summary, summary
    assert f"{line_of('# the rank leaves')} in on_batch_end" in summary, summary
    assert "Rank 1 had exited with code 0" in summary, summary
