"""``torchstage diagnose``: one line and exit 2 for a missing logdir or a file that is not a record, never a
traceback; with records of several attempts, the last one's, and a run that finished after them is no failure; the
straggler episodes of a run."""
import json
import os
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, straggler_logdir
from torchstage.launch.flight_recorder import mark_finished, write_dump


def entry(seq, size=10, site="train.py:5 in step"):
    return {"group": "default_pg", "seq": seq, "p2p": False, "op": "all_reduce", "sizes": [[size]], "dtypes": ["Float"],
            "site": site}


def diagnose(logdir):
    result = script_server.run([sys.executable, "-m", "torchstage", "diagnose", str(logdir)], env=dict(os.environ),
                               cwd=ROOT, timeout=60)
    return result.returncode, result.stdout, result.stderr


def test_a_missing_logdir_is_named_as_such(tmp_path):
    code, out, err = diagnose(tmp_path / "nowhere")
    assert code == 2 and out == ""
    assert err == f"torchstage diagnose: error: no such logdir: {tmp_path / 'nowhere'}\n"


@pytest.mark.parametrize("content", [
    "[" * 100_000 + "]" * 100_000,  # deeply nested: json's RecursionError
    json.dumps({"rank": 0, "entries": [1, 2]}),  # entries that are not collectives
    json.dumps({"rank": 0, "entries": [{**entry(1), "sizes": "ten"}]}),
    json.dumps({"rank": "zero", "entries": []}),
    json.dumps({"rank": 0, "entries": {"seq": 1}}),
    json.dumps([1, 2, 3]),
    "{not json",
], ids=["nested", "ints", "sizes", "rank", "entries", "list", "syntax"])
def test_a_file_that_is_not_a_record_gets_one_line_naming_it_and_exit_2(tmp_path, content):
    write_dump(tmp_path, 0, [entry(1)])
    bad = tmp_path / "flight-recorder" / "rank-1.json"
    bad.write_text(content)
    code, out, err = diagnose(tmp_path)
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert err.startswith(f"torchstage diagnose: error: {bad} is not a record of collectives (") and \
        err.count("\n") == 1, err


def test_the_last_attempts_records_are_shown_and_the_others_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSTAGE_RESTART_COUNT", "0")
    write_dump(tmp_path, 0, [entry(1), entry(2, size=3)])  # attempt 0: the ranks differ
    write_dump(tmp_path, 1, [entry(1), entry(2)])
    code, out, _ = diagnose(tmp_path)
    assert code == 1 and "First collective where the ranks differ (group 'default_pg', #2)" in out, out
    monkeypatch.setenv("TORCHSTAGE_RESTART_COUNT", "1")
    write_dump(tmp_path, 1, [entry(1), entry(2), entry(3)])  # attempt 1: only rank 1 left a record
    code, out, _ = diagnose(tmp_path)
    assert code == 0, out
    assert out.splitlines()[0].endswith("flight-recorder, attempt 1 (attempt 0 left records too, not shown)"), out
    assert "collective records of 1 rank " in out and "rank 0:" not in out, out


def test_a_run_that_finished_after_a_failed_attempt_is_not_reported_as_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSTAGE_RESTART_COUNT", "0")
    write_dump(tmp_path, 0, [entry(1), entry(2, size=3)])
    write_dump(tmp_path, 1, [entry(1), entry(2)])
    monkeypatch.setenv("TORCHSTAGE_RESTART_COUNT", "1")
    mark_finished(tmp_path)  # the restarted attempt finished
    code, out, _ = diagnose(tmp_path)
    assert code == 0, out
    assert "First collective where the ranks differ" in out, out  # what the failed attempt's records show
    assert out.rstrip().endswith("The run finished afterwards (attempt 1): these records describe a failure that a "
                                 "restart recovered from."), out
    mark_finished(tmp_path / "no-records")  # a run without records gets no folder
    assert not (tmp_path / "no-records").exists()


def test_diagnose_lists_the_episodes_of_a_run_without_a_failure(tmp_path):
    run = straggler_logdir(tmp_path / "slow")
    result = script_server.run([sys.executable, "-m", "torchstage", "diagnose", run], env=dict(os.environ), cwd=ROOT,
                               timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"straggler episodes in {tmp_path / 'slow' / 'logs' / 'stragglers.jsonl'}: 1"
    assert lines[1].startswith("  rank 2 (host node2, local rank 0) slow in compute from ")
    assert lines[1].endswith("(epoch 4, global batch 300), recovered: 30.0 ms per batch against a median of 10.0 ms "
                             "when named, at worst 62% of the job's time; about 4.0 s of it lost over 26.0 s")
    assert lines[2] == f"no collective records in {tmp_path / 'slow' / 'flight-recorder'} (written when a run of " \
                       f"several processes fails or hangs)"
    (tmp_path / "slow" / "logs" / "stragglers.jsonl").unlink()
    result = script_server.run([sys.executable, "-m", "torchstage", "diagnose", run], env=dict(os.environ), cwd=ROOT,
                               timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("no straggler was named in this run")
